package decide

import (
	"context"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// ReasonReclaimed is the Event reason on a gang evicted to give a queue back its quota;
// ReasonReclaiming the one on the gang it is evicted for.
const (
	ReasonReclaimed  = "Reclaimed"
	ReasonReclaiming = "Reclaiming"
)

// reclaim makes quota a guarantee: g is within its queue's quota but does not fit because other
// queues borrowed the capacity. Whole gangs of borrowing queues are chosen for eviction, the
// queue that borrowed most per weight and its newest gang first, but never below their own
// quota, and only when a simulation on the cluster without them shows that g then fits. One
// reclaim runs at a time: while evicted pods terminate (at most EvictionWait), no new victims
// are chosen.
func reclaim(ctx context.Context, cfg Config, in Input, d *Decisions, mem *Memory, gangs []*gangState, tree *quota.Tree, g *gangState) {
	logger := klog.FromContext(ctx)
	counted := map[types.UID]bool{}
	base := snapshot.New(in.Raw, cfg.Snapshot)
	type victim struct {
		g     *gangState
		usage quota.Usage
		share float64
	}
	var victims []victim
	for _, b := range gangs {
		if b == g || b.pg == nil || len(b.Bound) == 0 || b.pg.Spec.Queue == "" || b.pg.Spec.Queue == g.pg.Spec.Queue || !preemptible(in, b) {
			continue
		}
		n := tree.Get(b.pg.Spec.Queue)
		if n == nil {
			continue
		}
		q, w := quotaAndWeight(n.Queue)
		over := n.Allocated[v1alpha1.ResourceGPU] - q
		if over <= 0 {
			continue
		}
		u := quota.Usage{}
		for _, p := range b.Bound {
			u.Add(podUsage(base, p, counted))
		}
		share := over
		if w > 0 {
			share = over / w
		}
		victims = append(victims, victim{g: b, usage: u, share: share})
	}
	if len(victims) == 0 {
		return
	}
	sort.SliceStable(victims, func(i, j int) bool {
		if victims[i].share != victims[j].share {
			return victims[i].share > victims[j].share
		}
		ti, tj := victims[i].g.pg.CreationTimestamp, victims[j].g.pg.CreationTimestamp
		if !ti.Equal(&tj) {
			return tj.Before(&ti)
		}
		// Timestamps have a resolution of one second; names keep the order deterministic.
		return victims[i].g.Key > victims[j].g.Key
	})
	// Take victims while their queue stays at or above its quota; simulate after each.
	released := map[string]float64{} // queue → GPU units taken away so far
	evict := map[types.UID]bool{}
	var chosen []*gangState
	tries := 0
	for _, v := range victims {
		n := tree.Get(v.g.pg.Spec.Queue)
		q, _ := quotaAndWeight(n.Queue)
		if n.Allocated[v1alpha1.ResourceGPU]-released[n.Queue.Name]-v.usage[v1alpha1.ResourceGPU] < q-1e-9 {
			continue
		}
		released[n.Queue.Name] += v.usage[v1alpha1.ResourceGPU]
		chosen = append(chosen, v.g)
		for _, p := range v.g.Bound {
			evict[p.UID] = true
		}
		if tries++; tries > cfg.MaxReclaimTries {
			break
		}
		d.VictimSetsSimulated++
		snap := snapshot.New(without(in.Raw, evict), cfg.Snapshot)
		if _, err := cfg.Solver.Solve(ctx, snap, g.gang); err != nil {
			continue
		}
		names := make([]string, 0, len(chosen))
		for _, c := range chosen {
			names = append(names, c.Key)
		}
		logger.Info("Reclaiming quota: evicting borrowing gangs", "podGroup", g.Key, "queue", g.pg.Spec.Queue, "victims", names)
		d.Events = append(d.Events, Event{Object: g.PodGroup, Type: v1.EventTypeNormal, Reason: ReasonReclaiming,
			Message: fmt.Sprintf("queue %q is within its quota: evicting %d borrowing gangs (%s)", g.pg.Spec.Queue, len(chosen), strings.Join(names, ", "))})
		for _, c := range chosen {
			d.Events = append(d.Events, Event{Object: c.PodGroup, Type: v1.EventTypeWarning, Reason: ReasonReclaimed,
				Message: fmt.Sprintf("evicted: queue %q borrowed beyond its quota and queue %q needs its quota back for gang %s", c.pg.Spec.Queue, g.pg.Spec.Queue, g.Key)})
			for _, p := range c.Bound {
				mem.evicting[p.UID] = in.Now
				d.Evictions = append(d.Evictions, p)
			}
		}
		return
	}
	logger.V(2).Info("Reclaim would not make the gang fit", "podGroup", g.Key, "candidates", len(victims))
}

// without returns the input without the given pods, and with the claims only they used
// unallocated.
func without(in snapshot.Input, pods map[types.UID]bool) snapshot.Input {
	out := in
	out.Pods = make([]*v1.Pod, 0, len(in.Pods))
	for _, p := range in.Pods {
		if !pods[p.UID] {
			out.Pods = append(out.Pods, p)
		}
	}
	out.Claims = make([]*resourceapi.ResourceClaim, 0, len(in.Claims))
	for _, c := range in.Claims {
		if c.Status.Allocation != nil && len(c.Status.ReservedFor) > 0 {
			all := true
			for _, r := range c.Status.ReservedFor {
				all = all && pods[r.UID]
			}
			if all {
				c = c.DeepCopy()
				c.Status.Allocation, c.Status.ReservedFor = nil, nil
			}
		}
		out.Claims = append(out.Claims, c)
	}
	return out
}

func quotaAndWeight(q *v1alpha1.Queue) (float64, float64) {
	rq := q.Spec.Resources.GPU
	if rq == nil {
		return 0, 1
	}
	quota, weight := 0.0, 1.0
	if rq.Quota != nil {
		quota = rq.Quota.AsApproximateFloat64()
	}
	if rq.OverQuotaWeight != nil {
		weight = float64(*rq.OverQuotaWeight)
	}
	return quota, weight
}
