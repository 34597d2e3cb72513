package decide

import (
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// TestStatusEqualIsSemanticDeepEqual: statusEqual answers as equality.Semantic.DeepEqual
// does, for a status against itself, against a copy with each field changed, and for the
// cases where the two could part (nil against empty lists, the same instant in another
// location, a monotonic clock reading).
func TestStatusEqualIsSemanticDeepEqual(t *testing.T) {
	now := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	base := func() *v1alpha1.PodGroupStatus {
		return &v1alpha1.PodGroupStatus{
			Phase: v1alpha1.PodGroupPending, Members: 4, Scheduled: 2, Running: 1, Succeeded: 1, Failed: 1,
			QueuePosition: &v1alpha1.QueuePosition{InQueue: 2, Overall: 5},
			Reservation:   &v1alpha1.Reservation{Nodes: []string{"n1", "n2"}, Reason: "starving", Since: metav1.NewTime(now)},
			Conditions: []metav1.Condition{
				{Type: v1alpha1.PodGroupConditionMapped, Status: metav1.ConditionTrue, Reason: "Mapped", Message: "m", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(now)},
				{Type: v1alpha1.PodGroupConditionScheduled, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonUnschedulable, Message: "no", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(now)},
			},
		}
	}
	edits := map[string]func(s *v1alpha1.PodGroupStatus){
		"same":                    func(*v1alpha1.PodGroupStatus) {},
		"phase":                   func(s *v1alpha1.PodGroupStatus) { s.Phase = v1alpha1.PodGroupRunning },
		"members":                 func(s *v1alpha1.PodGroupStatus) { s.Members++ },
		"scheduled":               func(s *v1alpha1.PodGroupStatus) { s.Scheduled++ },
		"running":                 func(s *v1alpha1.PodGroupStatus) { s.Running++ },
		"succeeded":               func(s *v1alpha1.PodGroupStatus) { s.Succeeded++ },
		"failed":                  func(s *v1alpha1.PodGroupStatus) { s.Failed++ },
		"queue position nil":      func(s *v1alpha1.PodGroupStatus) { s.QueuePosition = nil },
		"queue position in queue": func(s *v1alpha1.PodGroupStatus) { s.QueuePosition.InQueue++ },
		"queue position overall":  func(s *v1alpha1.PodGroupStatus) { s.QueuePosition.Overall++ },
		"reservation nil":         func(s *v1alpha1.PodGroupStatus) { s.Reservation = nil },
		"reservation node":        func(s *v1alpha1.PodGroupStatus) { s.Reservation.Nodes[1] = "n3" },
		"reservation nodes fewer": func(s *v1alpha1.PodGroupStatus) { s.Reservation.Nodes = s.Reservation.Nodes[:1] },
		"reservation nodes nil vs empty": func(s *v1alpha1.PodGroupStatus) {
			s.Reservation.Nodes = []string{}
		},
		"reservation reason": func(s *v1alpha1.PodGroupStatus) { s.Reservation.Reason = "x" },
		"reservation since":  func(s *v1alpha1.PodGroupStatus) { s.Reservation.Since = metav1.NewTime(now.Add(time.Second)) },
		"reservation since located": func(s *v1alpha1.PodGroupStatus) {
			s.Reservation.Since = metav1.NewTime(now.In(time.FixedZone("x", 3600)))
		},
		"conditions nil vs empty": func(s *v1alpha1.PodGroupStatus) { s.Conditions = []metav1.Condition{} },
		"condition dropped":       func(s *v1alpha1.PodGroupStatus) { s.Conditions = s.Conditions[:1] },
		"condition type":          func(s *v1alpha1.PodGroupStatus) { s.Conditions[1].Type = "Other" },
		"condition status":        func(s *v1alpha1.PodGroupStatus) { s.Conditions[1].Status = metav1.ConditionTrue },
		"condition reason":        func(s *v1alpha1.PodGroupStatus) { s.Conditions[1].Reason = "R" },
		"condition message":       func(s *v1alpha1.PodGroupStatus) { s.Conditions[0].Message = "other" },
		"condition generation":    func(s *v1alpha1.PodGroupStatus) { s.Conditions[0].ObservedGeneration = 2 },
		"condition time": func(s *v1alpha1.PodGroupStatus) {
			s.Conditions[0].LastTransitionTime = metav1.NewTime(now.Add(-time.Second))
		},
		"condition time located": func(s *v1alpha1.PodGroupStatus) {
			s.Conditions[0].LastTransitionTime = metav1.NewTime(now.In(time.FixedZone("y", -7200)))
		},
		"condition time monotonic": func(s *v1alpha1.PodGroupStatus) {
			wall := time.Now()
			s.Conditions[0].LastTransitionTime = metav1.NewTime(wall)
			s.Reservation.Since = metav1.NewTime(wall.Round(0))
		},
	}
	for name, edit := range edits {
		for _, emptyBase := range []bool{false, true} {
			a, b := base(), base()
			if emptyBase {
				// The same edits against a status with nil lists and pointers.
				a.QueuePosition, a.Reservation, a.Conditions = nil, nil, nil
				b.QueuePosition, b.Reservation, b.Conditions = nil, nil, nil
				if name != "same" && name != "phase" && name != "members" && name != "conditions nil vs empty" {
					continue
				}
			}
			edit(b)
			if name == "condition time monotonic" {
				// a carries the same instants without the monotonic reading.
				a.Conditions[0].LastTransitionTime = metav1.NewTime(b.Conditions[0].LastTransitionTime.Round(0))
				a.Reservation.Since = b.Reservation.Since
			}
			want := equality.Semantic.DeepEqual(a, b)
			if got := statusEqual(a, b); got != want {
				t.Errorf("%s (nil base %v): statusEqual = %v, Semantic.DeepEqual = %v", name, emptyBase, got, want)
			}
			if got := statusEqual(b, a); got != want {
				t.Errorf("%s (nil base %v), swapped: statusEqual = %v, Semantic.DeepEqual = %v", name, emptyBase, got, want)
			}
		}
	}
	// Not only agreement: if Semantic.DeepEqual changed to answer "equal" everywhere, the
	// loop above would still pass, this would not.
	a, b := base(), base()
	b.Conditions[0].Message = "other"
	if statusEqual(a, b) {
		t.Fatal("a changed message compares equal")
	}
}

// TestStatusEqualCoversEveryField fails when PodGroupStatus, Reservation, QueuePosition or
// metav1.Condition gains a field: statusEqual compares fields one by one and would miss it
// (and so would the table above), so both must be extended with it.
func TestStatusEqualCoversEveryField(t *testing.T) {
	for typ, n := range map[reflect.Type]int{
		reflect.TypeFor[v1alpha1.PodGroupStatus](): 9,
		reflect.TypeFor[v1alpha1.Reservation]():    3,
		reflect.TypeFor[v1alpha1.QueuePosition]():  2,
		reflect.TypeFor[metav1.Condition]():        6,
	} {
		if typ.NumField() != n {
			t.Errorf("%s has %d fields, statusEqual compares %d: compare the new ones there and add an edit for each to TestStatusEqualIsSemanticDeepEqual", typ, typ.NumField(), n)
		}
	}
}
