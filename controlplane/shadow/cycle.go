package shadow

import (
	"context"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// cycle is one round: read the cluster, bring every gang's actual outcome up to date, decide
// on the gangs tessera has not placed yet as if they were pending, and write the reports that
// changed.
func (s *Shadow) cycle(ctx context.Context) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	now := s.clock.Now()
	f := s.factory
	nodes, _ := f.Core().V1().Nodes().Lister().List(labels.Everything())
	pods, _ := f.Core().V1().Pods().Lister().List(labels.Everything())
	slices, _ := s.slices.ListPatchedResourceSlices()
	claims, _ := f.Resource().V1().ResourceClaims().Lister().List(labels.Everything())
	classes, _ := f.Resource().V1().DeviceClasses().Lister().List(labels.Everything())
	var queues []*v1alpha1.Queue
	for _, obj := range s.queueInf.GetStore().List() {
		queues = append(queues, obj.(*v1alpha1.Queue))
	}
	s.mu.Lock()
	capGen := s.capacityGen
	w := &world{now: now, claims: map[string]*resourceapi.ResourceClaim{}, seen: copyTimes(s.seen), bound: copyTimes(s.bound), deadlockAfter: s.opts.DeadlockAfter}
	s.mu.Unlock()
	drivers := map[string]bool{}
	for _, d := range s.gpuDrivers() {
		drivers[d] = true
	}
	w.costs = newCosts(slices, drivers)
	for _, c := range claims {
		w.claims[c.Namespace+"/"+c.Name] = c
	}

	// The actual side.
	s.sweep(pods, claims)
	gangs := s.collectGangs(ctx, pods)
	for _, g := range gangs {
		g.group = s.podGroup(g)
	}
	var newlyBound []*record
	for key, g := range gangs {
		rec := s.records[key]
		if rec == nil {
			if !s.opts.AllGangs && !g.isAIGang() {
				continue
			}
			if g.live() == 0 {
				continue // seen only finished: nothing to compare
			}
			rec = newRecord(s.opts.Namespace, g)
			s.records[key] = rec
		}
		if rec.report.Gang.EndedTime != nil {
			if g.live() == 0 {
				continue
			}
			// Pods of the same gang again (a Job restarted): a new round.
			old := rec
			rec = newRecord(s.opts.Namespace, g)
			rec.written = old.written
			s.records[key] = rec
		}
		fullyBefore := rec.report.Actual.FullyBoundTime != nil
		rec.observeGang(w, g)
		if !fullyBefore && rec.report.Actual.FullyBoundTime != nil {
			newlyBound = append(newlyBound, rec)
		}
		if g.live() == 0 {
			s.end(rec, now)
		}
	}
	for key, rec := range s.records {
		if gangs[key] == nil && rec.report.Gang.EndedTime == nil {
			s.end(rec, now)
		}
	}
	if len(newlyBound) > 0 {
		frag := percent(fragmentation(actualNodeUnits(slices, claims)))
		for _, rec := range newlyBound {
			rec.report.Actual.FragmentationPercent = frag
		}
	}
	s.checkQuota(w, queues, gangs)

	// The decision side: every recorded gang that tessera has not placed, as pending.
	open := map[string]*observed{}
	for key, rec := range s.records {
		if g := gangs[key]; g != nil && rec.report.Gang.EndedTime == nil && rec.report.Tessera.Decision != shadowv1.DecisionPlaced {
			open[key] = g
		}
	}
	if len(open) > 0 {
		s.decide(ctx, now, capGen, nodes, pods, slices, claims, classes, queues, gangs, open)
	}
	s.persist(ctx, now)
	s.publish(now)
	s.cycles.Add(1)
	logger.V(3).Info("Shadow cycle done", "gangs", len(gangs), "open", len(open), "duration", time.Since(start))
}

func (s *Shadow) gpuDrivers() []string {
	if len(s.opts.GPUDrivers) == 0 {
		return []string{snapshot.DefaultGPUDriver}
	}
	return s.opts.GPUDrivers
}

func copyTimes(m map[types.UID]time.Time) map[types.UID]time.Time {
	out := make(map[types.UID]time.Time, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// end marks the gang's report final: its last cycle count goes in if tessera never placed it.
func (s *Shadow) end(rec *record, now time.Time) {
	rep := &rec.report
	rep.Gang.EndedTime = micro(now)
	if rep.Actual.PartialStartTime != nil && rep.Actual.PartialEndTime == nil {
		rep.Actual.PartialEndTime = micro(now)
	}
	if rep.Tessera.Decision != shadowv1.DecisionPlaced {
		rep.Tessera.Cycles = rec.cycles
	}
}

// collectGangs maps every pod of a watched scheduler to its gang (once per pod UID).
func (s *Shadow) collectGangs(ctx context.Context, pods []*v1.Pod) map[string]*observed {
	logger := klog.FromContext(ctx)
	gangs := map[string]*observed{}
	live := map[types.UID]bool{}
	for _, p := range pods {
		live[p.UID] = true
		if !s.watched[p.Spec.SchedulerName] {
			continue
		}
		m, ok := s.mappings[p.UID]
		if !ok {
			m = s.mapper.Map(ctx, p)
			if m.Retry {
				logger.V(3).Info("Workload of pod not resolvable yet", "pod", klog.KObj(p), "reason", m.Message)
				continue
			}
			s.mappings[p.UID] = m
		}
		key := p.Namespace + "/" + m.Group
		g := gangs[key]
		if g == nil {
			g = &observed{namespace: p.Namespace, mapping: m, schedulerName: p.Spec.SchedulerName}
			gangs[key] = g
		}
		switch {
		case p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed:
			g.ended++
		case p.DeletionTimestamp != nil:
			if p.Spec.NodeName != "" {
				g.terminating = append(g.terminating, p)
			}
		case p.Spec.NodeName == "":
			g.pending = append(g.pending, p)
		default:
			g.bound = append(g.bound, p)
		}
	}
	for uid := range s.mappings {
		if !live[uid] {
			delete(s.mappings, uid)
		}
	}
	return gangs
}

// sweep forgets the times of pods and claims that are gone.
func (s *Shadow) sweep(pods []*v1.Pod, claims []*resourceapi.ResourceClaim) {
	live := make(map[types.UID]bool, len(pods)+len(claims))
	for _, p := range pods {
		live[p.UID] = true
	}
	for _, c := range claims {
		live[c.UID] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid := range s.seen {
		if !live[uid] {
			delete(s.seen, uid)
		}
	}
	for uid := range s.bound {
		if !live[uid] {
			delete(s.bound, uid)
		}
	}
}

// checkQuota replays the actual bindings through tessera's quota check, in the order the
// gangs were first bound: a gang whose bound pods took its queue (or an ancestor) beyond a
// limit is a violation the scheduler in use allowed. Once found, it stays in the report.
func (s *Shadow) checkQuota(w *world, queues []*v1alpha1.Queue, gangs map[string]*observed) {
	if len(queues) == 0 {
		return
	}
	tree := quota.Build(queues)
	type charged struct {
		rec   *record
		g     *observed
		first time.Time
	}
	var list []charged
	for key, g := range gangs {
		rec := s.records[key]
		if rec == nil || len(g.bound) == 0 || rec.report.Gang.Queue == "" || rec.report.Actual.FirstBoundTime == nil {
			continue
		}
		list = append(list, charged{rec, g, rec.report.Actual.FirstBoundTime.Time})
	}
	sort.Slice(list, func(i, j int) bool {
		if !list[i].first.Equal(list[j].first) {
			return list[i].first.Before(list[j].first)
		}
		return list[i].rec.key() < list[j].rec.key()
	})
	for _, c := range list {
		u := quota.Usage{}
		counted := map[types.UID]bool{}
		for _, p := range append(append([]*v1.Pod(nil), c.g.bound...), c.g.terminating...) {
			req := snapshot.PodRequests(p)
			u[v1alpha1.ResourceCPU] += req.Cpu().AsApproximateFloat64()
			u[v1alpha1.ResourceMemory] += req.Memory().AsApproximateFloat64()
			claims, _ := w.podClaims(p)
			if ec := w.extendedClaim(p); ec != nil {
				claims = append(claims, ec)
			}
			for _, cl := range claims {
				if !counted[cl.UID] && cl.Status.Allocation != nil {
					counted[cl.UID] = true
					u[v1alpha1.ResourceGPU] += w.costs.allocation(cl.Status.Allocation)
				}
			}
		}
		q := c.rec.report.Gang.Queue
		if ok, why := tree.Admit(q, u); !ok && c.rec.report.Actual.QuotaViolation == "" && tree.Get(q) != nil {
			c.rec.report.Actual.QuotaViolation = why
			quotaViolations.WithLabelValues(q).Inc()
		}
		tree.Charge(q, u)
	}
}

// decide runs tessera's decision function on the cluster as it would be had tessera not yet
// placed the open gangs: their pods unbound, the claims only they hold unallocated, their
// DRA extended-resource claims (the other scheduler's) gone.
func (s *Shadow) decide(ctx context.Context, now time.Time, capGen uint64, nodes []*v1.Node, pods []*v1.Pod, slices []*resourceapi.ResourceSlice,
	claims []*resourceapi.ResourceClaim, classes []*resourceapi.DeviceClass, queues []*v1alpha1.Queue, gangs map[string]*observed, open map[string]*observed) {
	openPods := map[types.UID]bool{}
	for _, g := range open {
		for _, p := range g.pending {
			openPods[p.UID] = true
		}
		for _, p := range g.bound {
			openPods[p.UID] = true
		}
	}
	cfPods := make([]*v1.Pod, 0, len(pods))
	unbound := map[types.UID]*v1.Pod{}
	for _, p := range pods {
		if !openPods[p.UID] {
			cfPods = append(cfPods, p)
			continue
		}
		cp := p.DeepCopy()
		cp.Spec.NodeName = ""
		cp.Status.Phase = v1.PodPending
		cp.Status.Conditions = nil
		cp.Status.ExtendedResourceClaimStatus = nil
		cp.Status.NominatedNodeName = ""
		cfPods = append(cfPods, cp)
		unbound[p.UID] = cp
	}
	cfClaims := make([]*resourceapi.ResourceClaim, 0, len(claims))
	for _, c := range claims {
		if c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] == "true" && ownedByAny(c, openPods) {
			continue
		}
		if c.Status.Allocation != nil && len(c.Status.ReservedFor) > 0 && reservedOnlyFor(c, openPods) {
			cp := c.DeepCopy()
			cp.Status.Allocation, cp.Status.ReservedFor, cp.Status.Devices = nil, nil, nil
			c = cp
		}
		cfClaims = append(cfClaims, c)
	}
	features := featuresOf(slices, claims)
	snapCfg := snapshot.Config{Features: features, GPUDrivers: s.opts.GPUDrivers, CELCache: s.features.get(features), PodInfos: s.podInfos}
	raw := snapshot.Input{Nodes: nodes, Pods: cfPods, Slices: slices, Claims: cfClaims, Classes: classes}
	snap := snapshot.New(raw, snapCfg)

	var in []*decide.Gang
	for key, g := range gangs {
		rec := s.records[key]
		if rec == nil {
			continue
		}
		dg := &decide.Gang{Key: key, Desired: g.mapping.Desired, MappedReason: g.mapping.Reason, MappedMessage: g.mapping.Message, Workload: g.mapping.Workload}
		dg.PodGroup = g.group
		dg.Upstream = s.upstreamOf(g)
		if open[key] != nil {
			for _, p := range append(append([]*v1.Pod(nil), g.pending...), g.bound...) {
				dg.Pending = append(dg.Pending, unbound[p.UID])
			}
			sort.Slice(dg.Pending, func(i, j int) bool { return dg.Pending[i].Name < dg.Pending[j].Name })
		} else {
			// Decided (or ended): its bound pods count for its queue; it is not placed again.
			dg.Bound = g.bound
		}
		dg.Terminating = g.terminating
		in = append(in, dg)
	}
	sort.Slice(in, func(i, j int) bool { return in[i].Key < in[j].Key })
	cfg := decide.Config{Solver: s.solver, Snapshot: snapCfg, StarvationTimeout: s.opts.StarvationTimeout, FormationTimeout: s.opts.FormationTimeout,
		UsageWeight: s.opts.UsageWeight, UsageHalfLife: s.opts.UsageHalfLife, MaxConsolidationMoves: s.opts.MaxConsolidationMoves}
	start := time.Now()
	var topologies []*v1alpha1.Topology
	for _, obj := range s.topoInf.GetStore().List() {
		topologies = append(topologies, obj.(*v1alpha1.Topology))
	}
	var priorityClasses []*schedulingv1.PriorityClass
	for _, obj := range s.pcInf.GetStore().List() {
		priorityClasses = append(priorityClasses, obj.(*schedulingv1.PriorityClass))
	}
	d := decide.Decide(ctx, cfg, decide.Input{Now: now, Snapshot: snap, Raw: raw, Queues: queues, Gangs: in, CapacityGen: capGen,
		Topologies: topologies, PriorityClasses: decide.PriorityClassesByName(priorityClasses)}, s.memory)
	decideLatency.Observe(time.Since(start).Seconds())
	if ctx.Err() != nil {
		return
	}
	placed := map[string]*decide.Placement{}
	for _, p := range d.Placements {
		placed[p.Key] = p
		// Nothing is committed: the commit "succeeds" at once, as far as backoffs go.
		s.memory.Committed(p.Key)
	}
	reclaimFor, victims := "", []string{}
	for _, e := range d.Events {
		pg, ok := e.Object.(*v1alpha1.PodGroup)
		if !ok || pg == nil {
			continue
		}
		switch e.Reason {
		case decide.ReasonReclaiming, decide.ReasonPreempting:
			reclaimFor = pg.Namespace + "/" + pg.Name
		case decide.ReasonReclaimed, decide.ReasonPreempted:
			victims = append(victims, pg.Namespace+"/"+pg.Name)
		}
	}
	sort.Strings(victims)
	frag := percent(fragmentation(snapshotNodeUnits(snap)))
	for key := range open {
		rec := s.records[key]
		t := &rec.report.Tessera
		if rec.report.Gang.ReadyTime != nil {
			rec.cycles++
		}
		if p := placed[key]; p != nil {
			t.Decision, t.Reason, t.Message = shadowv1.DecisionPlaced, v1alpha1.ReasonScheduled, d.Outcomes[key].Message
			t.DecidedTime, t.Cycles = micro(now), rec.cycles
			t.GPUUnits = units3(p.Result.GPUUnits)
			t.FragmentationPercent = frag
			nodes := map[string]bool{}
			t.Pods = nil
			for _, pl := range p.Result.Placements {
				nodes[pl.Node] = true
				set := map[string]bool{}
				for _, ca := range pl.Allocate {
					for _, r := range ca.Allocation.Devices.Results {
						set[r.Driver+"/"+r.Pool+"/"+r.Device] = true
					}
				}
				for _, c := range pl.Reserve {
					if c.Status.Allocation != nil {
						for _, r := range c.Status.Allocation.Devices.Results {
							set[r.Driver+"/"+r.Pool+"/"+r.Device] = true
						}
					}
				}
				if pl.Extended != nil && pl.Extended.Allocation != nil {
					for _, r := range pl.Extended.Allocation.Devices.Results {
						set[r.Driver+"/"+r.Pool+"/"+r.Device] = true
					}
				}
				t.Pods = append(t.Pods, shadowv1.PodPlacement{Name: pl.Pod.Name, Node: pl.Node, Devices: sortedKeys(set)})
			}
			sort.Slice(t.Pods, func(i, j int) bool { return t.Pods[i].Name < t.Pods[j].Name })
			t.Nodes = sortedKeys(nodes)
			if rec.report.Gang.ReadyTime != nil {
				cyclesNeeded.Observe(float64(rec.cycles))
			}
			continue
		}
		o := d.Outcomes[key]
		t.Decision, t.Reason, t.Message = shadowv1.DecisionWaiting, o.Reason, o.Message
		if key == reclaimFor {
			t.Reclaim = victims
		}
	}
}

// podGroup is the gang's PodGroup as tessera would have it: the one that exists (tessera's own
// pods, hand-made groups), else the mapper's, created when the gang's first pod was.
func (s *Shadow) podGroup(g *observed) *v1alpha1.PodGroup {
	if obj, ok, _ := s.pgInf.GetStore().GetByKey(g.key()); ok {
		pg := obj.(*v1alpha1.PodGroup)
		if g.mapping.Desired == nil || pg.Labels[mapper.ManagedByLabel] != "" {
			return pg
		}
	}
	if g.mapping.Desired == nil {
		return nil
	}
	pg := g.mapping.Desired.DeepCopy()
	oldest := time.Time{}
	for _, list := range [][]*v1.Pod{g.pending, g.bound} {
		for _, p := range list {
			if c := p.CreationTimestamp.Time; oldest.IsZero() || c.Before(oldest) {
				oldest = c
			}
		}
	}
	pg.CreationTimestamp = metav1.NewTime(oldest)
	pg.UID = types.UID("shadow-" + g.key())
	return pg
}

func (s *Shadow) upstreamOf(g *observed) *schedulingv1beta1.PodGroup {
	if g.mapping.Upstream == "" || s.upstream == nil {
		return nil
	}
	if obj, ok, _ := s.upstream.GetStore().GetByKey(g.namespace + "/" + g.mapping.Upstream); ok {
		return obj.(*schedulingv1beta1.PodGroup)
	}
	return nil
}

func ownedByAny(c *resourceapi.ResourceClaim, uids map[types.UID]bool) bool {
	for _, o := range c.OwnerReferences {
		if uids[o.UID] {
			return true
		}
	}
	return false
}

func reservedOnlyFor(c *resourceapi.ResourceClaim, uids map[types.UID]bool) bool {
	for _, r := range c.Status.ReservedFor {
		if !uids[r.UID] {
			return false
		}
	}
	return true
}
