package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
)

// effects acts on decisions: it commits placements (claims, volumes, bindings) in the
// background, and writes PodGroup, upstream PodGroup and Queue statuses, pod conditions,
// PodGroup specs, evictions and Events through a keyed work queue — asynchronously,
// deduplicated (a newer write of an object replaces a pending older one; a write equal to the
// last one is skipped), retried with backoff. It never writes into the informers' stores; the
// objects it wrote are laid over them (overlay*) until the informers catch up, so that the
// next decisions start from what was written.
type effects struct {
	s         *Scheduler
	committer *committer
	writes    *writer
	slots     chan struct{}
	commits   sync.WaitGroup
	inflight  atomic.Int64

	mu           sync.Mutex
	pgOverlay    map[string]*v1alpha1.PodGroup
	queueOverlay map[string]*v1alpha1.Queue
	upOverlay    map[string]*schedulingv1beta1.PodGroup
	// created are the PodGroups commits created (gangs placed before their PodGroup
	// existed), until the informer shows them or createdTTL passes: the next cycles see the
	// gang's PodGroup — for its status, and as a victim's Event object — and do not create it
	// again.
	created map[string]createdPodGroup
	// creating are the PodGroups in-flight commits create: the cycles meanwhile do not
	// create them too.
	creating map[string]bool
	// podConds: pod UID → the PodScheduled message last patched.
	podConds map[types.UID]string
}

func newEffects(s *Scheduler) *effects {
	e := &effects{
		s:         s,
		committer: &committer{client: s.kube, hooks: s.opts.Hooks, parallelism: s.opts.Parallelism, clock: s.clock, period: s.opts.Period},
		writes:    newWriter(),
		slots:     make(chan struct{}, s.opts.Parallelism),
	}
	e.reset()
	return e
}

func (e *effects) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pgOverlay = map[string]*v1alpha1.PodGroup{}
	e.queueOverlay = map[string]*v1alpha1.Queue{}
	e.upOverlay = map[string]*schedulingv1beta1.PodGroup{}
	e.created = map[string]createdPodGroup{}
	e.creating = map[string]bool{}
	e.podConds = map[types.UID]string{}
}

func (e *effects) run(ctx context.Context, workers int) { e.writes.run(ctx, workers) }

func (e *effects) waitCommits() { e.commits.Wait() }

func (e *effects) idle() bool { return e.inflight.Load() == 0 && e.writes.idle() }

// newer reports whether resource version a is later than b (the API server's are increasing
// integers; when they do not parse, only equality is known).
func newer(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x > y
}

func (e *effects) overlayPodGroup(pg *v1alpha1.PodGroup) *v1alpha1.PodGroup {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := pg.Namespace + "/" + pg.Name
	delete(e.created, key) // the informer shows it
	if w, ok := e.pgOverlay[key]; ok {
		if w.UID == pg.UID && newer(w.ResourceVersion, pg.ResourceVersion) {
			return w
		}
		delete(e.pgOverlay, key)
	}
	return pg
}

func (e *effects) overlayQueue(q *v1alpha1.Queue) *v1alpha1.Queue {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w, ok := e.queueOverlay[q.Name]; ok {
		if w.UID == q.UID && newer(w.ResourceVersion, q.ResourceVersion) {
			return w
		}
		delete(e.queueOverlay, q.Name)
	}
	return q
}

// createdTTL bounds how long a PodGroup a commit created stands in for the informer's: a
// watch delivers it in well under a second; one deleted before its watch event came must
// not live on.
const createdTTL = 30 * time.Second

type createdPodGroup struct {
	pg *v1alpha1.PodGroup
	at time.Time
}

// createdPodGroup is the PodGroup a commit created under key that the informer does not show
// yet; nil if none.
func (e *effects) createdPodGroup(key string) *v1alpha1.PodGroup {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.created[key]
	if !ok {
		return nil
	}
	if e.s.clock.Since(c.at) > createdTTL {
		delete(e.created, key)
		return nil
	}
	return c.pg
}

// createPodGroup creates the PodGroup of a gang placed before it existed (apply marked it
// creating). One that exists already (an earlier term's writes, or made by hand under the
// same name) is read back and used.
func (e *effects) createPodGroup(ctx context.Context, desired *v1alpha1.PodGroup) (*v1alpha1.PodGroup, error) {
	s := e.s
	key := desired.Namespace + "/" + desired.Name
	defer func() {
		e.mu.Lock()
		delete(e.creating, key)
		e.mu.Unlock()
	}()
	apiWrites.WithLabelValues("podgroup").Inc()
	pg, err := s.sched.PodGroups(desired.Namespace).Create(ctx, desired.DeepCopy())
	if apierrors.IsAlreadyExists(err) {
		pg, err = s.sched.PodGroups(desired.Namespace).Get(ctx, desired.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("create PodGroup %s: %w", key, err)
	}
	e.mu.Lock()
	e.created[key] = createdPodGroup{pg: pg, at: s.clock.Now()}
	e.mu.Unlock()
	return pg, nil
}

func (e *effects) overlayUpstream(pg *schedulingv1beta1.PodGroup) *schedulingv1beta1.PodGroup {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := pg.Namespace + "/" + pg.Name
	if w, ok := e.upOverlay[key]; ok {
		if w.UID == pg.UID && newer(w.ResourceVersion, pg.ResourceVersion) {
			return w
		}
		delete(e.upOverlay, key)
	}
	return pg
}

// apply acts on one cycle's decisions. Placements are assumed at once (so that the next
// cycle sees their capacity taken) and committed in the background; everything else is
// queued for the writers.
func (e *effects) apply(ctx context.Context, d *decide.Decisions) {
	logger := klog.FromContext(ctx)
	s := e.s
	for _, p := range d.Placements {
		if ctx.Err() != nil {
			return
		}
		e.assume(ctx, p)
		select {
		case e.slots <- struct{}{}:
		case <-ctx.Done():
			e.forget(p, nil)
			return
		}
		if pg := p.CreatePodGroup; pg != nil {
			e.mu.Lock()
			e.creating[pg.Namespace+"/"+pg.Name] = true
			e.mu.Unlock()
		}
		e.commits.Add(1)
		e.inflight.Add(1)
		go func() {
			defer e.commits.Done()
			defer e.inflight.Add(-1)
			defer func() { <-e.slots }()
			e.commitGang(ctx, p)
		}()
	}
	for _, pg := range d.PodGroups {
		e.mu.Lock()
		creating := e.creating[pg.Namespace+"/"+pg.Name]
		e.mu.Unlock()
		if creating {
			continue // an earlier cycle's commit creates it right now
		}
		key := "podgroup/" + pg.Namespace + "/" + pg.Name
		e.writes.submit(key, func(ctx context.Context) error { return e.ensurePodGroup(ctx, pg) })
	}
	for _, st := range d.Statuses {
		key := st.PodGroup.Namespace + "/" + st.PodGroup.Name
		upd := st.PodGroup.DeepCopy()
		upd.Status = st.Status
		e.writes.submit("status/"+key, func(ctx context.Context) error {
			apiWrites.WithLabelValues("podgroup-status").Inc()
			written, err := s.sched.PodGroups(upd.Namespace).UpdateStatus(ctx, upd)
			if err != nil {
				return err
			}
			e.mu.Lock()
			e.pgOverlay[key] = written
			e.mu.Unlock()
			return nil
		})
	}
	for _, st := range d.UpstreamStatuses {
		key := st.PodGroup.Namespace + "/" + st.PodGroup.Name
		upd := st.PodGroup.DeepCopy()
		upd.Status.Conditions = st.Conditions
		e.writes.submit("upstream/"+key, func(ctx context.Context) error {
			apiWrites.WithLabelValues("upstream-podgroup-status").Inc()
			written, err := s.kube.SchedulingV1beta1().PodGroups(upd.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
			if err != nil {
				return err
			}
			e.mu.Lock()
			e.upOverlay[key] = written
			e.mu.Unlock()
			return nil
		})
	}
	for _, st := range d.QueueStatuses {
		upd := st.Queue.DeepCopy()
		upd.Status = st.Status
		e.writes.submit("queue/"+upd.Name, func(ctx context.Context) error {
			apiWrites.WithLabelValues("queue-status").Inc()
			written, err := s.sched.Queues().UpdateStatus(ctx, upd)
			if err != nil {
				return err
			}
			e.mu.Lock()
			e.queueOverlay[upd.Name] = written
			e.mu.Unlock()
			return nil
		})
	}
	for _, pc := range d.PodConditions {
		e.mu.Lock()
		same := e.podConds[pc.Pod.UID] == pc.Message
		e.mu.Unlock()
		if same {
			continue // patched already; the informer has not shown it yet
		}
		pod, msg := pc.Pod, pc.Message
		e.writes.submit("pod/"+string(pod.UID), func(ctx context.Context) error {
			if err := e.patchPodScheduled(ctx, pod, msg); err != nil {
				return err
			}
			e.mu.Lock()
			e.podConds[pod.UID] = msg
			e.mu.Unlock()
			return nil
		})
	}
	for _, ev := range d.Events {
		if pg, ok := ev.Object.(*v1alpha1.PodGroup); ev.Object == nil || (ok && pg == nil) {
			continue // a gang without its PodGroup yet: nothing to record it on
		}
		apiWrites.WithLabelValues("event").Inc()
		s.recorder.Event(ev.Object, ev.Type, ev.Reason, ev.Message)
	}
	for _, p := range d.Evictions {
		pod := p
		e.writes.submit("evict/"+string(pod.UID), func(ctx context.Context) error {
			apiWrites.WithLabelValues("eviction").Inc()
			err := s.kube.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}})
			if err != nil && !apierrors.IsNotFound(err) {
				logger.Error(err, "Evict pod", "pod", klog.KObj(pod))
				return err
			}
			return nil
		})
	}
	e.mu.Lock()
	if len(e.podConds) > 100000 {
		e.podConds = map[types.UID]string{}
	}
	e.mu.Unlock()
}

// ensurePodGroup creates the mapper's PodGroup or brings its minMember and queue up to date.
func (e *effects) ensurePodGroup(ctx context.Context, desired *v1alpha1.PodGroup) error {
	s := e.s
	obj, exists, _ := s.pgInf.GetStore().GetByKey(desired.Namespace + "/" + desired.Name)
	if !exists {
		apiWrites.WithLabelValues("podgroup").Inc()
		_, err := s.sched.PodGroups(desired.Namespace).Create(ctx, desired)
		if apierrors.IsAlreadyExists(err) {
			return nil // the informer will show it
		}
		return err
	}
	cur := obj.(*v1alpha1.PodGroup)
	if cur.Labels[mapperManagedBy] != v1alpha1.SchedulerName ||
		(cur.Spec.MinMember == desired.Spec.MinMember && cur.Spec.Queue == desired.Spec.Queue) {
		return nil
	}
	upd := cur.DeepCopy()
	upd.Spec.MinMember, upd.Spec.Queue = desired.Spec.MinMember, desired.Spec.Queue
	apiWrites.WithLabelValues("podgroup").Inc()
	_, err := s.sched.PodGroups(upd.Namespace).Update(ctx, upd)
	return err
}

// patchPodScheduled sets PodScheduled=False on a waiting pod with the gang's reason, as the
// kube-scheduler does for its pods, so that `kubectl describe pod` and tools reading pod
// conditions see why a pod waits.
func (e *effects) patchPodScheduled(ctx context.Context, p *v1.Pod, msg string) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{{
		Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable,
		Message: msg, LastTransitionTime: metav1.NewTime(e.s.clock.Now()),
	}}}})
	if err != nil {
		return err
	}
	apiWrites.WithLabelValues("pod-condition").Inc()
	_, err = e.s.kube.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// assume records a placement before its writes reach the informers, and reserves its
// volumes in the volume binder's cache.
func (e *effects) assume(ctx context.Context, p *decide.Placement) {
	for _, pl := range p.Result.Placements {
		e.s.assumed.assumePod(pl.Pod.UID, pl.Node)
		if err := pl.Volumes.Reserve(ctx); err != nil {
			klog.FromContext(ctx).V(2).Info("Volume reservation failed; the commit will find out", "pod", klog.KObj(pl.Pod), "err", err)
		}
	}
	for _, c := range assumedClaims(p) {
		e.s.assumed.assumeClaim(c, true)
	}
	for _, pl := range p.Result.Placements {
		if pl.Extended != nil {
			c := pl.Extended.Claim.DeepCopy()
			c.Status.Allocation = pl.Extended.Allocation.DeepCopy()
			e.s.assumed.assumeExtended(pl.Pod.UID, c)
		}
	}
}

// forget drops the assumptions of a placement's pods that are not bound.
func (e *effects) forget(p *decide.Placement, bound map[types.UID]bool) {
	ctx := context.Background()
	for _, pl := range p.Result.Placements {
		if bound[pl.Pod.UID] {
			continue
		}
		e.s.assumed.forgetPod(pl.Pod.UID)
		e.s.assumed.forgetExtended(pl.Pod.UID)
		for _, ca := range pl.Allocate {
			e.s.assumed.forgetClaim(ca.Claim.UID)
		}
		pl.Volumes.Unreserve(ctx)
	}
}

func (e *effects) commitGang(ctx context.Context, p *decide.Placement) {
	logger := klog.FromContext(ctx)
	s := e.s
	res := p.Result
	if p.PodGroup == nil && p.CreatePodGroup != nil {
		// Placed in the cycle that first saw it: its PodGroup first, so that a gang is
		// never bound without one and its Events have their object. Nothing else is
		// written yet, so a failure here leaves nothing to undo.
		pg, err := e.createPodGroup(ctx, p.CreatePodGroup)
		if err != nil {
			commitErrors.Inc()
			logger.Error(err, "Commit failed before any claim was written; requeued", "podGroup", p.Key)
			e.forget(p, nil)
			for _, pl := range res.Placements {
				s.recorder.Eventf(pl.Pod, v1.EventTypeWarning, v1alpha1.ReasonCommitFailed, "gang %s not committed: %v", p.Key, err)
			}
			s.mu.Lock()
			s.memory.CommitFailed(p.Key, err.Error(), s.clock.Now(), s.decideCfg)
			s.mu.Unlock()
			s.kick(false)
			return
		}
		p.PodGroup = pg
	}
	out, err := e.committer.commit(ctx, p)
	if errors.Is(err, errCrashed) {
		logger.Info("Commit aborted by hook", "podGroup", p.Key, "err", err)
		return
	}
	bound := map[types.UID]bool{}
	if out != nil {
		for _, c := range out.claims {
			if c != nil {
				s.assumed.assumeClaim(c, false)
			}
		}
		for _, pod := range out.bound {
			bound[pod.UID] = true
		}
		podsBound.Add(float64(len(out.bound)))
		if out.rolledBack {
			bindRollbacks.Inc()
			s.recorder.Eventf(p.PodGroup, v1.EventTypeWarning, reasonBindRolledBack, "binding failed part-way and could not be completed within %s: %d bound pods evicted so that the gang is not left half-bound (their controllers recreate them; pods without one are gone): %v", e.committer.completionWindow(), len(out.deleted), err)
		}
	}
	if err != nil {
		commitErrors.Inc()
		logger.Error(err, "Commit failed; undone and requeued", "podGroup", p.Key)
		if out != nil && out.rolledBack {
			bound = nil // deleted: nothing of the gang stays
		}
		e.forget(p, bound)
		if out != nil {
			// What the undo could not release is still allocated in the API.
			for _, c := range out.unreleased {
				s.assumed.assumeClaim(c, false)
			}
		}
		s.recorder.Eventf(p.PodGroup, v1.EventTypeWarning, v1alpha1.ReasonCommitFailed, "commit failed and was undone: %v", err)
		s.mu.Lock()
		s.memory.CommitFailed(p.Key, err.Error(), s.clock.Now(), s.decideCfg)
		s.mu.Unlock()
		s.kick(false)
		return
	}
	s.mu.Lock()
	s.memory.Committed(p.Key)
	s.mu.Unlock()
	gangsAdmitted.Inc()
	s.recorder.Eventf(p.PodGroup, v1.EventTypeNormal, v1alpha1.ReasonScheduled, "%d pods bound on %d nodes (%g GPU units)", len(res.Placements), countNodes(p), res.GPUUnits)
	for _, pl := range res.Placements {
		s.recorder.Eventf(pl.Pod, v1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s as part of gang %s", pl.Pod.Namespace, pl.Pod.Name, pl.Node, p.Key)
	}
}

// reasonBindRolledBack is the Event reason of a gang whose partial binding was rolled back.
const reasonBindRolledBack = "BindRolledBack"

const mapperManagedBy = "scheduling.tessera.dev/managed-by"

func countNodes(p *decide.Placement) int {
	n := map[string]bool{}
	for _, pl := range p.Result.Placements {
		n[pl.Node] = true
	}
	return len(n)
}

// writer runs keyed writes: a key has at most one pending write (the newest), keys are
// written in parallel, a key never twice at once, failures are retried with backoff.
type writer struct {
	queue      workqueue.TypedRateLimitingInterface[string]
	mu         sync.Mutex
	tasks      map[string]func(context.Context) error
	processing atomic.Int64
}

func newWriter() *writer {
	return &writer{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "tessera-writes"}),
		tasks: map[string]func(context.Context) error{},
	}
}

func (w *writer) submit(key string, fn func(context.Context) error) {
	w.mu.Lock()
	w.tasks[key] = fn
	w.mu.Unlock()
	w.queue.Add(key)
}

// drop forgets every pending write (a replica that lost its Lease must not write on).
func (w *writer) drop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tasks = map[string]func(context.Context) error{}
}

func (w *writer) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.tasks) == 0 && w.processing.Load() == 0
}

func (w *writer) run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
}

func (w *writer) next(ctx context.Context) bool {
	key, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(key)
	w.mu.Lock()
	fn := w.tasks[key]
	delete(w.tasks, key)
	w.processing.Add(1)
	w.mu.Unlock()
	defer w.processing.Add(-1)
	if fn == nil {
		return true
	}
	err := fn(ctx)
	switch {
	case err == nil || ctx.Err() != nil:
		w.queue.Forget(key)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err):
		// The object changed or went away: the next cycle decides again from what the
		// informers show.
		klog.FromContext(ctx).V(2).Info("Write dropped", "key", key, "err", err)
		w.queue.Forget(key)
	default:
		klog.FromContext(ctx).Error(err, "Write failed; retrying", "key", key)
		w.mu.Lock()
		if _, newer := w.tasks[key]; !newer {
			w.tasks[key] = fn
		}
		w.mu.Unlock()
		w.queue.AddRateLimited(key)
	}
	return true
}
