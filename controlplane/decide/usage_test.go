package decide

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// alternation runs the time-based fair share case for a simulated hour: queues qa
// and qb (quota 0, weight 1 each) on 16 GPUs each always have a 16-GPU job of 10 minutes
// waiting. It returns, minute by minute, which queue held the cluster, and each queue's
// usage history at the end.
func alternation(t *testing.T, halfLife time.Duration) ([]string, map[string]string) {
	s := newSim(t)
	s.cfg.UsageHalfLife, s.cfg.UsageWeight, s.cfg.StarvationTimeout = halfLife, 1, -1
	s.node("a", 8)
	s.node("b", 8)
	s.queue("qa", "", "0", "", 1)
	s.queue("qb", "", "0", "", 1)
	jobs := map[string]int{}
	started := map[string]time.Time{}
	submit := func(q string) {
		jobs[q]++
		s.gang(fmt.Sprintf("%s-j%d", q, jobs[q]), q, 2, 8)
	}
	submit("qa")
	submit("qb")
	var timeline []string
	for range 60 {
		s.cycle(time.Minute)
		holder := "-"
		for _, q := range []string{"qa", "qb"} {
			job := fmt.Sprintf("%s-j%d", q, jobs[q])
			if boundPods(s, job) == 2 {
				holder = q
				if started[job].IsZero() {
					started[job] = s.now
				}
				if s.now.Sub(started[job]) >= 10*time.Minute {
					s.finish(job)
					submit(q)
				}
			}
		}
		timeline = append(timeline, holder)
	}
	usage := map[string]string{}
	for _, q := range []string{"qa", "qb"} {
		if u := s.queues[q].Status.Usage; u != nil {
			g := u.Average["gpu"]
			usage[q] = g.String()
		}
	}
	return timeline, usage
}

// Time-based fair share: with a usage history the two queues take turns over the hour;
// without one the first queue by name keeps the cluster (equal shares, no other tie-break).
func TestUsageHistoryAlternatesQueues(t *testing.T) {
	count := func(tl []string, q string) int {
		n := 0
		for _, h := range tl {
			if h == q {
				n++
			}
		}
		return n
	}
	withHistory, usage := alternation(t, 30*time.Minute)
	t.Logf("with a 30m half-life (minute by minute): %s; usage %v", strings.Join(withHistory, " "), usage)
	if a, b := count(withHistory, "qa"), count(withHistory, "qb"); a < 20 || b < 20 {
		t.Fatalf("with usage history qa held the cluster %d and qb %d of 60 minutes; want both at least 20", a, b)
	}
	if usage["qa"] == "" || usage["qa"] == "0" || usage["qb"] == "0" {
		t.Errorf("usage history not kept in the queues' status: %v", usage)
	}
	without, _ := alternation(t, 0)
	t.Logf("without history: %s", strings.Join(without, " "))
	if b := count(without, "qb"); b > 5 {
		t.Fatalf("without usage history qb held the cluster %d minutes; the test does not show the difference", b)
	}
}
