package decide

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Two queues within quota each get their gang; a third gang beyond qa's quota waits until qb's
// gang finishes, then borrows the idle GPUs.
func TestQuotaThenBorrowing(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.node("b", 8)
	s.queue("qa", "", "8", "16", 1)
	s.queue("qb", "", "8", "16", 1)
	s.gang("a1", "qa", 8, 1)
	s.gang("b1", "qb", 8, 1)
	if d := s.cycle(time.Second); len(d.Placements) != 2 {
		t.Fatalf("placed %d gangs, want both", len(d.Placements))
	}
	s.gang("a2", "qa", 4, 1)
	s.cycle(time.Second)
	if c := s.condition("a2", v1alpha1.PodGroupConditionScheduled); c.Reason != v1alpha1.ReasonUnschedulable || !strings.Contains(c.Message, "0 free GPU units") {
		t.Fatalf("a2 condition = %+v, want Unschedulable with 0 free", c)
	}
	s.finish("b1")
	s.cycle(time.Second)
	if got := s.boundGPUs(); got["qa"] != 12 || got["qb"] != 0 {
		t.Fatalf("GPUs bound per queue = %v, want qa 12 (8 + 4 borrowed), qb 0", got)
	}
}

// 16 GPUs, qa (quota 4, weight 1) and qb (quota 4, weight 3) submit 12 one-GPU gangs each,
// all at once: both get their quota, then the 8 idle GPUs go 1:3.
func TestIdleCapacitySharedByWeight(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.node("b", 8)
	s.queue("qa", "", "4", "", 1)
	s.queue("qb", "", "4", "", 3)
	for i := range 12 {
		s.gang(fmt.Sprintf("a%02d", i), "qa", 1, 1)
		s.gang(fmt.Sprintf("b%02d", i), "qb", 1, 1)
	}
	d := s.cycle(time.Second)
	if got := s.boundGPUs(); got["qa"] != 6 || got["qb"] != 10 {
		t.Fatalf("GPUs per queue = %v, want qa 6, qb 10", got)
	}
	if d.Pending != 8 {
		t.Errorf("pending gangs = %d, want 8", d.Pending)
	}
}

// Within a queue: higher priority first, then older.
func TestPriorityThenAge(t *testing.T) {
	s := newSim(t)
	s.node("a", 2)
	s.queue("q", "", "", "", 1)
	s.gang("old", "q", 1, 1)
	s.gang("young-high", "q", 1, 1, func(pg *v1alpha1.PodGroup) { pg.Spec.Priority = 10 })
	s.gang("younger", "q", 1, 1)
	s.cycle(time.Second)
	for name, want := range map[string]bool{"young-high": true, "old": true, "younger": false} {
		if got := s.pods["ns/"+name+"-0"].Spec.NodeName != ""; got != want {
			t.Errorf("gang %s bound = %v, want %v", name, got, want)
		}
	}
}

// Fifty random gangs into a hierarchy with limits, with gangs finishing between cycles:
// after every cycle no queue (or parent) uses more than its limit.
func TestFiftyGangsNeverExceedLimits(t *testing.T) {
	s := newSim(t)
	for i := range 4 {
		s.node(fmt.Sprintf("n%d", i), 8)
	}
	s.queue("org", "", "16", "24", 1)
	s.queue("t1", "org", "4", "10", 1)
	s.queue("t2", "org", "8", "", 2)
	s.queue("t3", "", "", "6", 1)
	limits := map[string]int64{"org": 24, "t1": 10, "t3": 6}
	rng := rand.New(rand.NewSource(7))
	leaves := []string{"t1", "t2", "t3"}
	for i := range 50 {
		s.gang(fmt.Sprintf("g%02d", i), leaves[rng.Intn(3)], 1+rng.Intn(4), 1)
	}
	for c := range 30 {
		s.cycle(time.Second)
		for q, lim := range limits {
			if got := s.boundGPUs()[q]; got > lim {
				t.Fatalf("cycle %d: queue %s uses %d GPUs, limit %d", c, q, got, lim)
			}
		}
		// Some running gangs finish.
		for _, k := range sortedKeys(s.pgs) {
			name := s.pgs[k].Name
			if p := s.pods["ns/"+name+"-0"]; p != nil && p.Spec.NodeName != "" && p.Status.Phase == v1.PodRunning && rng.Intn(3) == 0 {
				s.finish(name)
			}
		}
	}
	finished := 0
	for _, p := range s.pods {
		if p.Status.Phase == v1.PodSucceeded {
			finished++
		}
	}
	if finished == 0 {
		t.Fatal("no gang ever ran: the test exercised nothing")
	}
}

// Quota is a guarantee: qb borrowed all 16 GPUs; qa's gang within its quota gets them back by
// evicting qb's newest gangs, never below qb's own quota.
func TestReclaimGivesQuotaBack(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.node("b", 8)
	s.queue("qa", "", "8", "", 1)
	s.queue("qb", "", "8", "", 1)
	for i := range 4 {
		s.gang(fmt.Sprintf("b%d", i), "qb", 4, 1)
	}
	s.cycle(time.Second)
	if got := s.boundGPUs()["qb"]; got != 16 {
		t.Fatalf("qb holds %d GPUs, want all 16", got)
	}
	s.gang("a1", "qa", 8, 1)
	d := s.cycle(time.Second)
	var evicted []string
	for _, p := range d.Evictions {
		evicted = append(evicted, p.Annotations[v1alpha1.PodGroupAnnotation])
	}
	if len(d.Evictions) != 8 || !strings.Contains(strings.Join(evicted, ","), "b3") || !strings.Contains(strings.Join(evicted, ","), "b2") {
		t.Fatalf("evicted %v, want the 8 pods of the newest gangs b2 and b3", evicted)
	}
	var reasons []string
	for _, e := range d.Events {
		reasons = append(reasons, e.Reason)
	}
	if !strings.Contains(strings.Join(reasons, ","), ReasonReclaiming) || !strings.Contains(strings.Join(reasons, ","), ReasonReclaimed) {
		t.Errorf("events %v lack Reclaiming/Reclaimed", reasons)
	}
	// While the evicted pods go away, no further victims are chosen.
	if d := s.cycle(time.Second); len(d.Evictions) != 0 {
		t.Fatalf("second reclaim while the first is in progress: %d evictions", len(d.Evictions))
	}
	s.capGen++
	s.cycle(time.Second)
	if got := s.boundGPUs(); got["qa"] != 8 || got["qb"] != 8 {
		t.Fatalf("after reclaim: %v, want qa 8 and qb 8", got)
	}
}

// A borrowing gang that has not fit for longer than the starvation timeout and fits the empty
// cluster holds back smaller borrowers until it is placed; the message carries no clock.
func TestStarvingGangGoesFirst(t *testing.T) {
	s := newSim(t)
	s.cfg.StarvationTimeout = time.Minute
	s.node("a", 8)
	s.queue("q", "", "", "", 1) // no GPU quota: every GPU is borrowed
	s.gang("filler", "q", 6, 1)
	s.cycle(time.Second)
	s.gang("big", "q", 8, 1)
	s.cycle(time.Second)
	// Small gangs keep arriving and each runs for 3 cycles: without protection they would
	// take every GPU that frees up, one at a time, and the big gang would never fit.
	started := map[string]int{}
	for i := range 90 {
		s.gang(fmt.Sprintf("small%02d", i), "q", 1, 1)
		s.cycle(time.Second)
		if i == 2 {
			s.finish("filler")
		}
		for j := 0; j <= i; j++ {
			name := fmt.Sprintf("small%02d", j)
			if p := s.pods["ns/"+name+"-0"]; p.Spec.NodeName != "" && p.Status.Phase == v1.PodRunning {
				if started[name] == 0 {
					started[name] = i
				} else if i-started[name] >= 3 {
					s.finish(name)
				}
			}
		}
		if s.pods["ns/big-0"].Spec.NodeName != "" {
			if i < 60 {
				t.Fatalf("big gang placed after %d cycles, before the starvation timeout: the test premise (small gangs take the GPUs) failed", i)
			}
			break
		}
	}
	if p := s.pods["ns/big-0"]; p.Spec.NodeName == "" {
		c := s.condition("big", v1alpha1.PodGroupConditionScheduled)
		t.Fatalf("big gang still waits after the starvation timeout: %s", c.Message)
	}
	held := false
	for _, pg := range s.pgs {
		for _, c := range pg.Status.Conditions {
			if strings.Contains(c.Message, "waits behind gang ns/big, which has not fit for longer than the starvation timeout (1m0s)") {
				held = true
			}
		}
	}
	if !held {
		t.Error("no small gang was told it waits behind the starving one")
	}
}

// A gang whose pods do not all exist waits quietly at first; past the formation timeout its
// condition names the workload and what is missing, an Event says so once, and its pods say
// why. Nothing more is written while that stays true.
func TestGangThatCannotFormSaysSo(t *testing.T) {
	s := newSim(t)
	s.cfg.FormationTimeout = 2 * time.Minute
	s.node("a", 8)
	s.queue("q", "", "", "", 1)
	s.gang("train", "q", 4, 1)
	s.remove("train-3") // the operator created 3 of 4
	in := s.input()
	in.Gangs[0].Workload = "JobSet ns/train"
	d := Decide(s.ctx, s.cfg, in, s.mem)
	if o := d.Outcomes["ns/train"]; o.Reason != v1alpha1.ReasonWaitingForMembers || o.Message != "3 of 4 pods exist" {
		t.Fatalf("before the timeout: %+v", o)
	}
	if len(d.Events) != 0 || len(d.PodConditions) != 0 {
		t.Fatalf("before the timeout: %d events, %d pod conditions", len(d.Events), len(d.PodConditions))
	}
	in.Now = in.Now.Add(3 * time.Minute)
	d = Decide(s.ctx, s.cfg, in, s.mem)
	o := d.Outcomes["ns/train"]
	want := "only 3 of 4 pods of JobSet ns/train exist after 2m0s: waiting for 1 more before any is placed"
	if o.Reason != v1alpha1.ReasonWaitingForMembers || o.Message != want {
		t.Fatalf("after the timeout: %+v, want %q", o, want)
	}
	if len(d.Events) != 1 || d.Events[0].Reason != ReasonGangIncomplete || !strings.Contains(d.Events[0].Message, "JobSet ns/train") {
		t.Fatalf("events = %+v, want one GangIncomplete naming the workload", d.Events)
	}
	if len(d.PodConditions) != 3 {
		t.Fatalf("pod conditions = %d, want the 3 waiting pods", len(d.PodConditions))
	}
	if len(d.Statuses) != 1 || !strings.Contains(fmt.Sprint(d.Statuses[0].Status.Conditions), want) {
		t.Fatalf("statuses = %+v", d.Statuses)
	}
	// Applied, and an hour later: nothing new to write or say.
	for _, st := range d.Statuses {
		s.pgs["ns/train"] = st.PodGroup.DeepCopy()
		s.pgs["ns/train"].Status = st.Status
	}
	for _, pc := range d.PodConditions {
		p := s.pods["ns/"+pc.Pod.Name].DeepCopy()
		p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: pc.Message}}
		s.pods["ns/"+p.Name] = p
	}
	in = s.input()
	in.Gangs[0].Workload = "JobSet ns/train"
	in.Now = in.Now.Add(time.Hour)
	d = Decide(s.ctx, s.cfg, in, s.mem)
	if len(d.Statuses)+len(d.PodConditions)+len(d.Events) != 0 {
		t.Fatalf("an hour later: %d statuses, %d pod conditions, %d events; want none", len(d.Statuses), len(d.PodConditions), len(d.Events))
	}
}

// A waiting gang whose reason did not change produces no decisions to write, cycle after
// cycle (its backoff expiring included): zero writes per idle cycle.
func TestWaitingGangsDecideNothingNew(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.queue("q", "", "", "", 1)
	for i := range 20 {
		s.gang(fmt.Sprintf("g%02d", i), "q", 2, 8) // 16 GPUs each: never fits
	}
	first := s.cycle(time.Second)
	if len(first.Statuses) != 20 || len(first.PodConditions) != 40 || len(first.Events) != 20 {
		t.Fatalf("first cycle: %d statuses, %d pod conditions, %d events; want 20, 40, 20", len(first.Statuses), len(first.PodConditions), len(first.Events))
	}
	for c := range 300 {
		d := s.cycle(time.Second)
		if n := len(d.Statuses) + len(d.PodConditions) + len(d.Events) + len(d.QueueStatuses) + len(d.PodGroups) + len(d.Placements); n != 0 {
			t.Fatalf("idle cycle %d decided %d things: %+v", c, n, d.Statuses)
		}
	}
}

// metav1 is used by helpers in sim_test.go.
var _ = metav1.Now
