package scheduler

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/solver"
	"github.com/tessera-gpu/tessera/test/framework"
)

// answerAfterStop applies a pod's binding on the API server and then stops the scheduler
// (cancels the commit's context) before the answer is read: the Bind call returns the
// context's error although the pod is bound.
type answerAfterStop struct {
	next http.RoundTripper
	stop context.CancelFunc
}

func (a *answerAfterStop) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/binding") {
		return a.next.RoundTrip(req)
	}
	resp, err := a.next.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
	if err == nil {
		_ = resp.Body.Close()
	}
	a.stop()
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// TestBindAnsweredAfterStop: the scheduler is told to stop (SIGTERM, a lost Lease) while a
// binding it sent is on its way back. The API server applied it, so the pod is bound; its
// claim must stay allocated and reserved for it. Before the fix the confirming read of the
// pod used the cancelled context, failed, the binding counted as failed, and the commit's
// undo released the claim of a bound pod: its devices were free for the next scheduler,
// which placed another gang on them (BenchmarkFair/unfit in CI: 3 init pods lost their
// claims when the init scheduler was stopped, and the gang that cannot fit was bound).
func TestBindAnsweredAfterStop(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cp := framework.Shared(t)
	kube := cp.Client(t)
	ns := cp.CreateNamespace(t)

	claim := fixture.GPUClaim(ns, "p-gpu", 1)
	claim.UID = ""
	claim, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := fixture.Pod(ns, "p", "p-gpu")
	pod.UID = ""
	if pod, err = kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	commitCtx, stop := context.WithCancel(ctx)
	defer stop()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &answerAfterStop{next: rt, stop: stop} })
	c := &committer{client: kubernetes.NewForConfigOrDie(cfg), parallelism: 1, clock: clock.RealClock{}, period: time.Second}
	p := &decide.Placement{Key: ns + "/p", MinMember: 1, Result: &solver.Result{Placements: []solver.Placement{{
		Pod: pod, Node: "node-1",
		Allocate: []solver.ClaimAllocation{{Claim: claim, Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: contract.DriverName, Pool: "node-1", Device: "gpu-0"}}}}}},
	}}}}
	out, err := c.commit(commitCtx, p)
	if err != nil || len(out.bound) != 1 {
		t.Errorf("commit: %v, %d bound; want the pod counted bound (the API server bound it)", err, len(out.bound))
	}

	got, err := kube.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "node-1" {
		t.Fatalf("pod bound to %q; the test's transport should have let the binding through", got.Spec.NodeName)
	}
	cl, err := kube.ResourceV1().ResourceClaims(ns).Get(ctx, "p-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cl.Status.Allocation == nil || len(cl.Status.ReservedFor) != 1 || cl.Status.ReservedFor[0].UID != pod.UID {
		t.Errorf("claim of the bound pod: allocation %v, reserved for %v; want allocated and reserved for it", cl.Status.Allocation, cl.Status.ReservedFor)
	}
}

// cutBeforeAnswer stops the scheduler as a binding leaves: the call returns the context's
// error and the test decides whether the API server applies the binding (late) or not.
type cutBeforeAnswer struct {
	next http.RoundTripper
	stop context.CancelFunc
}

func (a *cutBeforeAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || !strings.HasSuffix(req.URL.Path, "/binding") {
		return a.next.RoundTrip(req)
	}
	a.stop()
	<-req.Context().Done()
	return nil, req.Context().Err()
}

// TestBindCutShortByStop: the scheduler is stopped while a binding is on its way, and the
// read after it finds the pod unbound. The API server may still apply the binding, so the
// commit must not release the pod's claim (a bound pod without its devices); the recovery
// at the start of the next term reads what happened: it rolls the claim back when the pod
// stayed unbound and keeps it when the binding landed.
func TestBindCutShortByStop(t *testing.T) {
	for _, landed := range []bool{false, true} {
		t.Run(map[bool]string{false: "binding lost", true: "binding applied late"}[landed], func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			cp := framework.Shared(t)
			kube := cp.Client(t)
			ns := cp.CreateNamespace(t)
			claim := fixture.GPUClaim(ns, "p-gpu", 1)
			claim.UID = ""
			claim, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod := fixture.Pod(ns, "p", "p-gpu")
			pod.UID = ""
			if pod, err = kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			commitCtx, stop := context.WithCancel(ctx)
			defer stop()
			cfg := rest.CopyConfig(cp.Config)
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &cutBeforeAnswer{next: rt, stop: stop} })
			c := &committer{client: kubernetes.NewForConfigOrDie(cfg), parallelism: 1, clock: clock.RealClock{}, period: time.Second}
			p := &decide.Placement{Key: ns + "/p", MinMember: 1, Result: &solver.Result{Placements: []solver.Placement{{
				Pod: pod, Node: "node-1",
				Allocate: []solver.ClaimAllocation{{Claim: claim, Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
					Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: contract.DriverName, Pool: "node-1", Device: "gpu-0"}}}}}},
			}}}}
			out, err := c.commit(commitCtx, p)
			if err == nil {
				t.Fatal("commit: no error; the binding was cut short")
			}
			// Left allocated in the API: the caller keeps it assumed as written.
			if out == nil || len(out.unreleased) != 1 || out.unreleased[0].Name != "p-gpu" {
				t.Errorf("commit result: %+v; want the claim handed back as still allocated", out)
			}
			if landed {
				// The API server applies the binding after the scheduler read the pod.
				if err := kube.CoreV1().Pods(ns).Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p", UID: pod.UID},
					Target: v1.ObjectReference{Kind: "Node", Name: "node-1"}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			reserved := func(stage string, want bool) {
				t.Helper()
				cl, err := kube.ResourceV1().ResourceClaims(ns).Get(ctx, "p-gpu", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got := cl.Status.Allocation != nil && len(cl.Status.ReservedFor) == 1 && cl.Status.ReservedFor[0].UID == pod.UID
				if got != want {
					t.Errorf("%s: claim allocated and reserved for the pod: %v, want %v (allocation %v, reserved for %v)", stage, got, want, cl.Status.Allocation, cl.Status.ReservedFor)
				}
			}
			reserved("after the interrupted commit", true)
			s := &Scheduler{kube: kube, opts: Options{SchedulerName: pod.Spec.SchedulerName}}
			if err := s.recover(ctx); err != nil {
				t.Fatal(err)
			}
			reserved("after recovery", landed)
		})
	}
}
