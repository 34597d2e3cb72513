package decide

import (
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// The annotations other schedulers' users already write on their workloads (and so on the
// pods), read so that their manifests work unchanged.
const (
	// KAI Scheduler: the Topology to use and the node label keys of the required and the
	// preferred level.
	kaiTopology          = "kai.scheduler/topology"
	kaiRequiredPlacement = "kai.scheduler/topology-required-placement"
	kaiPreferredPlacment = "kai.scheduler/topology-preferred-placement"
	// Kueue's topology-aware scheduling, on the pod template: the node label of the level
	// the pod set must (or should) stay within.
	kueueRequiredTopology  = "kueue.x-k8s.io/podset-required-topology"
	kueuePreferredTopology = "kueue.x-k8s.io/podset-preferred-topology"
)

// gangTopology is the gang's topology constraint for the solver, from (first found wins per
// field) the PodGroup's spec.topology, the upstream PodGroup's schedulingConstraints, and the
// KAI and Kueue annotations on the PodGroup or the gang's pods. The levels are those of the
// named Topology (or of the only one), else the solver's --topology-keys. Nil: no constraint
// (the solver then prefers its most specific configured key).
func gangTopology(in Input, g *gangState) *solver.Topology {
	t := &solver.Topology{}
	topoName := ""
	if pt := g.pg.Spec.Topology; pt != nil {
		if pt.Required != "" {
			t.RequiredKeys = []string{pt.Required}
		}
		t.PreferredKey, topoName = pt.Preferred, pt.Topology
		// The one-key form (key and mode) where the level form is not used.
		switch {
		case pt.Key == "":
		case pt.Mode == v1alpha1.TopologyRequired && len(t.RequiredKeys) == 0:
			t.RequiredKeys = []string{pt.Key}
		case pt.Mode != v1alpha1.TopologyRequired && t.PreferredKey == "":
			t.PreferredKey = pt.Key
		}
	}
	if up := g.Upstream; up != nil && up.Spec.SchedulingConstraints != nil && len(t.RequiredKeys) == 0 {
		for _, c := range up.Spec.SchedulingConstraints.Topology {
			t.RequiredKeys = append(t.RequiredKeys, c.Key)
		}
	}
	annotations := []map[string]string{g.pg.Annotations}
	if len(g.Pending) > 0 {
		annotations = append(annotations, g.Pending[0].Annotations)
	}
	for _, a := range annotations {
		if len(t.RequiredKeys) == 0 {
			for _, k := range []string{kaiRequiredPlacement, kueueRequiredTopology} {
				if v := a[k]; v != "" && len(t.RequiredKeys) == 0 {
					t.RequiredKeys = []string{v}
				}
			}
		}
		if t.PreferredKey == "" {
			for _, k := range []string{kaiPreferredPlacment, kueuePreferredTopology} {
				if v := a[k]; v != "" && t.PreferredKey == "" {
					t.PreferredKey = v
				}
			}
		}
		if topoName == "" {
			topoName = a[kaiTopology]
		}
	}
	if len(t.RequiredKeys) == 0 && t.PreferredKey == "" {
		return nil
	}
	var topo *v1alpha1.Topology
	for _, o := range in.Topologies {
		if o.Name == topoName || (topoName == "" && len(in.Topologies) == 1) {
			topo = o
		}
	}
	if topo != nil {
		for _, l := range topo.Spec.Levels {
			t.Levels = append(t.Levels, l.NodeLabel)
		}
	}
	return t
}
