package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/scheduler"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) {
	scheduler.RegisterMetrics()
	os.Exit(framework.Run(m))
}

type env struct {
	t    *testing.T
	ctx  context.Context
	cp   *framework.ControlPlane
	kube kubernetes.Interface
	sc   *client.Client
	ns   string
	id   string
}

var setupOnce sync.Once
var setupErr error

// newEnv returns a namespace on the shared control plane with tessera's CRDs and
// DeviceClasses installed. Tests run one after the other and each removes its nodes,
// slices and queues, because the scheduler sees the whole cluster.
func newEnv(t *testing.T) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	cp := framework.Shared(t)
	e := &env{t: t, ctx: ctx, cp: cp, kube: cp.Client(t)}
	var err error
	if e.sc, err = client.NewForConfig(cp.Config); err != nil {
		t.Fatal(err)
	}
	setupOnce.Do(func() { setupErr = e.install() })
	if setupErr != nil {
		t.Fatalf("install CRDs and classes: %v", setupErr)
	}
	e.ns = cp.CreateNamespace(t)
	e.id = framework.UniqueName("t")
	return e
}

// newEnvOn is newEnv on a control plane of the test's own (framework.StartForTest).
func newEnvOn(t *testing.T, cp *framework.ControlPlane) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	e := &env{t: t, ctx: ctx, cp: cp, kube: cp.Client(t)}
	var err error
	if e.sc, err = client.NewForConfig(cp.Config); err != nil {
		t.Fatal(err)
	}
	if err := e.install(); err != nil {
		t.Fatalf("install CRDs and classes: %v", err)
	}
	e.ns = cp.CreateNamespace(t)
	e.id = framework.UniqueName("t")
	return e
}

func (e *env) install() error {
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	var files []string
	for _, f := range []string{"scheduling.tessera.dev_queues.yaml", "scheduling.tessera.dev_podgroups.yaml", "scheduling.tessera.dev_topologies.yaml"} {
		files = append(files, filepath.Join(root, "deployments", "crds", f))
	}
	if err := e.cp.InstallCRDFiles(e.ctx, files...); err != nil {
		return err
	}
	// The REST mapping of a new CRD takes a moment to be served.
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := e.sc.Queues().List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("queues not served: %w", err)
	}
	for _, c := range fixture.DeviceClasses() {
		if _, err := e.kube.ResourceV1().DeviceClasses().Create(e.ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create DeviceClass %s: %w", c.Name, err)
		}
	}
	return nil
}

// addNode creates a node with its ResourceSlices; both are deleted at the end of the test.
func (e *env) addNode(name string, gpus int, partitionable bool, labels map[string]string) string {
	e.t.Helper()
	name = e.id + "-" + name
	created := e.createNodeObject(name, labels)
	slices := fixture.WholeGPUSlices(name, gpus)
	if partitionable {
		slices = fixture.PartitionableSlices(name, gpus)
	}
	for _, s := range slices {
		s.UID = ""
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: created.UID}}
		if _, err := e.kube.ResourceV1().ResourceSlices().Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("create slice %s: %v", s.Name, err)
		}
	}
	e.t.Cleanup(func() {
		for _, s := range slices {
			_ = e.kube.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		}
	})
	return name
}

// createNodeObject creates a schedulable node with allocatable CPU, memory and pods; it is
// deleted at the end of the test.
func (e *env) createNodeObject(name string, labels map[string]string) *v1.Node {
	e.t.Helper()
	all := map[string]string{"kubernetes.io/hostname": name}
	for k, v := range labels {
		all[k] = v
	}
	node := fixture.Node(name, all)
	node.UID = ""
	created, err := e.kube.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create node: %v", err)
	}
	e.t.Cleanup(func() { _ = e.kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	// The TaintNodesByCondition admission plugin taints new nodes not-ready; without a
	// kubelet (and node lifecycle controller) nothing removes it, so the test does.
	created.Spec.Taints = nil
	if created, err = e.kube.CoreV1().Nodes().Update(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("untaint node: %v", err)
	}
	created.Status = node.Status
	if created, err = e.kube.CoreV1().Nodes().UpdateStatus(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("node status: %v", err)
	}
	return created
}

// addQueue creates a root queue (or a child) with a GPU quota and limit.
func (e *env) addQueue(name, parent, quota, limit string, weight int32) string {
	e.t.Helper()
	name = e.id + "-" + name
	if parent != "" {
		parent = e.id + "-" + parent
	}
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.QueueSpec{Parent: parent}}
	rq := &v1alpha1.ResourceQuota{OverQuotaWeight: ptr.To(weight)}
	if quota != "" {
		rq.Quota = ptr.To(mustQuantity(quota))
	}
	if limit != "" {
		rq.Limit = ptr.To(mustQuantity(limit))
	}
	q.Spec.Resources.GPU = rq
	if _, err := e.sc.Queues().Create(e.ctx, q); err != nil {
		e.t.Fatalf("create queue: %v", err)
	}
	e.t.Cleanup(func() { _ = e.sc.Queues().Delete(context.Background(), name) })
	return name
}

// gang creates a PodGroup and n pods that each use their own claim from newClaim.
func (e *env) gang(name, queue string, n int, newClaim func(ns, name string) *resourceapi.ResourceClaim, mutate ...func(*v1alpha1.PodGroup)) []*v1.Pod {
	e.t.Helper()
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: queue}}
	for _, m := range mutate {
		m(pg)
	}
	if _, err := e.sc.PodGroups(e.ns).Create(e.ctx, pg); err != nil {
		e.t.Fatalf("create PodGroup: %v", err)
	}
	var pods []*v1.Pod
	for i := 0; i < n; i++ {
		c := newClaim(e.ns, fmt.Sprintf("%s-%d", name, i))
		c.UID = ""
		if _, err := e.kube.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("create claim: %v", err)
		}
		p := fixture.Pod(e.ns, fmt.Sprintf("%s-%d", name, i), c.Name)
		p.UID = ""
		p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: name}
		created, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("create pod: %v", err)
		}
		pods = append(pods, created)
	}
	return pods
}

func gpuClaim(ns, name string) *resourceapi.ResourceClaim { return fixture.GPUClaim(ns, name, 1) }

// startScheduler runs a scheduler until the test ends (or stop is called).
func (e *env) startScheduler(opts scheduler.Options) (stop func()) {
	e.t.Helper()
	_, stop = e.startSchedulerInstance(opts)
	return stop
}

func (e *env) startSchedulerInstance(opts scheduler.Options) (*scheduler.Scheduler, func()) {
	e.t.Helper()
	return e.startSchedulerWith(e.cp.Config, opts)
}

// startSchedulerWith runs a scheduler with its own client configuration.
func (e *env) startSchedulerWith(cfg *rest.Config, opts scheduler.Options) (*scheduler.Scheduler, func()) {
	e.t.Helper()
	s, err := scheduler.New(cfg, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.FromContext(e.ctx)))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				e.t.Errorf("scheduler: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return s, stop
}

// pods returns the test namespace's pods by name.
func (e *env) pods() map[string]*v1.Pod {
	list, err := e.kube.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]*v1.Pod{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

func (e *env) waitBound(pods []*v1.Pod, timeout time.Duration) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		all := e.pods()
		for _, p := range pods {
			if all[p.Name] == nil || all[p.Name].Spec.NodeName == "" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		e.t.Fatalf("pods not bound within %v: %v", timeout, err)
	}
}

func (e *env) boundCount(pods []*v1.Pod) int {
	all := e.pods()
	n := 0
	for _, p := range pods {
		if all[p.Name] != nil && all[p.Name].Spec.NodeName != "" {
			n++
		}
	}
	return n
}

// waitBoundCount waits until n of the pods are bound and returns how many are. A PodGroup's
// status counts the bindings the scheduler has committed, which reach the API server a
// moment later, so a test that read the status then counts the pods waits for them.
func (e *env) waitBoundCount(pods []*v1.Pod, n int) int {
	e.t.Helper()
	var got int
	_ = wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got = e.boundCount(pods)
		return got >= n, nil
	})
	return got
}

// waitCondition waits until the PodGroup's condition has the status and its message
// satisfies ok.
func (e *env) waitCondition(pg, condType string, status metav1.ConditionStatus, ok func(metav1.Condition) bool) metav1.Condition {
	e.t.Helper()
	var last metav1.Condition
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := e.sc.PodGroups(e.ns).Get(ctx, pg)
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == condType {
				last = c
				return c.Status == status && (ok == nil || ok(c)), nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("PodGroup %s: condition %s=%s not reached; last %+v", pg, condType, status, last)
	}
	return last
}

// checkClaims asserts the device invariant: no device is allocated to two claims (any
// namespace's).
//
// It looks at this test's pools only (their names start with the test's id): the control plane
// is shared by the package's tests, and a claim another test left behind must not fail this one.
func (e *env) checkClaims() {
	e.t.Helper()
	claims, err := e.kube.ResourceV1().ResourceClaims("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	seen := map[string]string{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if !strings.HasPrefix(r.Pool, e.id+"-") {
				continue
			}
			id := r.Driver + "/" + r.Pool + "/" + r.Device
			if prev, ok := seen[id]; ok {
				e.t.Fatalf("device %s allocated to %s and %s/%s", id, prev, c.Namespace, c.Name)
			}
			seen[id] = c.Namespace + "/" + c.Name
		}
	}
}

// markRunning is a minimal kubelet stand-in: it sets bound pods of the namespace Running.
func (e *env) markRunning() {
	e.t.Helper()
	for _, p := range e.pods() {
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodRunning {
			continue
		}
		p.Status.Phase = v1.PodRunning
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue})
		if _, err := e.kube.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
			e.t.Fatalf("mark %s Running: %v", p.Name, err)
		}
	}
}

// finish marks pods Succeeded, as a kubelet does when their containers exit (pods already
// gone are skipped).
func (e *env) finish(pods []*v1.Pod) {
	e.t.Helper()
	all := e.pods()
	for _, p := range pods {
		cur := all[p.Name]
		if cur == nil {
			continue // evicted and gone
		}
		cur.Status.Phase = v1.PodSucceeded
		if _, err := e.kube.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatalf("mark %s Succeeded: %v", p.Name, err)
		}
	}
}

func defaultOptions() scheduler.Options {
	return scheduler.Options{Period: 200 * time.Millisecond}
}

// podWithClaim creates a pod with its own one-GPU claim (UIDs from the API server); mutate
// sets its labels, annotations or node selector before it is created.
func (e *env) podWithClaim(name string, mutate func(*v1.Pod)) *v1.Pod {
	e.t.Helper()
	c := fixture.GPUClaim(e.ns, name, 1)
	c.UID = ""
	if _, err := e.kube.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	p := fixture.Pod(e.ns, name, c.Name)
	p.UID = ""
	mutate(p)
	created, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return created
}

// stepped is a scheduler on a fake clock (period 1s) whose client goes through wrap: its
// cycles run when the test steps the clock.
type stepped struct {
	e     *env
	s     *scheduler.Scheduler
	clock *clocktesting.FakeClock
}

func (e *env) startStepped(wrap func(http.RoundTripper) http.RoundTripper) *stepped {
	e.t.Helper()
	cfg := rest.CopyConfig(e.cp.Config)
	cfg.Wrap(wrap)
	clock := clocktesting.NewFakeClock(time.Now())
	opts := defaultOptions()
	opts.Period = time.Second
	opts.Clock = clock
	s, _ := e.startSchedulerWith(cfg, opts)
	return &stepped{e: e, s: s, clock: clock}
}

// cycle advances the clock by one period and waits for the cycle it triggers, and — when idle
// is set — for every commit and write that cycle started.
func (st *stepped) cycle(idle bool) {
	st.e.t.Helper()
	before := st.s.Cycles()
	st.clock.Step(time.Second)
	if err := wait.PollUntilContextTimeout(st.e.ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return st.s.Cycles() > before && (!idle || st.s.Idle()), nil
	}); err != nil {
		st.e.t.Fatalf("cycle did not finish: %v", err)
	}
}
