package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
)

// The queues: one parent with a fixed GPU limit, four leaves whose quota and
// limit the load generator edits.
const parentQueue = "chaos-org"

var leafQueues = []string{"team-0", "team-1", "team-2", "team-3"}

// parentLimit is the parent queue's GPU limit (the cluster has 64 GPUs).
const parentLimit = 48

// shape is one kind of gang: size pods, each with a claim from template.
type shape struct {
	name     string
	template string
	size     int
	weight   int
}

var shapes = []shape{
	{"whole-1", "whole-1", 1, 6},
	{"whole-2", "whole-1", 2, 3},
	{"whole-4", "whole-1", 4, 3},
	{"whole-8", "whole-1", 8, 2},
	{"whole-16", "whole-1", 16, 1},
	{"whole-2x2", "whole-2", 2, 1},
	{"whole-ts-1", "whole-ts", 1, 2},
	{"whole-ts-2", "whole-ts", 2, 1},
	{"mig-1g", "mig-1g", 1, 4},
	{"mig-1g-4", "mig-1g", 4, 2},
	{"mig-2g-2", "mig-2g", 2, 2},
	{"mig-3g", "mig-3g", 1, 2},
	{"shared-1", "shared-10g", 1, 3},
	{"shared-3", "shared-10g", 3, 2},
}

// templates are the ResourceClaimTemplates the shapes use.
func templates() []*resourceapi.ResourceClaimTemplate {
	exactly := func(class string, count int64, cel string, capacity map[resourceapi.QualifiedName]resource.Quantity) resourceapi.DeviceRequest {
		r := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
		if cel != "" {
			r.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
		}
		if capacity != nil {
			r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
		}
		return r
	}
	mig := func(p string) string {
		return fmt.Sprintf(`device.attributes[%q].%s.startsWith(%q)`, contract.DriverName, contract.AttrProfile, p)
	}
	tpl := func(name string, r resourceapi.DeviceRequest, config ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaimTemplate {
		return &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}, Config: config}}},
		}
	}
	// A whole GPU time-sliced (its prepare sets the GPU's time slice with
	// nvidia-smi compute-policy).
	timeSliced, _ := json.Marshal(&configapi.GpuConfig{
		TypeMeta: metav1.TypeMeta{APIVersion: configapi.SchemeGroupVersion.String(), Kind: configapi.GpuConfigKind},
		Sharing:  &configapi.GpuSharing{Strategy: configapi.TimeSlicingStrategy, TimeSlicing: &configapi.TimeSlicingConfig{Interval: configapi.LongTimeSlice}},
	})
	timeSlicing := resourceapi.DeviceClaimConfiguration{Requests: []string{"gpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: contract.DriverName, Parameters: runtime.RawExtension{Raw: timeSliced}},
	}}
	return []*resourceapi.ResourceClaimTemplate{
		tpl("whole-1", exactly(contract.ClassGPU, 1, "", nil)),
		tpl("whole-2", exactly(contract.ClassGPU, 2, "", nil)),
		tpl("whole-ts", exactly(contract.ClassGPU, 1, "", nil), timeSlicing),
		tpl("mig-1g", exactly(contract.ClassMIG, 1, mig("1g."), nil)),
		tpl("mig-2g", exactly(contract.ClassMIG, 1, mig("2g."), nil)),
		tpl("mig-3g", exactly(contract.ClassMIG, 1, mig("3g."), nil)),
		tpl("shared-10g", exactly(contract.ClassShared, 1, "", map[resourceapi.QualifiedName]resource.Quantity{
			contract.CapMemory: resource.MustParse("10Gi"), contract.CapCompute: resource.MustParse("25"),
		})),
	}
}

// gang is one gang the load generator created.
type gang struct {
	name, queue, shape string
	size               int
	created            time.Time
	// deleted: the generator gave the gang up; pgGone: its PodGroup's
	// deletion succeeded. A deletion that failed (the API server was
	// restarting) is tried again by reap.
	deleted, pgGone bool
	lastDelete      time.Time
}

// tracker follows the run's pods (an informer on the direct client): binds
// per minute, and when each gang became fully bound.
type tracker struct {
	mu       sync.Mutex
	store    cache.Store
	bound    map[string]map[string]bool // gang → pod names seen bound
	gangSize map[string]int
	// gangBound are the times gangs became fully bound, in order.
	gangBound []time.Time
	binds     []time.Time
	// boundAt is when each pod was first seen bound.
	boundAt map[string]time.Time
	// succeeded: pods seen Succeeded (run to their end), counted once.
	succeeded   map[string]bool
	completions int
}

func newTracker(e *env) (*tracker, error) {
	tr := &tracker{bound: map[string]map[string]bool{}, gangSize: map[string]int{}, boundAt: map[string]time.Time{}, succeeded: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(e.kube, 0, informers.WithNamespace(namespace))
	inf := factory.Core().V1().Pods().Informer()
	tr.store = inf.GetStore()
	see := func(obj any) {
		pod, ok := obj.(*v1.Pod)
		if !ok || pod.Spec.NodeName == "" {
			return
		}
		g := pod.Annotations[v1alpha1.PodGroupAnnotation]
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if pod.Status.Phase == v1.PodSucceeded && !tr.succeeded[pod.Name] {
			tr.succeeded[pod.Name] = true
			tr.completions++
		}
		if tr.bound[g] == nil {
			tr.bound[g] = map[string]bool{}
		}
		if tr.bound[g][pod.Name] {
			return
		}
		tr.bound[g][pod.Name] = true
		now := time.Now()
		tr.binds = append(tr.binds, now)
		tr.boundAt[pod.Name] = now
		if size := tr.gangSize[g]; size > 0 && len(tr.bound[g]) == size {
			tr.gangBound = append(tr.gangBound, now)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }}); err != nil {
		return nil, err
	}
	factory.Start(e.ctx.Done())
	if !cache.WaitForCacheSync(e.ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("pod informer did not sync")
	}
	go func() { <-e.ctx.Done(); factory.Shutdown() }()
	return tr, nil
}

func (tr *tracker) expect(g string, size int) {
	tr.mu.Lock()
	tr.gangSize[g] = size
	tr.mu.Unlock()
}

// firstGangBoundAfter is when the first gang became fully bound after t.
func (tr *tracker) firstGangBoundAfter(t time.Time) (time.Time, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	i := sort.Search(len(tr.gangBound), func(i int) bool { return tr.gangBound[i].After(t) })
	if i == len(tr.gangBound) {
		return time.Time{}, false
	}
	return tr.gangBound[i], true
}

func (tr *tracker) pods(g string) []*v1.Pod {
	var out []*v1.Pod
	for _, obj := range tr.store.List() {
		if p := obj.(*v1.Pod); p.Annotations[v1alpha1.PodGroupAnnotation] == g {
			out = append(out, p)
		}
	}
	return out
}

// loadGen creates and deletes gangs and edits quotas, from its own seeded
// source: the same seed makes the same sequence of choices (what the cluster
// does in between differs with the machine's timing).
type loadGen struct {
	e   *env
	tr  *tracker
	rng *rand.Rand

	// ops: API writes issued by the generator (creates, deletes, queue
	// updates); the pods' completions are counted by the tracker.
	ops                                atomic.Int64
	gangsCreated, gangsDone, cancelled atomic.Int64
	podsCreated, quotaEdits            atomic.Int64
	failedOps                          atomic.Int64

	mu    sync.Mutex
	gangs map[string]*gang
	// limitChanged is when each queue's GPU limit last changed (the
	// invariant checker's grace starts there).
	limitChanged map[string]time.Time
	seq          int
}

func newLoadGen(e *env, tr *tracker) *loadGen {
	return &loadGen{e: e, tr: tr, rng: rand.New(rand.NewPCG(e.seed, 1)), gangs: map[string]*gang{}, limitChanged: map[string]time.Time{}}
}

func (l *loadGen) setUpQueues(ctx context.Context) error {
	gpu := func(quota, limit int64) *v1alpha1.ResourceQuota {
		return &v1alpha1.ResourceQuota{Quota: resource.NewQuantity(quota, resource.DecimalSI), Limit: resource.NewQuantity(limit, resource.DecimalSI)}
	}
	qs := []*v1alpha1.Queue{{ObjectMeta: metav1.ObjectMeta{Name: parentQueue}, Spec: v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{GPU: gpu(parentLimit, parentLimit)}}}}
	for _, name := range leafQueues {
		qs = append(qs, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parentQueue, Resources: v1alpha1.QueueResources{GPU: gpu(8, 24)}}})
	}
	for _, q := range qs {
		if _, err := l.e.ts.Queues().Create(ctx, q); err != nil {
			return fmt.Errorf("create queue %s: %w", q.Name, err)
		}
		l.limitChanged[q.Name] = time.Now()
	}
	for _, t := range templates() {
		if _, err := l.e.kube.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, t, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create template %s: %w", t.Name, err)
		}
	}
	return nil
}

// run issues operations until ctx ends.
func (l *loadGen) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	nextEdit := time.Now().Add(3 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		l.reap(ctx)
		if time.Now().After(nextEdit) {
			l.editQuota(ctx)
			nextEdit = time.Now().Add(time.Duration(1000+l.rng.IntN(2000)) * time.Millisecond)
		}
		if l.waiting() < l.e.cfg.maxWaiting {
			l.createGang(ctx)
		}
	}
}

// waiting counts gangs not yet fully bound and not deleted.
func (l *loadGen) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tr.mu.Lock()
	defer l.tr.mu.Unlock()
	n := 0
	for _, g := range l.gangs {
		if !g.deleted && len(l.tr.bound[g.name]) < g.size {
			n++
		}
	}
	return n
}

func (l *loadGen) pick() shape {
	total := 0
	for _, s := range shapes {
		total += s.weight
	}
	x := l.rng.IntN(total)
	for _, s := range shapes {
		if x < s.weight {
			return s
		}
		x -= s.weight
	}
	return shapes[0]
}

func (l *loadGen) createGang(ctx context.Context) {
	s := l.pick()
	q := leafQueues[l.rng.IntN(len(leafQueues))]
	dur := time.Duration(l.e.cfg.minRun.Milliseconds()+l.rng.Int64N(l.e.cfg.maxRun.Milliseconds()-l.e.cfg.minRun.Milliseconds())) * time.Millisecond
	l.mu.Lock()
	l.seq++
	name := fmt.Sprintf("g%05d-%s", l.seq, s.name)
	g := &gang{name: name, queue: q, shape: s.name, size: s.size, created: time.Now()}
	l.gangs[name] = g
	l.mu.Unlock()
	l.tr.expect(name, s.size)

	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(s.size), Queue: q}}
	l.ops.Add(1)
	if _, err := l.e.ts.PodGroups(namespace).Create(ctx, pg); err != nil {
		l.failedOps.Add(1)
	}
	for i := range s.size {
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: namespace, Name: fmt.Sprintf("%s-%d", name, i),
				Labels:      map[string]string{v1alpha1.QueueLabel: q},
				Annotations: map[string]string{v1alpha1.PodGroupAnnotation: name, simkubelet.AnnotationDuration: dur.String()},
			},
			Spec: v1.PodSpec{
				SchedulerName: "tessera-scheduler",
				RestartPolicy: v1.RestartPolicyNever,
				Containers: []v1.Container{{
					Name: "main", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{
						Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")},
						Claims:   []v1.ResourceClaim{{Name: "gpu"}},
					},
				}},
				ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(s.template)}},
			},
		}
		l.ops.Add(1)
		if _, err := l.e.kube.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			l.failedOps.Add(1)
			continue
		}
		l.podsCreated.Add(1)
	}
	l.gangsCreated.Add(1)
}

// reap deletes gangs whose pods all ended, gangs that lost a pod (a deleted
// node's pods are removed by the pod garbage collector: as a Job would, the
// gang is given up), and, at random, gangs that waited long (cancelled).
func (l *loadGen) reap(ctx context.Context) {
	l.mu.Lock()
	var names []string
	for name := range l.gangs {
		names = append(names, name)
	}
	l.mu.Unlock()
	sort.Strings(names)
	for _, name := range names {
		l.mu.Lock()
		g := l.gangs[name]
		deleted := g.deleted
		l.mu.Unlock()
		pods := l.tr.pods(name)
		if deleted {
			l.finishDelete(ctx, g, pods)
			continue
		}
		ended := 0
		for _, p := range pods {
			if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
				ended++
			}
		}
		age := time.Since(g.created)
		switch {
		case len(pods) == g.size && ended == g.size:
			l.gangsDone.Add(1)
		case age > 10*time.Second && len(pods) < g.size:
			// lost a pod (or a create failed)
		case age > l.e.cfg.cancelAfter && l.rng.IntN(50) == 0:
			l.cancelled.Add(1)
		default:
			continue
		}
		l.deleteGang(ctx, g, pods)
	}
}

func (l *loadGen) deleteGang(ctx context.Context, g *gang, pods []*v1.Pod) {
	l.mu.Lock()
	first := !g.deleted
	g.deleted = true
	l.mu.Unlock()
	if first || len(pods) > 0 || !g.pgGone {
		l.finishDelete(ctx, g, pods)
	}
}

// finishDelete deletes what of a given-up gang is left: pods not yet being
// deleted, and its PodGroup. Once nothing is left the gang is forgotten.
func (l *loadGen) finishDelete(ctx context.Context, g *gang, pods []*v1.Pod) {
	l.mu.Lock()
	if len(pods) == 0 && g.pgGone {
		delete(l.gangs, g.name)
		l.mu.Unlock()
		return
	}
	// Not again before the informer has seen the last attempt.
	if time.Since(g.lastDelete) < 5*time.Second {
		l.mu.Unlock()
		return
	}
	g.lastDelete = time.Now()
	l.mu.Unlock()
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		l.ops.Add(1)
		if err := l.e.kube.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}); err != nil && !apierrors.IsNotFound(err) {
			l.failedOps.Add(1)
		}
	}
	if g.pgGone {
		return
	}
	l.ops.Add(1)
	if err := l.e.ts.PodGroups(namespace).Delete(ctx, g.name); err != nil && !apierrors.IsNotFound(err) {
		l.failedOps.Add(1)
		return
	}
	l.mu.Lock()
	g.pgGone = true
	l.mu.Unlock()
}

// editQuota sets a random leaf queue's GPU quota and limit.
func (l *loadGen) editQuota(ctx context.Context) {
	name := leafQueues[l.rng.IntN(len(leafQueues))]
	quota := int64(l.rng.IntN(13))
	limit := quota + int64(l.rng.IntN(17))
	q, err := l.e.ts.Queues().Get(ctx, name)
	if err != nil {
		l.failedOps.Add(1)
		return
	}
	old := q.Spec.Resources.GPU.Limit
	q.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: resource.NewQuantity(quota, resource.DecimalSI), Limit: resource.NewQuantity(limit, resource.DecimalSI), OverQuotaWeight: q.Spec.Resources.GPU.OverQuotaWeight}
	l.ops.Add(1)
	if _, err := l.e.ts.Queues().Update(ctx, q); err != nil {
		l.failedOps.Add(1)
		return
	}
	l.quotaEdits.Add(1)
	if old == nil || old.Value() != limit {
		l.mu.Lock()
		l.limitChanged[name] = time.Now()
		l.mu.Unlock()
	}
}

func (l *loadGen) limitChangedAt(queue string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limitChanged[queue]
}

// deleteAll deletes every gang still there, and what is left of those
// deleted (the drain at the end).
func (l *loadGen) deleteAll(ctx context.Context) {
	l.mu.Lock()
	var gs []*gang
	for _, g := range l.gangs {
		gs = append(gs, g)
	}
	l.mu.Unlock()
	for _, g := range gs {
		l.deleteGang(ctx, g, l.tr.pods(g.name))
	}
}

// boundTime is when the pod was first seen bound (zero if never).
func (tr *tracker) boundTime(pod string) time.Time {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.boundAt[pod]
}
