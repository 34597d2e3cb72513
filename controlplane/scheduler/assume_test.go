package scheduler

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func claim(uid, rv string, allocated bool, consumers ...types.UID) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv}}
	if allocated {
		c.Status.Allocation = &resourceapi.AllocationResult{}
	}
	for _, p := range consumers {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", UID: p})
	}
	return c
}

func TestAssumeCacheOverlay(t *testing.T) {
	a := newAssumeCache()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "p"}}
	a.assumePod("p", "node-1")
	a.assumeClaim(claim("c", "10", true, "p"), true)

	// In flight: the informer still has the old objects; the overlay shows the decision, even
	// when the informer shows an intermediate write (the finalizer update, a newer version).
	pods, claims := a.overlay([]*v1.Pod{pod}, []*resourceapi.ResourceClaim{claim("c", "11", false)})
	if pods[0].Spec.NodeName != "node-1" || claims[0].Status.Allocation == nil {
		t.Fatalf("pending decision not overlaid: node %q allocated %v", pods[0].Spec.NodeName, claims[0].Status.Allocation != nil)
	}
	if pod.Spec.NodeName != "" {
		t.Fatal("overlay modified the informer's object")
	}
	// Written at version 12: kept until the informer has version 12 or later.
	a.assumeClaim(claim("c", "12", true, "p"), false)
	_, claims = a.overlay([]*v1.Pod{pod}, []*resourceapi.ResourceClaim{claim("c", "11", false)})
	if claims[0].Status.Allocation == nil {
		t.Fatal("written claim dropped before the informer caught up")
	}
	// The informer moved past it (the pod already finished and the claim was released): the
	// informer's state wins.
	_, claims = a.overlay([]*v1.Pod{pod}, []*resourceapi.ResourceClaim{claim("c", "15", false)})
	if claims[0].Status.Allocation != nil || len(a.claims) != 0 {
		t.Fatal("stale assumption kept after the informer moved on")
	}
	bound := pod.DeepCopy()
	bound.Spec.NodeName = "node-1"
	if a.overlay([]*v1.Pod{bound}, nil); len(a.pods) != 0 {
		t.Fatal("assumed pod kept after the informer showed the binding")
	}
	// Objects that disappeared are forgotten.
	a.assumePod("gone", "node-1")
	a.assumeClaim(claim("gone", "1", true), true)
	a.overlay(nil, nil)
	if len(a.pods)+len(a.claims) != 0 {
		t.Fatal("assumptions for deleted objects kept")
	}
}

// An extended-resource claim being created holds its devices in the overlay until the
// informer shows the created claim allocated, or its pod is gone.
func TestAssumeCacheExtendedClaims(t *testing.T) {
	a := newAssumeCache()
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "p"}}
	a.assumeExtended("p", claim("<extended-resources>", "", true, "p"))
	_, claims := a.overlay([]*v1.Pod{pod}, nil)
	if len(claims) != 1 || claims[0].Status.Allocation == nil {
		t.Fatalf("claims = %v, want the assumed extended claim", claims)
	}
	created := claim("p-extended-resources-x", "5", true, "p")
	created.Annotations = map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}
	created.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: "p", UID: "p"}}
	if _, claims = a.overlay([]*v1.Pod{pod}, []*resourceapi.ResourceClaim{created}); len(claims) != 1 || claims[0].Name != created.Name {
		t.Fatalf("claims = %v, want only the created one", claims)
	}
	a.assumeExtended("p", claim("<extended-resources>", "", true, "p"))
	if _, claims = a.overlay(nil, nil); len(claims) != 0 || len(a.extended) != 0 {
		t.Fatal("extended claim of a deleted pod kept")
	}
}
