package decide

import (
	"testing"
	"time"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// A lone pod the mapper found is placed in the first cycle that sees it: the placement
// carries the mapper's PodGroup for its commit to create, and the cycle's writes do not
// create it a second time. (It used to wait for its PodGroup to be written, watched and seen
// by one more cycle: three API round trips before it was even tried.)
func TestGangPlacedInTheCycleThatFirstSeesIt(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.queue("q", "", "", "", 1)
	s.mappedGang("lone", "q", 1, 1)
	d := s.cycle(time.Second)
	if len(d.Placements) != 1 {
		t.Fatalf("placed %d gangs in the first cycle, want the lone pod's", len(d.Placements))
	}
	p := d.Placements[0]
	if p.PodGroup != nil || p.CreatePodGroup != s.desired["ns/lone"] {
		t.Fatalf("placement PodGroup %v, CreatePodGroup %v: want none and the mapper's", p.PodGroup, p.CreatePodGroup)
	}
	for _, pg := range d.PodGroups {
		if pg.Name == "lone" {
			t.Fatalf("the cycle's writes create PodGroup lone too; the commit does")
		}
	}
	if boundPods(s, "lone") != 1 {
		t.Fatalf("lone pod not bound")
	}
	// The next cycle sees the created PodGroup and writes its status; nothing is placed again.
	d = s.cycle(time.Second)
	if len(d.Placements) != 0 || len(d.PodGroups) != 0 {
		t.Fatalf("second cycle placed %d, created %d PodGroups; want nothing", len(d.Placements), len(d.PodGroups))
	}
	if c := s.condition("lone", v1alpha1.PodGroupConditionScheduled); c.Reason != v1alpha1.ReasonScheduled {
		t.Fatalf("Scheduled condition %+v, want Scheduled", c)
	}
}

// A new gang that does not fit records no failure while it has no PodGroup — no Event with
// nothing to attach it to, no backoff, no preemption (whose Events and reservation go on the
// PodGroup) — and its PodGroup is created by the cycle's writes; the next cycle decides with
// every rule: it preempts the lower-priority gang in its way.
func TestNewGangThatDoesNotFitWaitsForItsPodGroup(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.queue("q", "", "", "", 1)
	s.gang("low", "q", 8, 1)
	if d := s.cycle(time.Second); len(d.Placements) != 1 {
		t.Fatalf("low not placed")
	}
	s.mappedGang("high", "q", 1, 1, priority(1000))
	d := s.cycle(0) // no time passes: a backoff, if recorded, would hold the next cycle back
	if len(d.Placements) != 0 || len(d.Evictions) != 0 || len(d.Events) != 0 {
		t.Fatalf("first cycle: %d placements, %d evictions, events %q; want none before the PodGroup exists", len(d.Placements), len(d.Evictions), eventReasons(d))
	}
	if len(d.PodGroups) != 1 || d.PodGroups[0].Name != "high" {
		t.Fatalf("PodGroups to create %v, want high's", d.PodGroups)
	}
	if got := d.Outcomes["ns/high"].Reason; got != v1alpha1.ReasonUnschedulable {
		t.Fatalf("outcome %q, want Unschedulable", got)
	}
	d = s.cycle(0)
	if got := evictedGangs(d); got["low"] != 8 {
		t.Fatalf("second cycle evicted %v, want low's 8 pods for high", got)
	}
	if c := s.condition("high", v1alpha1.PodGroupConditionScheduled); c.Reason != v1alpha1.ReasonUnschedulable {
		t.Fatalf("high's Scheduled condition %+v, want Unschedulable", c)
	}
}

// A gang seen for the first time queues as the youngest: with room for one of two equal
// gangs, the one whose PodGroup is older goes first, not the new one (whose mapper-made
// PodGroup carries no creation time).
func TestNewGangQueuesBehindOlderGangs(t *testing.T) {
	s := newSim(t)
	s.node("a", 2)
	s.queue("q", "", "", "", 1)
	s.gang("old", "q", 1, 2)
	s.now = s.now.Add(time.Minute) // (the sim dates its PodGroups s.seq seconds ahead)
	s.mappedGang("new", "q", 1, 2)
	d := s.cycle(time.Second)
	if len(d.Placements) != 1 || d.Placements[0].Key != "ns/old" {
		var keys []string
		for _, p := range d.Placements {
			keys = append(keys, p.Key)
		}
		t.Fatalf("placed %v, want ns/old alone", keys)
	}
	if boundPods(s, "new") != 0 {
		t.Fatalf("new bound ahead of old")
	}
}
