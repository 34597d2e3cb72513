package scheduler_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestClaimEditedAfterAllocationIsRefused (issue 16, tenant isolation): once tessera has
// allocated a pod's claim, neither its request (spec) nor its allocation (status) can be
// edited — by the claim's owner or anyone with write access — to reach other devices: the
// real API server refuses both as immutable, and the claim stays exactly as allocated.
func TestClaimEditedAfterAllocationIsRefused(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	e.startScheduler(defaultOptions())
	pods := e.gang("g", q, 1, gpuClaim)
	e.waitBound(pods, 60*time.Second)
	name := pods[0].Spec.ResourceClaims[0].ResourceClaimName
	claims := e.kube.ResourceV1().ResourceClaims(e.ns)
	before, err := claims.Get(e.ctx, *name, metav1.GetOptions{})
	if err != nil || before.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated (err %v)", *name, err)
	}

	// More devices than were allocated: the spec is immutable.
	more := before.DeepCopy()
	more.Spec.Devices.Requests[0].Exactly.Count = 8
	if _, err := claims.Update(e.ctx, more, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("spec edit after allocation: err = %v, want Invalid (immutable)", err)
	}
	// Another device in the allocation: status.allocation is immutable once set.
	other := before.DeepCopy()
	other.Status.Allocation.Devices.Results[0].Device = "gpu-7"
	if other.Status.Allocation.Devices.Results[0].Device == before.Status.Allocation.Devices.Results[0].Device {
		other.Status.Allocation.Devices.Results[0].Device = "gpu-6"
	}
	if _, err := claims.UpdateStatus(e.ctx, other, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.allocation") || !strings.Contains(err.Error(), "cannot be modified once set") {
		t.Errorf("allocation edit: err = %v, want Invalid (status.allocation cannot be modified once set)", err)
	}
	after, err := claims.Get(e.ctx, *name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(after.Spec, before.Spec) || !equality.Semantic.DeepEqual(after.Status.Allocation, before.Status.Allocation) {
		t.Errorf("claim changed: spec %+v → %+v, allocation %+v → %+v", before.Spec, after.Spec, before.Status.Allocation, after.Status.Allocation)
	}
	e.checkClaims()
}
