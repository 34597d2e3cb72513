package decide

import (
	"context"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// ReasonConsolidating is the Event reason on a gang for which pods are moved to free whole
// nodes; ReasonMoved the one on the gangs whose pods are moved.
const (
	ReasonConsolidating = "Consolidating"
	ReasonMoved         = "Moved"
)

// movable pods may be moved to make room: bound pods of preemptible gangs that a controller
// recreates (an owner reference with controller set), and only where the gang keeps its
// minMember without them — the pods above minMember of an elastic gang, or any pod of a gang
// of one — and whose upstream PodGroup does not say disruptionMode all.
func movable(in Input, gangs []*gangState, g *gangState) map[string][]*v1.Pod {
	byNode := map[string][]*v1.Pod{}
	for _, b := range gangs {
		if b == g || b.pg == nil || len(b.Bound) == 0 || !preemptible(in, b) || disruptedTogether(b) {
			continue
		}
		extra, core := split(b)
		pods := extra
		if b.pg.Spec.MinMember <= 1 {
			pods = append(append([]*v1.Pod(nil), extra...), core...)
		}
		for _, p := range pods {
			if metav1.GetControllerOf(p) != nil {
				byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
			}
		}
	}
	return byNode
}

// consolidate makes room for a gang that does not fit only because the free GPUs are
// scattered: it frees whole nodes by moving the fewest movable pods (nodes with the fewest of
// them first), at most cfg.MaxConsolidationMoves pods, and only once a simulation shows that
// the gang then fits and every moved pod fits again elsewhere. The freed nodes are reserved
// for the gang (other gangs avoid them; reserve.go) until it is placed or the reservation
// expires.
func consolidate(ctx context.Context, cfg Config, in Input, d *Decisions, mem *Memory, gangs []*gangState, g *gangState) bool {
	logger := klog.FromContext(ctx)
	free, need := 0.0, 0.0
	for _, ni := range in.Snapshot.Nodes {
		free += ni.GPUFree()
	}
	for _, p := range g.gang.Pods {
		for _, c := range p.Claims {
			if c.Status.Allocation == nil {
				for _, r := range c.Spec.Devices.Requests {
					if r.Exactly != nil {
						need += float64(r.Exactly.Count)
					}
				}
			}
		}
	}
	if need == 0 || free < need {
		return false // not a matter of scattering
	}
	byNode := movable(in, gangs, g)
	type cand struct {
		node string
		pods []*v1.Pod
	}
	var cands []cand
	for _, ni := range in.Snapshot.Nodes {
		pods := byNode[ni.Name()]
		if len(pods) == 0 {
			continue
		}
		held := 0.0
		counted := map[types.UID]bool{}
		for _, p := range pods {
			held += podGPUUnits(in.Snapshot, p, counted)
		}
		if ni.GPUFree()+held < ni.GPUTotal-1e-9 {
			continue // other pods stay on it: moving these would not free the node
		}
		cands = append(cands, cand{node: ni.Name(), pods: pods})
	}
	sort.SliceStable(cands, func(i, j int) bool {
		if len(cands[i].pods) != len(cands[j].pods) {
			return len(cands[i].pods) < len(cands[j].pods)
		}
		return cands[i].node < cands[j].node
	})
	gangOf := map[types.UID]*gangState{}
	for _, b := range gangs {
		for _, p := range b.Bound {
			gangOf[p.UID] = b
		}
	}
	evict := map[types.UID]bool{}
	var moved []*v1.Pod
	var nodes []string
	for _, c := range cands {
		if len(moved)+len(c.pods) > cfg.MaxConsolidationMoves || d.VictimSetsSimulated >= cfg.MaxReclaimTries {
			break
		}
		nodes = append(nodes, c.node)
		moved = append(moved, c.pods...)
		for _, p := range c.pods {
			evict[p.UID] = true
		}
		sim := simulate(in, d, RuleConsolidation, evict)
		res, err := cfg.Solver.Solve(ctx, sim, g.gang)
		if err != nil {
			continue
		}
		assume(sim, res)
		if !placeAgain(ctx, cfg, sim, moved, gangOf, nodes) {
			continue
		}
		sort.Strings(nodes)
		logger.Info("Consolidating: moving pods to free whole nodes", "podGroup", g.Key, "nodes", nodes, "pods", len(moved))
		d.Events = append(d.Events, Event{Object: g.PodGroup, Type: v1.EventTypeNormal, Reason: ReasonConsolidating,
			Message: fmt.Sprintf("the free GPUs are scattered: moving %d pods to free nodes %s, reserved for this gang", len(moved), strings.Join(nodes, ", "))})
		seen := map[*gangState]int{}
		for _, p := range moved {
			seen[gangOf[p.UID]]++
		}
		for b, n := range seen {
			d.Events = append(d.Events, Event{Object: b.PodGroup, Type: v1.EventTypeWarning, Reason: ReasonMoved,
				Message: fmt.Sprintf("%d pods evicted to free whole nodes for gang %s; their workload recreates them elsewhere", n, g.Key)})
		}
		for _, p := range moved {
			mem.evicting[p.UID] = in.Now
			d.Evictions = append(d.Evictions, p)
		}
		reserve(mem, g.Key, nodes, ReasonConsolidating, in.Now)
		return true
	}
	logger.V(2).Info("Consolidation would not make the gang fit", "podGroup", g.Key, "candidates", len(cands))
	return false
}

// placeAgain checks that every moved pod fits the simulated cluster again (after the gang),
// off the nodes freed for the gang: each as a gang of one with its claims unallocated.
func placeAgain(ctx context.Context, cfg Config, sim *snapshot.Snapshot, moved []*v1.Pod, gangOf map[types.UID]*gangState, freed []string) bool {
	avoid := map[string]bool{}
	for _, n := range freed {
		avoid[n] = true
	}
	for _, p := range moved {
		again := p.DeepCopy()
		again.Spec.NodeName = ""
		again.UID += "-moved"
		// The moved pod's own claims stand in for those of the pod its controller recreates, so
		// that they are "another pod's" (the copy has a new UID) does not matter here.
		claims, consumers, missing, _ := podClaims(sim, again, gangOf[p.UID])
		if len(missing) > 0 {
			return false
		}
		res, err := cfg.Solver.Solve(ctx, sim, &solver.Gang{Name: "moved/" + p.Name, Avoid: avoid,
			Pods: []solver.Pod{{Pod: again, Claims: claims, Consumers: consumers}}})
		if err != nil {
			return false
		}
		assume(sim, res)
	}
	return true
}

// assume takes a solver result's capacity in a snapshot.
func assume(snap *snapshot.Snapshot, res *solver.Result) {
	for _, p := range res.Placements {
		var allocs []*resourceapi.AllocationResult
		for _, ca := range p.Allocate {
			allocs = append(allocs, ca.Allocation)
		}
		if p.Extended != nil {
			allocs = append(allocs, p.Extended.Allocation)
		}
		snap.Assume(p.Node, p.Pod, allocs)
	}
}
