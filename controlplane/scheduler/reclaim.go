package scheduler

import (
	"context"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// evictionWait is how long a reclaim waits for its evicted pods before it may choose more
// victims.
const evictionWait = 2 * time.Minute

// maxReclaimTries bounds how many victim sets are simulated for one gang per cycle.
const maxReclaimTries = 8

// ReasonReclaimed is the Event reason on a gang evicted to give a queue back its quota.
const ReasonReclaimed = "Reclaimed"

// reclaim makes quota a guarantee: g is within its queue's quota but does not fit because other
// queues borrowed the capacity. Whole gangs of borrowing queues are evicted, the queue that
// borrowed most per weight and its newest gang first, but never below their own quota, and
// only when a simulation on the cluster without them shows that g then fits. The evicted pods'
// operators recreate them; they wait as borrowers. One reclaim runs at a time: while evicted
// pods terminate, no new victims are chosen.
func (s *Scheduler) reclaim(ctx context.Context, in snapshot.Input, gangs map[string]*gangState, tree *quota.Tree, g *gangState) {
	logger := klog.FromContext(ctx)
	// While pods this scheduler evicted are still there (for at most evictionWait), their
	// capacity is on its way back: choose no further victims.
	s.mu.Lock()
	if len(s.evicting) > 0 {
		live := map[types.UID]bool{}
		for _, p := range in.Pods {
			live[p.UID] = true
		}
		for uid, at := range s.evicting {
			if !live[uid] || time.Since(at) > evictionWait {
				delete(s.evicting, uid)
			}
		}
	}
	busy := len(s.evicting) > 0
	s.mu.Unlock()
	if busy {
		return
	}
	counted := map[types.UID]bool{}
	base := snapshot.New(in, snapshot.Config{Features: s.features, GPUDrivers: s.opts.GPUDrivers, CELCache: s.celCache})
	type victim struct {
		g     *gangState
		usage quota.Usage
		share float64
	}
	var victims []victim
	for _, b := range gangs {
		if b == g || b.pg == nil || len(b.bound) == 0 || b.pg.Spec.Queue == "" || b.pg.Spec.Queue == g.pg.Spec.Queue {
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
		for _, p := range b.bound {
			u.Add(s.podUsage(base, p, counted))
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
		return victims[i].g.key > victims[j].g.key
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
		for _, p := range v.g.bound {
			evict[p.UID] = true
		}
		if tries++; tries > maxReclaimTries {
			break
		}
		snap := snapshot.New(without(in, evict), snapshot.Config{Features: s.features, GPUDrivers: s.opts.GPUDrivers, CELCache: s.celCache})
		if _, err := s.solver.Solve(ctx, snap, g.gang); err != nil {
			continue
		}
		names := make([]string, 0, len(chosen))
		for _, c := range chosen {
			names = append(names, c.key)
		}
		logger.Info("Reclaiming quota: evicting borrowing gangs", "podGroup", g.key, "queue", g.pg.Spec.Queue, "victims", names)
		s.recorder.Eventf(g.pg, v1.EventTypeNormal, "Reclaiming", "queue %q is within its quota: evicting %d borrowing gangs (%s)", g.pg.Spec.Queue, len(chosen), strings.Join(names, ", "))
		for _, c := range chosen {
			s.recorder.Eventf(c.pg, v1.EventTypeWarning, ReasonReclaimed, "evicted: queue %q borrowed beyond its quota and queue %q needs its quota back for gang %s", c.pg.Spec.Queue, g.pg.Spec.Queue, g.key)
			for _, p := range c.bound {
				s.mu.Lock()
				s.evicting[p.UID] = time.Now()
				s.mu.Unlock()
				err := s.kube.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
				if err != nil && !apierrors.IsNotFound(err) {
					logger.Error(err, "Evict pod", "pod", klog.KObj(p))
				}
			}
		}
		return
	}
	logger.V(2).Info("Reclaim would not make the gang fit", "podGroup", g.key, "candidates", len(victims))
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
