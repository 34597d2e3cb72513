package shadow

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
)

func pod(name string, created time.Time, node string) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name), CreationTimestamp: metav1.NewTime(created)}}
	p.Spec.NodeName = node
	if node == "" {
		p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: "0/1 nodes are available"}}
	}
	return p
}

func gang(minMember int32, pods ...*v1.Pod) *observed {
	g := &observed{namespace: "ns", mapping: mapper.Mapping{Group: "g", Reason: v1alpha1.ReasonCatalog},
		group: &v1alpha1.PodGroup{Spec: v1alpha1.PodGroupSpec{MinMember: minMember, Queue: "q"}}}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			g.pending = append(g.pending, p)
		} else {
			g.bound = append(g.bound, p)
		}
	}
	return g
}

// TestObserveGangPartialThenWhole: two of three pods bound, the third unschedulable: partly
// placed and, after the deadlock timeout without a binding, deadlocked; then the third is
// bound and the partial span closes at its binding.
func TestObserveGangPartialThenWhole(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &world{now: t0.Add(10 * time.Second), costs: costFunc{}, deadlockAfter: 5 * time.Second,
		seen: map[types.UID]time.Time{}, bound: map[types.UID]time.Time{"a": t0.Add(2 * time.Second), "b": t0.Add(3 * time.Second)}}
	r := &record{pods: map[string]shadowv1.PodPlacement{}}
	r.observeGang(w, gang(3, pod("a", t0, "n1"), pod("b", t0.Add(time.Second), "n1"), pod("c", t0.Add(4*time.Second), "")))
	rep := r.report
	if rep.Gang.ReadyTime == nil || !rep.Gang.ReadyTime.Time.Equal(t0.Add(4*time.Second)) || rep.Gang.Queue != "q" || rep.Gang.MinMember != 3 {
		t.Errorf("gang = %+v, want ready when its third pod appeared", rep.Gang)
	}
	a := rep.Actual
	if a.Bound != 2 || a.MaxPartial != 2 || a.PartialStartTime == nil || !a.PartialStartTime.Time.Equal(t0.Add(2*time.Second)) || a.PartialEndTime != nil || a.FullyBoundTime != nil {
		t.Errorf("actual = %+v, want 2 of 3 bound since t0+2s, still partial", a)
	}
	if a.DeadlockTime == nil || a.DeadlockMessage == "" {
		t.Errorf("no deadlock after 7 s without a binding and the waiting pod unschedulable: %+v", a)
	}

	w.now = t0.Add(20 * time.Second)
	w.bound["c"] = t0.Add(15 * time.Second)
	r.observeGang(w, gang(3, pod("a", t0, "n1"), pod("b", t0.Add(time.Second), "n1"), pod("c", t0.Add(4*time.Second), "n2")))
	a = r.report.Actual
	if a.Bound != 3 || a.FullyBoundTime == nil || !a.FullyBoundTime.Time.Equal(t0.Add(15*time.Second)) || a.PartialEndTime == nil || !a.PartialEndTime.Time.Equal(a.FullyBoundTime.Time) || a.MaxPartial != 2 {
		t.Errorf("actual = %+v, want fully bound at t0+15s closing the partial span", a)
	}
	if len(a.Nodes) != 2 || len(a.Pods) != 3 || !a.Pods[0].BoundTime.Time.Equal(t0.Add(2*time.Second)) {
		t.Errorf("nodes %v pods %+v", a.Nodes, a.Pods)
	}
}

// TestObserveGangBoundAtOnce: a gang whose pods were all bound at the same instant was never
// partly placed; nor is a gang of one.
func TestObserveGangBoundAtOnce(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := t0.Add(time.Second)
	w := &world{now: t0.Add(10 * time.Second), costs: costFunc{}, deadlockAfter: 5 * time.Second,
		seen: map[types.UID]time.Time{}, bound: map[types.UID]time.Time{"a": at, "b": at}}
	r := &record{pods: map[string]shadowv1.PodPlacement{}}
	r.observeGang(w, gang(2, pod("a", t0, "n1"), pod("b", t0, "n1")))
	if a := r.report.Actual; a.FullyBoundTime == nil || a.PartialStartTime != nil || a.MaxPartial != 0 {
		t.Errorf("actual = %+v, want fully bound and never partial", a)
	}
	one := &record{pods: map[string]shadowv1.PodPlacement{}}
	one.observeGang(w, gang(1, pod("a", t0, "n1")))
	if a := one.report.Actual; a.PartialStartTime != nil || a.FullyBoundTime == nil {
		t.Errorf("gang of one: %+v", a)
	}
}

// TestReadyNeedsClaims: a pod whose claim from a template does not exist yet keeps the gang
// from being ready.
func TestReadyNeedsClaims(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &world{now: t0, costs: costFunc{}, seen: map[types.UID]time.Time{}, bound: map[types.UID]time.Time{}}
	p := pod("a", t0, "")
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}}
	if _, ok := readyAt(w, gang(1, p), 1); ok {
		t.Error("ready before the pod's claim exists")
	}
	if _, ok := readyAt(w, gang(2, pod("b", t0, "")), 2); ok {
		t.Error("ready with 1 of 2 pods")
	}
}
