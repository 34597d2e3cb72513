package shadowreport

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

func at(t0 time.Time, s int) *metav1.MicroTime {
	m := metav1.NewMicroTime(t0.Add(time.Duration(s) * time.Second))
	return &m
}

// TestSummarize: a gang both placed, one the other scheduler half-placed and tessera held
// back, one tessera would have placed that the other never did, and a mapping error.
func TestSummarize(t *testing.T) {
	reports, now := sample()
	s := Summarize(reports, now)
	tt := s.Totals
	if tt.Gangs != 3 || tt.PlacedByBoth != 1 || tt.PlacedByTesseraOnly != 1 || tt.PlacedByNeither != 1 || tt.PlacedByActualOnly != 0 {
		t.Errorf("agreement totals: %+v", tt)
	}
	if tt.PartiallyPlaced != 2 || tt.PartialSeconds != 3+80 {
		t.Errorf("partial: %d gangs, %v s; want 2 and 83 (3 s, then 20 s to now)", tt.PartiallyPlaced, tt.PartialSeconds)
	}
	if tt.Deadlocks != 1 || tt.MappingErrors[v1alpha1.ReasonUnknownWorkload] != 1 || len(tt.MappingErrors) != 1 {
		t.Errorf("deadlocks %d, mapping errors %v", tt.Deadlocks, tt.MappingErrors)
	}
	if d := tt.ActualReadyToBound; d.Count != 1 || d.P50 != 4 {
		t.Errorf("actual ready→bound %+v, want one of 4 s", d)
	}
	if d := tt.TesseraReadyToPlace; d.Count != 2 || d.Max != 2 || d.Mean != 1.5 {
		t.Errorf("tessera ready→placed %+v, want 1 s and 2 s", d)
	}
	if d := tt.TesseraCycles; d.Count != 2 || d.P99 != 3 {
		t.Errorf("cycles %+v", d)
	}
	if s.Gangs[0].Name != "both" || s.Gangs[1].Name != "half" || s.Gangs[2].MappingError != "UnknownWorkload: no definition" {
		t.Errorf("gangs out of order or mapping error missing: %+v", s.Gangs)
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for p, want := range map[float64]float64{50: 5, 99: 10, 10: 1, 0: 1} {
		if got := Percentile(v, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
}

// sample: a gang both placed, one the other scheduler half-placed and tessera held back
// (deadlocked), and a pod the catalog could not map that tessera would have placed.
func sample() ([]shadowv1.ShadowReport, time.Time) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return []shadowv1.ShadowReport{
		{
			Gang:    shadowv1.Gang{Namespace: "a", Name: "both", MinMember: 2, ReadyTime: at(t0, 0), MappedReason: v1alpha1.ReasonCatalog},
			Actual:  shadowv1.Actual{Bound: 2, FirstBoundTime: at(t0, 1), FullyBoundTime: at(t0, 4), PartialStartTime: at(t0, 1), PartialEndTime: at(t0, 4), MaxPartial: 1},
			Tessera: shadowv1.Tessera{Decision: shadowv1.DecisionPlaced, DecidedTime: at(t0, 1), Cycles: 1},
		},
		{
			Gang:    shadowv1.Gang{Namespace: "a", Name: "half", MinMember: 12, ReadyTime: at(t0, 10)},
			Actual:  shadowv1.Actual{Bound: 8, FirstBoundTime: at(t0, 20), PartialStartTime: at(t0, 20), MaxPartial: 8, DeadlockTime: at(t0, 90)},
			Tessera: shadowv1.Tessera{Decision: shadowv1.DecisionWaiting, Reason: v1alpha1.ReasonUnschedulable},
		},
		{
			Gang:    shadowv1.Gang{Namespace: "b", Name: "pod-x", MinMember: 1, ReadyTime: at(t0, 50), MappedReason: v1alpha1.ReasonUnknownWorkload, MappedMessage: "no definition"},
			Tessera: shadowv1.Tessera{Decision: shadowv1.DecisionPlaced, DecidedTime: at(t0, 52), Cycles: 3},
		},
	}, t0.Add(100 * time.Second)
}
