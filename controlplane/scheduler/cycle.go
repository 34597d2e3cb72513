package scheduler

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

type celCache = *cel.Cache

func newCELCache(f structured.Features) celCache { return snapshot.NewCELCache(f) }

// cycle is one round: collect the cluster, decide, act.
func (s *Scheduler) cycle(ctx context.Context) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	now := s.clock.Now()
	before, busy := s.changes()
	in := s.collect(ctx, now)
	s.mu.Lock()
	d := decide.Decide(s.withInputEpoch(ctx, in, before, busy), s.decideCfg, in, s.memory)
	s.mu.Unlock()
	s.afterDecide(d)
	decideLatency.Observe(time.Since(start).Seconds())
	for _, sec := range d.SolveSeconds {
		solveLatency.Observe(sec)
	}
	s.effects.apply(ctx, d)
	gangsPending.Set(float64(d.Pending))
	wallClockAborts.Add(float64(d.WallClockAborts))
	for rule, n := range d.VictimSetsByRule {
		victimSets.WithLabelValues(rule).Add(float64(n))
	}
	for _, n := range d.Queues.Nodes() {
		req := map[string]float64{}
		for r, v := range n.Allocated {
			req[r] += v
		}
		for r, v := range n.Requested {
			req[r] += v
		}
		for r, v := range n.Allocated {
			queueAllocated.WithLabelValues(n.Queue.Name, r).Set(v)
		}
		for r, v := range req {
			queueRequested.WithLabelValues(n.Queue.Name, r).Set(v)
		}
	}
	s.cycles.Add(1)
	logger.V(3).Info("Cycle done", "gangs", len(in.Gangs), "placed", len(d.Placements), "victimSetsSimulated", d.VictimSetsSimulated, "duration", time.Since(start))
}

// collect reads the informers (with the writes they have not delivered yet laid over them)
// and maps pods to gangs: the input of decide.Decide.
func (s *Scheduler) collect(ctx context.Context, now time.Time) decide.Input {
	f := s.factory
	nodes, _ := f.Core().V1().Nodes().Lister().List(labels.Everything())
	pods, _ := f.Core().V1().Pods().Lister().List(labels.Everything())
	slices, _ := s.slices.ListPatchedResourceSlices()
	claims, _ := f.Resource().V1().ResourceClaims().Lister().List(labels.Everything())
	classes, _ := f.Resource().V1().DeviceClasses().Lister().List(labels.Everything())
	pods, claims = s.assumed.overlay(pods, claims)
	raw := snapshot.Input{Nodes: nodes, Pods: pods, Slices: slices, Claims: claims, Classes: classes}
	// Derived from what changed since the last cycle (decide's what-if snapshots use New).
	snap := s.snapCache.Snapshot(raw, s.snapshotConfig())
	var queues []*v1alpha1.Queue
	for _, obj := range s.queueInf.GetStore().List() {
		queues = append(queues, s.effects.overlayQueue(obj.(*v1alpha1.Queue)))
	}
	s.mu.Lock()
	capGen := s.capacityGen
	s.mu.Unlock()
	var topologies []*v1alpha1.Topology
	for _, obj := range s.topoInf.GetStore().List() {
		topologies = append(topologies, obj.(*v1alpha1.Topology))
	}
	var priorityClasses []*schedulingv1.PriorityClass
	for _, obj := range s.pcInf.GetStore().List() {
		priorityClasses = append(priorityClasses, obj.(*schedulingv1.PriorityClass))
	}
	return decide.Input{Now: now, Snapshot: snap, Raw: raw, Queues: queues, Gangs: s.collectGangs(ctx, pods), CapacityGen: capGen,
		Topologies: topologies, PriorityClasses: decide.PriorityClassesByName(priorityClasses)}
}

// collectGangs maps every live pod of this scheduler to its gang (once per pod UID, cached)
// and finds the gang's PodGroups.
func (s *Scheduler) collectGangs(ctx context.Context, pods []*v1.Pod) []*decide.Gang {
	logger := klog.FromContext(ctx)
	gangs := map[string]*decide.Gang{}
	mappings := map[string]mapper.Mapping{}
	live := map[types.UID]bool{}
	get := func(p *v1.Pod, m mapper.Mapping) *decide.Gang {
		key := p.Namespace + "/" + m.Group
		g := gangs[key]
		if g == nil {
			g = &decide.Gang{Key: key, MappedReason: m.Reason, MappedMessage: m.Message, Workload: m.Workload, Desired: m.Desired}
			gangs[key] = g
			mappings[key] = m
		}
		return g
	}
	mapped := func(p *v1.Pod) (mapper.Mapping, bool) {
		s.mu.Lock()
		m, ok := s.mappings[p.UID]
		s.mu.Unlock()
		return m, ok
	}
	for _, p := range pods {
		if p.Spec.SchedulerName != s.opts.SchedulerName {
			continue
		}
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			// An ended pod is no member and holds nothing, but its gang's status counts it: a
			// Job whose pods complete one by one is finishing, not waiting. Only pods mapped
			// before are counted.
			m, ok := mapped(p)
			if !ok {
				continue
			}
			live[p.UID] = true
			g := get(p, m)
			if p.Status.Phase == v1.PodSucceeded {
				g.Succeeded++
			} else {
				g.Failed++
			}
			continue
		}
		if p.DeletionTimestamp != nil {
			// A terminating pod is no longer a member, but until it is gone its devices and
			// requests are held: it stays charged to its queue.
			if m, ok := mapped(p); ok && p.Spec.NodeName != "" {
				g := get(p, m)
				g.Terminating = append(g.Terminating, p)
				live[p.UID] = true
			}
			continue
		}
		live[p.UID] = true
		m, ok := mapped(p)
		if !ok {
			m = s.mapper.Map(ctx, p)
			if m.Retry {
				logger.V(3).Info("Workload of pod not resolvable yet", "pod", klog.KObj(p), "reason", m.Message)
				continue
			}
			s.mu.Lock()
			s.mappings[p.UID] = m
			s.mu.Unlock()
		}
		g := get(p, m)
		if p.Spec.NodeName == "" {
			g.Pending = append(g.Pending, p)
		} else {
			g.Bound = append(g.Bound, p)
			if p.Status.Phase == v1.PodRunning {
				g.Running++
			}
		}
	}
	s.mu.Lock()
	for uid := range s.mappings {
		if !live[uid] {
			delete(s.mappings, uid)
		}
	}
	s.mu.Unlock()
	out := make([]*decide.Gang, 0, len(gangs))
	for key, g := range gangs {
		if obj, ok, _ := s.pgInf.GetStore().GetByKey(key); ok {
			g.PodGroup = s.effects.overlayPodGroup(obj.(*v1alpha1.PodGroup))
		} else {
			g.PodGroup = s.effects.createdPodGroup(key)
		}
		if m := mappings[key]; m.Upstream != "" && s.upstream != nil {
			ns := key[:len(key)-len(m.Group)-1]
			if obj, ok, _ := s.upstream.GetStore().GetByKey(ns + "/" + m.Upstream); ok {
				g.Upstream = s.effects.overlayUpstream(obj.(*schedulingv1beta1.PodGroup))
			}
		}
		out = append(out, g)
	}
	return out
}

// assumedClaims are the claims of placements as the commit will write them.
func assumedClaims(d *decide.Placement) []*resourceapi.ResourceClaim {
	byKey := map[string]*resourceapi.ResourceClaim{}
	var order []string
	get := func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
		k := c.Namespace + "/" + c.Name
		if cur, ok := byKey[k]; ok {
			return cur
		}
		cp := c.DeepCopy()
		byKey[k] = cp
		order = append(order, k)
		return cp
	}
	for _, p := range d.Result.Placements {
		for _, ca := range p.Allocate {
			c := get(ca.Claim)
			c.Status.Allocation = ca.Allocation.DeepCopy()
			c.Status.ReservedFor = append(c.Status.ReservedFor, consumerOf(p.Pod, p.Consumers, ca.Claim))
		}
	}
	for _, p := range d.Result.Placements {
		for _, cl := range p.Reserve {
			c := get(cl)
			ref := consumerOf(p.Pod, p.Consumers, cl)
			if !hasConsumer(c, ref) {
				c.Status.ReservedFor = append(c.Status.ReservedFor, ref)
			}
		}
	}
	out := make([]*resourceapi.ResourceClaim, 0, len(order))
	for _, k := range order {
		out = append(out, byKey[k])
	}
	return out
}

// consumerOf is whom a claim of pod is reserved for: the pod, or its upstream PodGroup for a
// PodGroup claim.
func consumerOf(pod *v1.Pod, consumers map[types.UID]resourceapi.ResourceClaimConsumerReference, c *resourceapi.ResourceClaim) resourceapi.ResourceClaimConsumerReference {
	if ref, ok := consumers[c.UID]; ok {
		return ref
	}
	return resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID}
}

func hasConsumer(c *resourceapi.ResourceClaim, ref resourceapi.ResourceClaimConsumerReference) bool {
	for _, r := range c.Status.ReservedFor {
		if r.UID == ref.UID {
			return true
		}
	}
	return false
}
