package decide

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// A gang's topology comes from its PodGroup, the upstream PodGroup, or the annotations KAI
// Scheduler's and Kueue's users write, with the levels of the named (or only) Topology.
func TestGangTopologySources(t *testing.T) {
	topologies := []*v1alpha1.Topology{
		{ObjectMeta: metav1.ObjectMeta{Name: "dc"}, Spec: v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{{NodeLabel: "block"}, {NodeLabel: "rack"}, {NodeLabel: v1.LabelHostname}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "flat"}, Spec: v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{{NodeLabel: "rack"}}}},
	}
	for _, tc := range []struct {
		name        string
		spec        *v1alpha1.TopologyConstraint
		annotations map[string]string // on the gang's pods
		upstream    []string
		topologies  []*v1alpha1.Topology
		want        *solver.Topology
	}{
		{name: "none", want: nil},
		{name: "one-key form required", spec: &v1alpha1.TopologyConstraint{Key: "rack", Mode: v1alpha1.TopologyRequired},
			want: &solver.Topology{RequiredKeys: []string{"rack"}}},
		{name: "one-key form preferred", spec: &v1alpha1.TopologyConstraint{Key: "rack", Mode: v1alpha1.TopologyPreferred},
			want: &solver.Topology{PreferredKey: "rack"}},
		{name: "levels with a named topology", spec: &v1alpha1.TopologyConstraint{Required: "block", Preferred: "rack", Topology: "dc"}, topologies: topologies,
			want: &solver.Topology{RequiredKeys: []string{"block"}, PreferredKey: "rack", Levels: []string{"block", "rack", v1.LabelHostname}}},
		{name: "KAI annotations", annotations: map[string]string{kaiTopology: "dc", kaiRequiredPlacement: "block", kaiPreferredPlacment: "rack"}, topologies: topologies,
			want: &solver.Topology{RequiredKeys: []string{"block"}, PreferredKey: "rack", Levels: []string{"block", "rack", v1.LabelHostname}}},
		{name: "Kueue TAS annotations", annotations: map[string]string{kueueRequiredTopology: "block", kueuePreferredTopology: "rack"},
			want: &solver.Topology{RequiredKeys: []string{"block"}, PreferredKey: "rack"}},
		{name: "only topology used without a name", annotations: map[string]string{kueuePreferredTopology: "rack"}, topologies: topologies[1:],
			want: &solver.Topology{PreferredKey: "rack", Levels: []string{"rack"}}},
		{name: "upstream PodGroup constraint", upstream: []string{"rack"},
			want: &solver.Topology{RequiredKeys: []string{"rack"}}},
		{name: "PodGroup wins over annotations", spec: &v1alpha1.TopologyConstraint{Required: "rack"}, annotations: map[string]string{kueueRequiredTopology: "block"},
			want: &solver.Topology{RequiredKeys: []string{"rack"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := &v1alpha1.PodGroup{Spec: v1alpha1.PodGroupSpec{Topology: tc.spec}}
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: tc.annotations}}
			g := &gangState{Gang: &Gang{Pending: []*v1.Pod{pod}}, pg: pg}
			if tc.upstream != nil {
				up := &schedulingv1beta1.PodGroup{Spec: schedulingv1beta1.PodGroupSpec{SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{}}}
				for _, k := range tc.upstream {
					up.Spec.SchedulingConstraints.Topology = append(up.Spec.SchedulingConstraints.Topology, schedulingv1beta1.TopologyConstraint{Key: k})
				}
				g.Upstream = up
			}
			got := gangTopology(Input{Topologies: tc.topologies}, g)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
