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
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// TestUndoThatFailsKeepsTheClaimAssumed: a commit writes claim a, fails on claim b, and the
// undo of a fails too (the API answers 500), so a stays allocated in the API. The commit must
// hand a back as written, so that the scheduler keeps it assumed: forgetting it let the next
// cycle see an informer's older copy of a without the allocation and give its device to
// another gang (a double allocation found by the chaos run under injected API errors).
func TestUndoThatFailsKeepsTheClaimAssumed(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	claim := func(name string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: k8stypes.UID("uid-claim-" + name)}}
	}
	a, b := claim("a"), claim("b")
	client := fake.NewClientset(a, b)
	var mu sync.Mutex
	statusWrites := map[string]int{}
	client.PrependReactor("update", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		update := action.(k8stesting.UpdateAction)
		if update.GetSubresource() != "status" {
			return false, nil, nil
		}
		name := update.GetObject().(*resourceapi.ResourceClaim).Name
		mu.Lock()
		defer mu.Unlock()
		statusWrites[name]++
		if name == "b" || statusWrites[name] > 1 {
			return true, nil, apierrors.NewInternalError(errors.New("injected"))
		}
		return false, nil, nil
	})
	alloc := func(device string) *resourceapi.AllocationResult {
		return &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: contract.DriverName, Pool: "node-1", Device: device}}}}
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-pod"}}
	p := &decide.Placement{Key: "ns/g", Result: &solver.Result{Placements: []solver.Placement{{Pod: pod, Node: "node-1",
		Allocate: []solver.ClaimAllocation{{Claim: a, Allocation: alloc("gpu-0")}, {Claim: b, Allocation: alloc("gpu-1")}}}}}}
	c := &committer{client: client, parallelism: 1, clock: clock.RealClock{}, period: time.Second}

	out, err := c.commit(ctx, p)
	if err == nil {
		t.Fatal("commit succeeded although claim b could not be written")
	}
	if out == nil || len(out.unreleased) != 1 || out.unreleased[0].Name != "a" || out.unreleased[0].Status.Allocation == nil {
		t.Fatalf("commit result %+v: want claim a, allocated as written, among the unreleased", out)
	}
	inAPI, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if inAPI.Status.Allocation == nil {
		t.Fatal("the injected error did not keep claim a allocated: the test no longer tests a failed undo")
	}
	// The assume cache then shows the written claim over an informer copy without it.
	cache := newAssumeCache()
	for _, c := range out.unreleased {
		cache.assumeClaim(c, false)
	}
	stale := a.DeepCopy()
	stale.ResourceVersion = "0"
	_, claims := cache.overlay(nil, []*resourceapi.ResourceClaim{stale})
	if claims[0].Status.Allocation == nil {
		t.Error("the overlay shows claim a unallocated while it is allocated in the API")
	}
}
