package scheduler

import (
	"errors"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// TestBindWhoseAnswerIsLost: the API server applies a pod's binding but the answer is lost
// (a load balancer's 500, a cut connection), so the retry gets 409 "already assigned". The
// pod is bound where the scheduler put it: the commit must count it bound. Before the fix the
// retries failed until the completion window ended, the gang's other pod was evicted and the
// claim of the pod that runs was released (its devices free for another gang) — found by the
// chaos run's "applied but answered 500" fault.
func TestBindWhoseAnswerIsLost(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mk := func(name string) (*v1.Pod, *resourceapi.ResourceClaim) {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: k8stypes.UID("uid-pod-" + name)}},
			&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu", Namespace: "ns", UID: k8stypes.UID("uid-claim-" + name)}}
	}
	p1, c1 := mk("p1")
	p2, c2 := mk("p2")
	client := fake.NewClientset(p1, p2, c1, c2)
	var mu sync.Mutex
	binds := map[string]int{}
	client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		create := action.(k8stesting.CreateAction)
		if create.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := create.GetObject().(*v1.Binding)
		mu.Lock()
		defer mu.Unlock()
		binds[b.Name]++
		tracker := client.Tracker()
		obj, err := tracker.Get(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "ns", b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*v1.Pod).DeepCopy()
		if pod.Spec.NodeName != "" {
			// As the API server answers a binding of a bound pod.
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "pods/binding"}, b.Name, errors.New("pod is already assigned to node "+pod.Spec.NodeName))
		}
		pod.Spec.NodeName = b.Target.Name
		if err := tracker.Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, pod, "ns"); err != nil {
			return true, nil, err
		}
		if b.Name == "p1" {
			return true, nil, apierrors.NewInternalError(errors.New("injected: applied, answer lost"))
		}
		return true, nil, nil
	})
	alloc := func(device string) *resourceapi.AllocationResult {
		return &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: contract.DriverName, Pool: "node-1", Device: device}}}}
	}
	p := &decide.Placement{Key: "ns/g", MinMember: 2, Result: &solver.Result{Placements: []solver.Placement{
		{Pod: p1, Node: "node-1", Allocate: []solver.ClaimAllocation{{Claim: c1, Allocation: alloc("gpu-0")}}},
		{Pod: p2, Node: "node-1", Allocate: []solver.ClaimAllocation{{Claim: c2, Allocation: alloc("gpu-1")}}},
	}}}
	c := &committer{client: client, parallelism: 1, clock: clock.RealClock{}, period: time.Second}

	out, err := c.commit(ctx, p)
	if err != nil {
		t.Fatalf("commit: %v (binds %v)", err, binds)
	}
	if out.rolledBack || len(out.deleted) != 0 || len(out.bound) != 2 {
		t.Errorf("commit result: bound %d, rolled back %v, evicted %d; want both bound, nothing rolled back", len(out.bound), out.rolledBack, len(out.deleted))
	}
	for _, name := range []string{"p1-gpu", "p2-gpu"} {
		cl, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cl.Status.Allocation == nil || len(cl.Status.ReservedFor) != 1 {
			t.Errorf("claim %s: allocation %v, reserved for %v; want allocated and reserved for its bound pod", name, cl.Status.Allocation, cl.Status.ReservedFor)
		}
	}
}
