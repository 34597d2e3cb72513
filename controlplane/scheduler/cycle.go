package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// gangState is one PodGroup and its pods in a cycle.
type gangState struct {
	key     string
	pg      *v1alpha1.PodGroup
	mapping mapper.Mapping
	pending []*v1.Pod
	bound   []*v1.Pod
	// terminating pods still hold their devices; they are charged, not counted as members.
	terminating []*v1.Pod
	running     int
	// succeeded and failed count the gang's ended pods (those this scheduler
	// had mapped), for the phase and status only.
	succeeded, failed int
	// Outcome of this cycle for the Scheduled condition.
	reason, message string
	queueOK         bool
	gang            *solver.Gang
	estimate        quota.Usage
}

const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// cycle places as many waiting gangs as fit, in queue order.
func (s *Scheduler) cycle(ctx context.Context) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	f := s.factory
	nodes, _ := f.Core().V1().Nodes().Lister().List(labels.Everything())
	pods, _ := f.Core().V1().Pods().Lister().List(labels.Everything())
	slices, _ := f.Resource().V1().ResourceSlices().Lister().List(labels.Everything())
	claims, _ := f.Resource().V1().ResourceClaims().Lister().List(labels.Everything())
	classes, _ := f.Resource().V1().DeviceClasses().Lister().List(labels.Everything())
	pods, claims = s.assumed.overlay(pods, claims)
	snap := snapshot.New(snapshot.Input{Nodes: nodes, Pods: pods, Slices: slices, Claims: claims, Classes: classes},
		snapshot.Config{Features: s.features, GPUDrivers: s.opts.GPUDrivers, CELCache: s.celCache})

	gangs := s.collectGangs(ctx, pods)

	// Queues: charge what bound pods hold.
	var queues []*v1alpha1.Queue
	for _, obj := range s.queueInf.GetStore().List() {
		queues = append(queues, obj.(*v1alpha1.Queue))
	}
	tree := quota.Build(queues)
	countedClaims := map[types.UID]bool{}
	for _, g := range gangs {
		if g.pg == nil || g.pg.Spec.Queue == "" {
			continue
		}
		for _, p := range g.bound {
			tree.Charge(g.pg.Spec.Queue, s.podUsage(snap, p, countedClaims))
		}
		for _, p := range g.terminating {
			tree.Charge(g.pg.Spec.Queue, s.podUsage(snap, p, countedClaims))
		}
	}

	// Gangs ready to be placed, per queue.
	s.mu.Lock()
	capGen := s.capacityGen
	s.mu.Unlock()
	byQueue := map[string][]*gangState{}
	pending := 0
	in := snapshot.Input{Nodes: nodes, Pods: pods, Slices: slices, Claims: claims, Classes: classes}
	// The borrowing gang that has waited longest beyond the starvation timeout, if any.
	var starving *gangState
	var starvingSince time.Time
	for _, g := range gangs {
		if len(g.pending) == 0 || g.pg == nil {
			continue
		}
		pending++
		if !s.readyToPlace(snap, tree, g) {
			continue
		}
		tree.Demand(g.pg.Spec.Queue, g.estimate)
		s.mu.Lock()
		fl := s.failures[g.key]
		s.mu.Unlock()
		if fl != nil && fl.reason == v1alpha1.ReasonUnschedulable && s.starving(ctx, in, g, fl) &&
			tree.RankOf(g.pg.Spec.Queue, g.estimate).Borrowing && (starving == nil || fl.since.Before(starvingSince)) {
			starving, starvingSince = g, fl.since
		}
		if fl != nil && fl.capacity == capGen && time.Since(fl.at) < fl.backoff {
			g.reason, g.message = fl.reason, fl.message
			continue
		}
		byQueue[g.pg.Spec.Queue] = append(byQueue[g.pg.Spec.Queue], g)
	}
	for _, list := range byQueue {
		sort.SliceStable(list, func(i, j int) bool {
			a, b := list[i].pg, list[j].pg
			if a.Spec.Priority != b.Spec.Priority {
				return a.Spec.Priority > b.Spec.Priority
			}
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return list[i].key < list[j].key
		})
	}

	// Place: always the queue whose next gang ranks best (under quota first, then borrowers
	// by over-quota usage per weight). A gang that does not fit does not block the gangs
	// behind it.
	admitted := 0
	var reclaimFor *gangState
	failedShapes := map[string]string{} // gang signature → why it did not fit
	for len(byQueue) > 0 {
		if ctx.Err() != nil {
			return
		}
		var bestQ string
		var bestRank quota.Rank
		for q, list := range byQueue {
			r := tree.RankOf(q, list[0].estimate)
			if bestQ == "" || r.Less(bestRank) || (!bestRank.Less(r) && q < bestQ) {
				bestQ, bestRank = q, r
			}
		}
		g := byQueue[bestQ][0]
		if byQueue[bestQ] = byQueue[bestQ][1:]; len(byQueue[bestQ]) == 0 {
			delete(byQueue, bestQ)
		}
		if starving != nil && g != starving && bestRank.Borrowing {
			g.reason, g.message = v1alpha1.ReasonUnschedulable, fmt.Sprintf("waits behind gang %s, which has not fit for %s and goes first among gangs beyond their quota",
				starving.key, time.Since(starvingSince).Round(time.Second))
			continue
		}
		sig := s.solver.Signature(snap, g.gang)
		if msg, failed := failedShapes[sig]; failed {
			// An identical gang did not fit earlier in this cycle; capacity only shrank since.
			s.fail(g, v1alpha1.ReasonUnschedulable, msg, capGen)
			continue
		}
		if s.place(ctx, snap, tree, g, capGen) {
			admitted++
			pending--
		} else if g.reason == v1alpha1.ReasonUnschedulable {
			failedShapes[sig] = fmt.Sprintf("same shape as gang %s, which does not fit: %s", g.key, g.message)
			if reclaimFor == nil && !bestRank.Borrowing {
				reclaimFor = g
			}
		}
	}
	gangsPending.Set(float64(pending))
	if reclaimFor != nil {
		s.reclaim(ctx, in, gangs, tree, reclaimFor)
	}

	s.writeStatuses(ctx, gangs, tree)
	logger.V(3).Info("Cycle done", "gangs", len(gangs), "admitted", admitted, "duration", time.Since(start))
}

// collectGangs maps every live pod of this scheduler to its gang and makes sure the
// mapper-managed PodGroups exist and are current.
func (s *Scheduler) collectGangs(ctx context.Context, pods []*v1.Pod) map[string]*gangState {
	logger := klog.FromContext(ctx)
	gangs := map[string]*gangState{}
	live := map[types.UID]bool{}
	for _, p := range pods {
		if p.Spec.SchedulerName != s.opts.SchedulerName {
			continue
		}
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			// An ended pod is no member and holds nothing, but its gang's
			// status counts it: a Job whose pods complete one by one is
			// finishing, not waiting. Only pods mapped before are counted.
			s.mu.Lock()
			m, ok := s.mappings[p.UID]
			s.mu.Unlock()
			if !ok {
				continue
			}
			live[p.UID] = true
			key := p.Namespace + "/" + m.Group
			if gangs[key] == nil {
				gangs[key] = &gangState{key: key, mapping: m}
			}
			if p.Status.Phase == v1.PodSucceeded {
				gangs[key].succeeded++
			} else {
				gangs[key].failed++
			}
			continue
		}
		if p.DeletionTimestamp != nil {
			// A terminating pod is no longer a member, but until it is gone its devices and
			// requests are held: it stays charged to its queue.
			if p.Spec.NodeName != "" {
				s.mu.Lock()
				m, ok := s.mappings[p.UID]
				s.mu.Unlock()
				if ok {
					key := p.Namespace + "/" + m.Group
					if gangs[key] == nil {
						gangs[key] = &gangState{key: key, mapping: m}
					}
					gangs[key].terminating = append(gangs[key].terminating, p)
					live[p.UID] = true
				}
			}
			continue
		}
		live[p.UID] = true
		s.mu.Lock()
		m, ok := s.mappings[p.UID]
		s.mu.Unlock()
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
		key := p.Namespace + "/" + m.Group
		g := gangs[key]
		if g == nil {
			g = &gangState{key: key, mapping: m}
			gangs[key] = g
		}
		if p.Spec.NodeName == "" {
			g.pending = append(g.pending, p)
		} else {
			g.bound = append(g.bound, p)
			if p.Status.Phase == v1.PodRunning {
				g.running++
			}
		}
	}
	s.mu.Lock()
	for uid := range s.mappings {
		if !live[uid] {
			delete(s.mappings, uid)
		}
	}
	for key := range s.failures {
		if gangs[key] == nil {
			delete(s.failures, key)
		}
	}
	s.mu.Unlock()
	for key, g := range gangs {
		obj, exists, _ := s.pgInf.GetStore().GetByKey(key)
		if exists {
			g.pg = obj.(*v1alpha1.PodGroup)
		}
		desired := g.mapping.Desired
		switch {
		case desired == nil && !exists:
			if len(g.pending) > 0 {
				s.recorder.Eventf(g.pending[0], v1.EventTypeWarning, "PodGroupNotFound", "PodGroup %s named by %s does not exist", key, v1alpha1.PodGroupAnnotation)
			}
		case desired != nil && !exists:
			created, err := s.sched.PodGroups(desired.Namespace).Create(ctx, desired)
			if err != nil && !apierrors.IsAlreadyExists(err) {
				logger.Error(err, "Create PodGroup", "podGroup", key)
				continue
			}
			if err == nil {
				g.pg = created
				_ = s.pgInf.GetStore().Add(created)
			}
		case desired != nil && g.pg.Labels[mapper.ManagedByLabel] == v1alpha1.SchedulerName &&
			(g.pg.Spec.MinMember != desired.Spec.MinMember || g.pg.Spec.Queue != desired.Spec.Queue):
			upd := g.pg.DeepCopy()
			upd.Spec.MinMember, upd.Spec.Queue = desired.Spec.MinMember, desired.Spec.Queue
			if updated, err := s.sched.PodGroups(upd.Namespace).Update(ctx, upd); err != nil {
				logger.Error(err, "Update PodGroup", "podGroup", key)
			} else {
				g.pg = updated
			}
		}
	}
	return gangs
}

// readyToPlace checks queue, members and claims, filling the gang's solver input and its
// estimated usage, or the reason it waits.
func (s *Scheduler) readyToPlace(snap *snapshot.Snapshot, tree *quota.Tree, g *gangState) bool {
	q := g.pg.Spec.Queue
	switch node := tree.Get(q); {
	case q == "":
		g.reason, g.message = v1alpha1.ReasonNoQueue, fmt.Sprintf("no queue: label %s is on neither the workload, the pod, nor namespace %s", v1alpha1.QueueLabel, g.pg.Namespace)
		return false
	case node == nil:
		g.reason, g.message = v1alpha1.ReasonQueueNotFound, fmt.Sprintf("queue %q does not exist", q)
		return false
	case node.Invalid != "":
		g.reason, g.message = v1alpha1.ReasonQueueInvalid, fmt.Sprintf("queue %q is invalid: %s", q, node.Invalid)
		return false
	}
	g.queueOK = true
	if have := int32(len(g.pending) + len(g.bound)); have < g.pg.Spec.MinMember {
		g.reason, g.message = v1alpha1.ReasonWaitingForMembers, fmt.Sprintf("%d of %d pods exist", have, g.pg.Spec.MinMember)
		return false
	}
	gang := &solver.Gang{Name: g.key}
	if t := g.pg.Spec.Topology; t != nil {
		gang.Topology = &solver.Topology{Key: t.Key, Required: t.Mode == v1alpha1.TopologyRequired}
	}
	est := quota.Usage{}
	var missing []string
	for _, p := range g.pending {
		claims, miss := podClaims(snap, p)
		missing = append(missing, miss...)
		gang.Pods = append(gang.Pods, solver.Pod{Pod: p, Claims: claims})
		req := snapshot.PodRequests(p)
		est[v1alpha1.ResourceCPU] += req.Cpu().AsApproximateFloat64()
		est[v1alpha1.ResourceMemory] += req.Memory().AsApproximateFloat64()
		for _, c := range claims {
			if c.Status.Allocation != nil {
				continue
			}
			for _, r := range c.Spec.Devices.Requests {
				if r.Exactly != nil {
					est[v1alpha1.ResourceGPU] += float64(max(1, r.Exactly.Count))
				} else if len(r.FirstAvailable) > 0 {
					est[v1alpha1.ResourceGPU] += float64(max(1, r.FirstAvailable[0].Count))
				}
			}
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		g.reason, g.message = v1alpha1.ReasonWaitingForClaims, fmt.Sprintf("%d ResourceClaims do not exist yet: %v", len(missing), truncate(missing, 5))
		return false
	}
	g.gang, g.estimate = gang, est
	return true
}

// podClaims resolves a pod's claims: by name, or for claims from templates through the
// pod's status (the resource claim controller writes the generated name there).
func podClaims(snap *snapshot.Snapshot, pod *v1.Pod) ([]*resourceapi.ResourceClaim, []string) {
	var out []*resourceapi.ResourceClaim
	var missing []string
	for _, pc := range pod.Spec.ResourceClaims {
		name := ""
		if pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		} else {
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					name = *st.ResourceClaimName
				}
			}
		}
		var c *resourceapi.ResourceClaim
		if name != "" {
			c = snap.Claim(pod.Namespace, name)
		}
		if c == nil {
			missing = append(missing, pod.Namespace+"/"+pod.Name+":"+pc.Name)
			continue
		}
		out = append(out, c)
	}
	return out, missing
}

// podUsage is what a bound pod holds: its requests and, once per claim, its claims' GPU
// units.
func (s *Scheduler) podUsage(snap *snapshot.Snapshot, p *v1.Pod, counted map[types.UID]bool) quota.Usage {
	req := snapshot.PodRequests(p)
	u := quota.Usage{
		v1alpha1.ResourceCPU:    req.Cpu().AsApproximateFloat64(),
		v1alpha1.ResourceMemory: req.Memory().AsApproximateFloat64(),
	}
	claims, _ := podClaims(snap, p)
	for _, c := range claims {
		if counted[c.UID] || c.Status.Allocation == nil {
			continue
		}
		counted[c.UID] = true
		u[v1alpha1.ResourceGPU] += snap.AllocationUnits(c.Status.Allocation)
	}
	return u
}

// place solves one gang, checks its exact usage against the queue limits, and starts its
// commit. It reports whether the gang was admitted.
func (s *Scheduler) place(ctx context.Context, snap *snapshot.Snapshot, tree *quota.Tree, g *gangState, capGen uint64) bool {
	logger := klog.FromContext(ctx)
	start := time.Now()
	res, err := s.solver.Solve(ctx, snap, g.gang)
	solveLatency.Observe(time.Since(start).Seconds())
	placed := g.pending
	if solver.IsUnschedulable(err) && ctx.Err() == nil {
		// Elastic gang: more pods than minMember. When not all fit, place just enough to
		// reach minMember (at least one), the rest later, as capacity allows.
		if need := max(1, int(g.pg.Spec.MinMember)-len(g.bound)); need < len(g.pending) {
			sub := *g.gang
			sub.Pods = append([]solver.Pod(nil), g.gang.Pods...)
			sort.Slice(sub.Pods, func(i, j int) bool { return sub.Pods[i].Pod.Name < sub.Pods[j].Pod.Name })
			sub.Pods = sub.Pods[:need]
			if r, subErr := s.solver.Solve(ctx, snap, &sub); subErr == nil {
				res, err = r, nil
				placed = nil
				for _, p := range sub.Pods {
					placed = append(placed, p.Pod)
				}
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		reason := v1alpha1.ReasonUnschedulable
		msg := err.Error()
		if !solver.IsUnschedulable(err) {
			msg = "invalid input: " + msg
		}
		s.fail(g, reason, msg, capGen)
		return false
	}
	usage := quota.Usage{v1alpha1.ResourceGPU: res.GPUUnits}
	for _, p := range placed {
		req := snapshot.PodRequests(p)
		usage[v1alpha1.ResourceCPU] += req.Cpu().AsApproximateFloat64()
		usage[v1alpha1.ResourceMemory] += req.Memory().AsApproximateFloat64()
	}
	if ok, why := tree.Admit(g.pg.Spec.Queue, usage); !ok {
		s.fail(g, v1alpha1.ReasonQuotaExceeded, why, capGen)
		return false
	}
	// Admitted: take the capacity in this cycle's snapshot and queue tree, assume the result
	// for later cycles, and commit in the background.
	tree.Charge(g.pg.Spec.Queue, usage)
	for _, p := range res.Placements {
		var allocs []*resourceapi.AllocationResult
		for _, ca := range p.Allocate {
			allocs = append(allocs, ca.Allocation)
		}
		snap.Assume(p.Node, p.Pod, allocs)
		s.assumed.assumePod(p.Pod.UID, p.Node)
	}
	for _, c := range assumedClaims(res) {
		s.assumed.assumeClaim(c, true)
	}
	s.mu.Lock()
	delete(s.failures, g.key)
	s.mu.Unlock()
	g.bound = append(g.bound, placed...)
	if len(placed) == len(g.pending) {
		g.pending = nil
	} else {
		isPlaced := map[types.UID]bool{}
		for _, p := range placed {
			isPlaced[p.UID] = true
		}
		var rest []*v1.Pod
		for _, p := range g.pending {
			if !isPlaced[p.UID] {
				rest = append(rest, p)
			}
		}
		g.pending = rest
	}
	g.reason, g.message = v1alpha1.ReasonScheduled, fmt.Sprintf("%d pods placed on %d nodes", len(res.Placements), countNodes(res))
	logger.V(2).Info("Gang admitted", "podGroup", g.key, "pods", len(res.Placements), "gpuUnits", res.GPUUnits, "queue", g.pg.Spec.Queue, "domain", res.Domain, "solve", time.Since(start))

	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	s.inflight.Add(1)
	pg := g.pg
	go func() {
		defer s.inflight.Done()
		defer func() { <-s.slots }()
		s.commitGang(ctx, pg, g.key, res)
	}()
	return true
}

func (s *Scheduler) fail(g *gangState, reason, msg string, capGen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fl := s.failures[g.key]
	backoff := minBackoff
	if fl != nil {
		backoff = min(maxBackoff, fl.backoff*2)
	}
	if fl == nil || fl.message != msg {
		s.recorder.Event(g.pg, v1.EventTypeWarning, reason, msg)
	}
	nf := &failure{message: msg, reason: reason, at: time.Now(), backoff: backoff, capacity: capGen, since: time.Now()}
	if fl != nil {
		nf.since, nf.fitsEmpty = fl.since, fl.fitsEmpty
	}
	s.failures[g.key] = nf
	g.reason, g.message = reason, msg
}

// starving reports whether a gang has not fit for longer than the starvation timeout and
// would fit the cluster if it were empty (a gang that can never fit must not hold others back).
func (s *Scheduler) starving(ctx context.Context, in snapshot.Input, g *gangState, fl *failure) bool {
	if s.opts.StarvationTimeout < 0 || time.Since(fl.since) < s.opts.StarvationTimeout {
		return false
	}
	s.mu.Lock()
	cached := fl.fitsEmpty
	s.mu.Unlock()
	if cached != nil {
		return *cached
	}
	empty := snapshot.New(snapshot.Input{Nodes: in.Nodes, Slices: in.Slices, Classes: in.Classes},
		snapshot.Config{Features: s.features, GPUDrivers: s.opts.GPUDrivers, CELCache: s.celCache})
	_, err := s.solver.Solve(ctx, empty, g.gang)
	fits := err == nil
	s.mu.Lock()
	fl.fitsEmpty = &fits
	s.mu.Unlock()
	return fits
}

// assumedClaims are the claims of a result as the commit will write them.
func assumedClaims(res *solver.Result) []*resourceapi.ResourceClaim {
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
	for _, p := range res.Placements {
		for _, ca := range p.Allocate {
			c := get(ca.Claim)
			c.Status.Allocation = ca.Allocation.DeepCopy()
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Pod.Name, UID: p.Pod.UID})
		}
	}
	for _, p := range res.Placements {
		for _, cl := range p.Reserve {
			c := get(cl)
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Pod.Name, UID: p.Pod.UID})
		}
	}
	out := make([]*resourceapi.ResourceClaim, 0, len(order))
	for _, k := range order {
		out = append(out, byKey[k])
	}
	return out
}

func (s *Scheduler) commitGang(ctx context.Context, pg *v1alpha1.PodGroup, key string, res *solver.Result) {
	logger := klog.FromContext(ctx)
	out, err := s.committer.commit(ctx, res)
	if errors.Is(err, errCrashed) {
		logger.Info("Commit aborted by hook", "podGroup", key, "err", err)
		return
	}
	if out != nil {
		for _, c := range out.claims {
			if c != nil {
				s.assumed.assumeClaim(c, false)
			}
		}
		podsBound.Add(float64(len(out.bound)))
	}
	if err != nil {
		commitErrors.Inc()
		logger.Error(err, "Commit failed; undone and requeued", "podGroup", key)
		bound := map[types.UID]bool{}
		if out != nil {
			for _, p := range out.bound {
				bound[p.UID] = true
			}
		}
		for _, p := range res.Placements {
			if !bound[p.Pod.UID] {
				s.assumed.forgetPod(p.Pod.UID)
				for _, ca := range p.Allocate {
					s.assumed.forgetClaim(ca.Claim.UID)
				}
			}
		}
		s.recorder.Eventf(pg, v1.EventTypeWarning, v1alpha1.ReasonCommitFailed, "commit failed and was undone: %v", err)
		s.mu.Lock()
		s.failures[key] = &failure{message: err.Error(), reason: v1alpha1.ReasonCommitFailed, at: time.Now(), backoff: minBackoff}
		s.mu.Unlock()
		s.kick(false)
		return
	}
	gangsAdmitted.Inc()
	s.recorder.Eventf(pg, v1.EventTypeNormal, v1alpha1.ReasonScheduled, "%d pods bound on %d nodes (%g GPU units)", len(res.Placements), countNodes(res), res.GPUUnits)
	for _, p := range res.Placements {
		s.recorder.Eventf(p.Pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s as part of gang %s", p.Pod.Namespace, p.Pod.Name, p.Node, key)
	}
}

func countNodes(res *solver.Result) int {
	n := map[string]bool{}
	for _, p := range res.Placements {
		n[p.Node] = true
	}
	return len(n)
}

func truncate(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(s[:n:n], fmt.Sprintf("and %d more", len(s)-n))
}

// writeStatuses updates PodGroup and Queue statuses that changed, and the queue metrics.
func (s *Scheduler) writeStatuses(ctx context.Context, gangs map[string]*gangState, tree *quota.Tree) {
	logger := klog.FromContext(ctx)
	for _, g := range gangs {
		if ctx.Err() != nil {
			return // stopping (or lost leadership): the next leader writes statuses
		}
		if g.pg == nil {
			continue
		}
		st := g.pg.Status.DeepCopy()
		st.Members = int32(len(g.pending) + len(g.bound))
		st.Scheduled = int32(len(g.bound))
		st.Running = int32(g.running)
		st.Succeeded, st.Failed = int32(g.succeeded), int32(g.failed)
		switch {
		case len(g.pending) == 0 && len(g.bound) == 0 && g.succeeded+g.failed > 0:
			st.Phase = v1alpha1.PodGroupFinished
		case g.running+g.succeeded >= int(g.pg.Spec.MinMember):
			st.Phase = v1alpha1.PodGroupRunning
		case len(g.bound)+g.succeeded >= int(g.pg.Spec.MinMember):
			st.Phase = v1alpha1.PodGroupScheduled
		default:
			st.Phase = v1alpha1.PodGroupPending
		}
		gen := g.pg.Generation
		set := func(t string, status metav1.ConditionStatus, reason, msg string) {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
		}
		if g.mapping.Reason != "" {
			set(v1alpha1.PodGroupConditionMapped, metav1.ConditionTrue, g.mapping.Reason, g.mapping.Message)
		}
		if g.queueOK {
			set(v1alpha1.PodGroupConditionQueueResolved, metav1.ConditionTrue, v1alpha1.ReasonQueueFound, fmt.Sprintf("queue %q", g.pg.Spec.Queue))
		} else if g.reason == v1alpha1.ReasonNoQueue || g.reason == v1alpha1.ReasonQueueNotFound || g.reason == v1alpha1.ReasonQueueInvalid {
			set(v1alpha1.PodGroupConditionQueueResolved, metav1.ConditionFalse, g.reason, g.message)
		}
		switch {
		case len(g.bound) >= int(g.pg.Spec.MinMember):
			msg := fmt.Sprintf("%d of %d pods bound", len(g.bound), st.Members)
			if len(g.pending) > 0 && g.reason != v1alpha1.ReasonScheduled && g.reason != "" {
				msg += fmt.Sprintf("; %d more wait: %s: %s", len(g.pending), g.reason, g.message)
			}
			set(v1alpha1.PodGroupConditionScheduled, metav1.ConditionTrue, v1alpha1.ReasonScheduled, msg)
		case g.reason != "" && g.reason != v1alpha1.ReasonScheduled:
			set(v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, g.reason, g.message)
		}
		switch g.reason {
		// Not for WaitingForMembers/WaitingForClaims: their counts change with every pod a
		// workload creates, and writing each pod for each change is quadratic.
		case v1alpha1.ReasonUnschedulable, v1alpha1.ReasonQuotaExceeded, v1alpha1.ReasonCommitFailed,
			v1alpha1.ReasonNoQueue, v1alpha1.ReasonQueueNotFound, v1alpha1.ReasonQueueInvalid:
			s.markPodsUnschedulable(ctx, g)
		}
		if statusEqual(&g.pg.Status, st) {
			continue
		}
		upd := g.pg.DeepCopy()
		upd.Status = *st
		if updated, err := s.sched.PodGroups(upd.Namespace).UpdateStatus(ctx, upd); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				logger.Error(err, "Update PodGroup status", "podGroup", g.key)
			}
		} else {
			_ = s.pgInf.GetStore().Update(updated)
		}
	}
	for _, n := range tree.Nodes() {
		if ctx.Err() != nil {
			return
		}
		st := n.Queue.Status.DeepCopy()
		st.Allocated = toQuantities(n.Allocated)
		req := quota.Usage{}
		req.Add(n.Allocated)
		req.Add(n.Requested)
		st.Requested = toQuantities(req)
		if n.Invalid != "" {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.QueueConditionValid, Status: metav1.ConditionFalse, Reason: n.InvalidReason, Message: n.Invalid, ObservedGeneration: n.Queue.Generation})
		} else {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.QueueConditionValid, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid, Message: "parent chain resolves to a root", ObservedGeneration: n.Queue.Generation})
		}
		for _, r := range quota.Resources {
			queueAllocated.WithLabelValues(n.Queue.Name, r).Set(n.Allocated[r])
			queueRequested.WithLabelValues(n.Queue.Name, r).Set(req[r])
		}
		if queueStatusEqual(&n.Queue.Status, st) {
			continue
		}
		upd := n.Queue.DeepCopy()
		upd.Status = *st
		if updated, err := s.sched.Queues().UpdateStatus(ctx, upd); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				logger.Error(err, "Update Queue status", "queue", n.Queue.Name)
			}
		} else {
			_ = s.queueInf.GetStore().Update(updated)
		}
	}
}
