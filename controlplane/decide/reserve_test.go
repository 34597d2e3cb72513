package decide

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Capacity freed by evictions is kept for the gang it was freed for. Two nodes of 8 GPUs are
// full with two 8-GPU gangs; an 8-GPU gang that needs one of them evicted (by priority within
// its queue, or to reclaim its fair share) gets it. While the victim goes away, a smaller
// gang of a queue that ranks first arrives: it would fit in the freed GPUs, but it must not
// take them — the gang evicted for binds, and the smaller one waits. With "restart" the
// scheduler starts with empty Memory after the eviction (a new leader): it takes the
// reservation over from the PodGroup's status, chooses no second victim while the first is
// still going away, and keeps the freed node for the gang.
func TestFreedCapacityIsReservedForTheGang(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(s *sim) // the running gangs
		waiter  func(s *sim) // the gang that needs a victim
		reason  string
		restart bool
	}{
		{name: "preemption", reason: ReasonPreempting,
			setup: func(s *sim) {
				s.queue("q", "", "16", "", 1)
				s.gang("lo1", "q", 1, 8)
				s.gang("lo2", "q", 1, 8)
			},
			waiter: func(s *sim) { s.gang("hi", "q", 1, 8, priority(1000)) }},
		{name: "preemption, restarted scheduler", reason: ReasonPreempting, restart: true,
			setup: func(s *sim) {
				s.queue("q", "", "16", "", 1)
				s.gang("lo1", "q", 1, 8)
				s.gang("lo2", "q", 1, 8)
			},
			waiter: func(s *sim) { s.gang("hi", "q", 1, 8, priority(1000)) }},
		{name: "reclaim", reason: ReasonReclaiming,
			setup: func(s *sim) {
				s.queue("qa", "", "0", "", 1)
				s.queue("qb", "", "0", "", 1)
				s.gang("lo1", "qa", 1, 8)
				s.gang("lo2", "qa", 1, 8)
			},
			waiter: func(s *sim) { s.gang("hi", "qb", 1, 8) }},
		{name: "reclaim, restarted scheduler", reason: ReasonReclaiming, restart: true,
			setup: func(s *sim) {
				s.queue("qa", "", "0", "", 1)
				s.queue("qb", "", "0", "", 1)
				s.gang("lo1", "qa", 1, 8)
				s.gang("lo2", "qa", 1, 8)
			},
			waiter: func(s *sim) { s.gang("hi", "qb", 1, 8) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			s.node("a", 8)
			s.node("b", 8)
			tc.setup(s)
			s.cycle(time.Second)
			if boundPods(s, "lo1") != 1 || boundPods(s, "lo2") != 1 {
				t.Fatalf("setup: lo1 %d, lo2 %d bound", boundPods(s, "lo1"), boundPods(s, "lo2"))
			}
			tc.waiter(s)
			d := Decide(s.ctx, s.cfg, s.input(), s.mem)
			victims := evictedGangs(d)
			if len(victims) != 1 {
				t.Fatalf("evicted %v, want one gang", victims)
			}
			freedNode := d.Evictions[0].Spec.NodeName
			s.apply(d, false) // the victim is still going away
			s.now = s.now.Add(time.Second)
			r := s.pgs["ns/hi"].Status.Reservation
			if r == nil || len(r.Nodes) != 1 || r.Nodes[0] != freedNode || r.Reason != tc.reason {
				t.Fatalf("hi's status.reservation = %+v, want node %s for %s", r, freedNode, tc.reason)
			}
			if tc.restart {
				s.mem = NewMemory()
			}
			// The victim still goes away: no second victim, the reservation stays.
			d = s.cycle(time.Second)
			if len(d.Evictions) != 0 {
				t.Fatalf("evicted %v more while the first victim goes away", evictedGangs(d))
			}
			if r := s.pgs["ns/hi"].Status.Reservation; r == nil || r.Nodes[0] != freedNode {
				t.Fatalf("reservation lost while the victim goes away: %+v", r)
			}
			// The victim is gone; a smaller gang of a queue that ranks first arrives.
			for _, p := range s.pods {
				if p.Spec.NodeName == freedNode {
					s.remove(p.Name)
				}
			}
			s.queue("first", "", "8", "", 1)
			s.gang("small", "first", 1, 4)
			for range 2 {
				s.cycle(time.Second)
				for _, p := range s.pods {
					if p.Annotations[v1alpha1.PodGroupAnnotation] == "small" && p.Spec.NodeName == freedNode && boundPods(s, "hi") == 0 {
						t.Fatalf("the smaller gang took node %s, kept for hi", freedNode)
					}
				}
			}
			if got := boundPods(s, "hi"); got != 1 {
				t.Fatalf("hi has %d pods bound, want 1 (outcome %v)", got, d.Outcomes["ns/hi"])
			}
			if r := s.pgs["ns/hi"].Status.Reservation; r != nil {
				t.Errorf("placed gang still shows a reservation: %+v", r)
			}
			if len(s.mem.reserved) != 0 {
				t.Errorf("reservations left after the gang was placed: %v", s.mem.reserved)
			}
		})
	}
}

// A reservation ends when its gang goes away (no pod waits) and when it is older than
// ReservationTimeout: then others may use the node again.
func TestReservationEnds(t *testing.T) {
	cfg := Config{EvictionWait: time.Minute}.withDefaults()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		age     time.Duration
		waiting bool
		kept    bool
	}{
		{name: "young, gang waits", age: time.Minute, waiting: true, kept: true},
		{name: "gang gone", age: time.Second, waiting: false, kept: false},
		{name: "older than the timeout", age: cfg.ReservationTimeout + time.Second, waiting: true, kept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := NewMemory()
			reserve(mem, "ns/g", []string{"a", "b"}, ReasonPreempting, now.Add(-tc.age))
			got := reservedAvoid(cfg, Input{Now: now}, mem, map[string]bool{"ns/g": tc.waiting})
			if (len(got) == 2) != tc.kept || (len(mem.reserved) == 2) != tc.kept {
				t.Fatalf("avoid %v, memory %v; want kept %v", got, mem.reserved, tc.kept)
			}
			if fresh := freshReservation(cfg, Input{Now: now}, mem); fresh != (tc.kept && tc.age < cfg.EvictionWait) {
				t.Errorf("freshReservation = %v", fresh)
			}
		})
	}
}

// The status of a waiting gang names its reserved nodes, sorted, with the eviction's time to
// the second (so that reading it back changes nothing and an idle cluster costs no writes).
func TestReservationStatusIsStable(t *testing.T) {
	mem := NewMemory()
	at := time.Date(2026, 1, 1, 0, 0, 3, 500_000_000, time.UTC)
	reserve(mem, "ns/g", []string{"n2", "n1"}, ReasonConsolidating, at)
	r := reservationOf(mem, "ns/g")
	if r == nil || fmt.Sprint(r.Nodes) != "[n1 n2]" || !r.Since.Time.Equal(at.Truncate(time.Second)) || r.Reason != ReasonConsolidating {
		t.Fatalf("reservation %+v", r)
	}
	if reservationOf(mem, "ns/other") != nil {
		t.Error("another gang shows g's reservation")
	}
}

// One eviction decision per cycle: when reclaim evicts for a gang, consolidation does not
// also move pods for it in the same cycle (it did: reclaim reported that it had not acted, and
// the same four pods were evicted twice, by reclaim and by consolidation).
func TestReclaimIsTheCyclesOnlyEvictionDecision(t *testing.T) {
	s := newSim(t)
	for _, n := range []string{"a", "b", "c"} {
		s.node(n, 8)
	}
	s.queue("qa", "", "0", "", 1)
	s.queue("qb", "", "0", "", 1)
	// qa holds 16 of 24 GPUs in one-GPU pods of ReplicaSets, c's the newest; 2, 2 and 4 free.
	for _, at := range []struct {
		node string
		pods int
	}{{"a", 6}, {"b", 6}, {"c", 4}} {
		for i := range at.pods {
			s.runningPod(fmt.Sprintf("%s-p%d", at.node, i), "qa", at.node, i)
		}
	}
	s.gang("more", "qa", 1, 8) // qa wants more: its fair share is 12 of 24
	s.gang("w1", "qb", 1, 8)
	s.gang("w2", "qb", 1, 8)
	d := Decide(s.ctx, s.cfg, s.input(), s.mem)
	seen := map[string]bool{}
	for _, p := range d.Evictions {
		if seen[p.Name] {
			t.Fatalf("pod %s evicted twice in one cycle (events %s)", p.Name, eventReasons(d))
		}
		seen[p.Name] = true
	}
	if len(d.Evictions) != 4 || !strings.Contains(eventReasons(d), ReasonReclaiming) || strings.Contains(eventReasons(d), ReasonConsolidating) {
		t.Fatalf("evicted %d pods with events %s, want c's 4 by reclaim alone", len(d.Evictions), eventReasons(d))
	}
}
