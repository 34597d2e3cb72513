package decide

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

func priority(p int32) func(*v1alpha1.PodGroup) {
	return func(pg *v1alpha1.PodGroup) { pg.Spec.Priority = p }
}

func notPreemptible(pg *v1alpha1.PodGroup) { pg.Spec.Preemptible = ptr.To(false) }

func minMember(n int32) func(*v1alpha1.PodGroup) {
	return func(pg *v1alpha1.PodGroup) { pg.Spec.MinMember = n }
}

// evictedGangs lists the gangs (with their pod counts) a cycle evicted pods of.
func evictedGangs(d *Decisions) map[string]int {
	out := map[string]int{}
	for _, p := range d.Evictions {
		out[p.Annotations[v1alpha1.PodGroupAnnotation]]++
	}
	return out
}

func eventReasons(d *Decisions) string {
	var rs []string
	for _, e := range d.Events {
		rs = append(rs, e.Reason)
	}
	sort.Strings(rs)
	return strings.Join(rs, ",")
}

func boundPods(s *sim, group string) int {
	n := 0
	for _, p := range s.pods {
		if p.Annotations[v1alpha1.PodGroupAnnotation] == group && p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded {
			n++
		}
	}
	return n
}

// The setup: queue Q (quota 16) is full with two priority-0 gangs of 8 GPUs; a gang
// of priority 1000 and 8 GPUs comes. Within one cycle the younger low-priority gang (or, when
// it is protected, the other one; when both are, none) is evicted whole, with Preempted
// Events, and the new gang binds once its pods are gone.
func TestPriorityPreemptionWithinQueue(t *testing.T) {
	for _, tc := range []struct {
		name            string
		older, younger  []func(*v1alpha1.PodGroup)
		classLabel      bool // the younger gang's pods use a PriorityClass labelled non-preemptible
		never           bool // the new gang's pods have preemptionPolicy Never
		wantEvicted     map[string]int
		wantHighBinding bool
	}{
		{name: "youngest whole gang", wantEvicted: map[string]int{"lo2": 8}, wantHighBinding: true},
		{name: "non-preemptible younger gang is never chosen", younger: []func(*v1alpha1.PodGroup){notPreemptible}, wantEvicted: map[string]int{"lo1": 8}, wantHighBinding: true},
		{name: "non-preemptible by PriorityClass label", classLabel: true, wantEvicted: map[string]int{"lo1": 8}, wantHighBinding: true},
		{name: "both protected", older: []func(*v1alpha1.PodGroup){notPreemptible}, younger: []func(*v1alpha1.PodGroup){notPreemptible}, wantEvicted: map[string]int{}},
		{name: "preemptionPolicy Never", never: true, wantEvicted: map[string]int{}},
		{name: "equal priority is no victim", older: []func(*v1alpha1.PodGroup){priority(1000)}, younger: []func(*v1alpha1.PodGroup){priority(1000)}, wantEvicted: map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			s.node("a", 8)
			s.node("b", 8)
			s.queue("q", "", "16", "", 1)
			s.gang("lo1", "q", 8, 1, tc.older...)
			s.gang("lo2", "q", 8, 1, tc.younger...)
			classes := map[string]*schedulingv1.PriorityClass{
				"protected": {ObjectMeta: metav1.ObjectMeta{Name: "protected", Labels: map[string]string{v1alpha1.PreemptibleLabel: "false"}}},
			}
			if tc.classLabel {
				for k, p := range s.pods {
					if p.Annotations[v1alpha1.PodGroupAnnotation] == "lo2" {
						p.Spec.PriorityClassName = "protected"
						s.pods[k] = p
					}
				}
			}
			s.cycle(time.Second)
			if boundPods(s, "lo1") != 8 || boundPods(s, "lo2") != 8 {
				t.Fatalf("setup: lo1 %d, lo2 %d bound, want 8 each", boundPods(s, "lo1"), boundPods(s, "lo2"))
			}
			s.gang("hi", "q", 8, 1, priority(1000))
			if tc.never {
				for k, p := range s.pods {
					if p.Annotations[v1alpha1.PodGroupAnnotation] == "hi" {
						p.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever)
						s.pods[k] = p
					}
				}
			}
			in := s.input()
			in.PriorityClasses = classes
			d := Decide(s.ctx, s.cfg, in, s.mem)
			got := evictedGangs(d)
			if len(got) != len(tc.wantEvicted) {
				t.Fatalf("evicted %v, want %v", got, tc.wantEvicted)
			}
			for g, n := range tc.wantEvicted {
				if got[g] != n {
					t.Fatalf("evicted %v, want %v", got, tc.wantEvicted)
				}
			}
			if len(got) > 0 {
				if r := eventReasons(d); !strings.Contains(r, ReasonPreempted) || !strings.Contains(r, ReasonPreempting) {
					t.Errorf("events %s lack Preempted/Preempting", r)
				}
				if d.VictimSetsSimulated == 0 {
					t.Error("no victim set counted as simulated")
				}
			}
			for _, p := range d.Evictions {
				s.remove(p.Name)
			}
			// The cycle after: the new gang binds on the freed GPUs (or keeps waiting).
			s.cycle(time.Second)
			s.cycle(time.Second)
			if bound := boundPods(s, "hi"); (bound == 8) != tc.wantHighBinding {
				t.Fatalf("hi has %d pods bound, want binding %v", bound, tc.wantHighBinding)
			}
		})
	}
}

// Preemption disturbs as little as it can: the pods above minMember of an elastic victim go
// first, and of two younger gangs the one that suffices alone is chosen, not both.
func TestPreemptionTakesElasticExtrasFirst(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.node("b", 8)
	s.queue("q", "", "16", "", 1)
	s.gang("core", "q", 8, 1)
	s.gang("elastic", "q", 8, 1, minMember(4))
	s.cycle(time.Second)
	if boundPods(s, "elastic") != 8 {
		t.Fatalf("setup: elastic has %d bound, want 8", boundPods(s, "elastic"))
	}
	s.gang("hi", "q", 4, 1, priority(10))
	d := s.cycle(time.Second)
	if got := evictedGangs(d); len(got) != 1 || got["elastic"] != 4 {
		t.Fatalf("evicted %v, want the 4 pods of elastic above its minMember", got)
	}
	s.cycle(time.Second)
	if boundPods(s, "hi") != 4 || boundPods(s, "elastic") != 4 || boundPods(s, "core") != 8 {
		t.Fatalf("after preemption: hi %d, elastic %d, core %d bound; want 4, 4, 8", boundPods(s, "hi"), boundPods(s, "elastic"), boundPods(s, "core"))
	}
}

// The upstream PodGroup's disruptionMode: "all" makes the elastic gang one victim (its pods
// above minMember are not evicted apart from its core: the whole gang goes), "single" (the
// default) lets them go first as for a gang without an upstream PodGroup. The gang is also
// not movable by consolidation (TestConsolidationSkipsDisruptedTogether).
func TestUpstreamDisruptionMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode *schedulingv1beta1.DisruptionMode
		want int
	}{
		{name: "single", mode: &schedulingv1beta1.DisruptionMode{Single: &schedulingv1beta1.SingleDisruptionMode{}}, want: 4},
		{name: "unset", want: 4},
		{name: "all", mode: &schedulingv1beta1.DisruptionMode{All: &schedulingv1beta1.AllDisruptionMode{}}, want: 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			s.node("a", 8)
			s.node("b", 8)
			s.queue("q", "", "16", "", 1)
			s.gang("core", "q", 8, 1)
			s.gang("elastic", "q", 8, 1, minMember(4))
			s.upstream = map[string]*schedulingv1beta1.PodGroup{"ns/elastic": {
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "elastic"},
				Spec:       schedulingv1beta1.PodGroupSpec{DisruptionMode: tc.mode},
			}}
			s.cycle(time.Second)
			if boundPods(s, "elastic") != 8 {
				t.Fatalf("setup: elastic has %d bound, want 8", boundPods(s, "elastic"))
			}
			s.gang("hi", "q", 4, 1, priority(10))
			d := s.cycle(time.Second)
			if got := evictedGangs(d); len(got) != 1 || got["elastic"] != tc.want {
				t.Fatalf("evicted %v, want %d pods of elastic", got, tc.want)
			}
			s.cycle(time.Second)
			if boundPods(s, "hi") != 4 || boundPods(s, "core") != 8 {
				t.Fatalf("after preemption: hi %d, core %d bound; want 4, 8", boundPods(s, "hi"), boundPods(s, "core"))
			}
		})
	}
}

// A non-preemptible gang runs only within its queue's quota: with idle GPUs beyond the quota
// it waits, where a preemptible gang of the same shape borrows them.
func TestNonPreemptibleGangStaysWithinQuota(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mutate    []func(*v1alpha1.PodGroup)
		wantBound int
	}{
		{name: "preemptible borrows", wantBound: 16},
		{name: "non-preemptible waits", mutate: []func(*v1alpha1.PodGroup){notPreemptible}, wantBound: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			s.node("a", 8)
			s.node("b", 8)
			s.queue("q", "", "8", "", 1)
			s.gang("g", "q", 16, 1, tc.mutate...)
			d := s.cycle(time.Second)
			if got := boundPods(s, "g"); got != tc.wantBound {
				t.Fatalf("%d pods bound, want %d (%v)", got, tc.wantBound, d.Outcomes["ns/g"])
			}
			if tc.wantBound == 0 && (d.Outcomes["ns/g"].Reason != v1alpha1.ReasonQuotaExceeded || !strings.Contains(d.Outcomes["ns/g"].Message, "non-preemptible")) {
				t.Fatalf("outcome %v, want QuotaExceeded naming the non-preemptible gang", d.Outcomes["ns/g"])
			}
		})
	}
}

// An elastic gang (minMember 4, 8 pods) on 6 free GPUs places 6 pods, not all-or-minimum,
// and grows to 8 when capacity comes back.
func TestElasticGangPlacesAsManyAsFit(t *testing.T) {
	s := newSim(t)
	s.node("a", 4)
	s.node("b", 4)
	s.queue("q", "", "8", "", 1)
	s.gang("other", "q", 2, 1)
	s.cycle(time.Second)
	s.gang("e", "q", 8, 1, minMember(4))
	s.cycle(time.Second)
	if got := boundPods(s, "e"); got != 6 {
		t.Fatalf("elastic gang has %d pods bound, want the 6 that fit", got)
	}
	s.finish("other")
	s.cycle(time.Second)
	if got := boundPods(s, "e"); got != 8 {
		t.Fatalf("after capacity came back the elastic gang has %d pods bound, want 8", got)
	}
}

// The hierarchical reclaim: siblings A and B under P (quota 0 each, weight 1:1) on 32
// GPUs. A holds all 32 in 4-GPU gangs (and its workloads recreate evicted pods, so it keeps
// wanting 32); B submits 16 GPUs of demand. Within a few cycles B reaches its fair share of
// 16 (±4) by eviction of A's newest whole gangs, and it then stays there: A is never taken
// below its own fair share.
func TestReclaimToFairShareBetweenSiblings(t *testing.T) {
	s := newSim(t)
	for i := range 4 {
		s.node(string(rune('a'+i)), 8)
	}
	s.queue("p", "", "", "", 1)
	s.queue("qa", "p", "0", "", 1)
	s.queue("qb", "p", "0", "", 1)
	for i := range 8 {
		s.gang("a"+string(rune('0'+i)), "qa", 4, 1)
	}
	s.cycle(time.Second)
	if got := s.boundGPUs()["qa"]; got != 32 {
		t.Fatalf("setup: qa holds %d GPUs, want 32", got)
	}
	for i := range 4 {
		s.gang("b"+string(rune('0'+i)), "qb", 4, 1)
	}
	evictedOf := map[string]bool{}
	var history []map[string]int64
	for range 12 {
		d := s.cycle(time.Second)
		for _, p := range d.Evictions {
			group := p.Annotations[v1alpha1.PodGroupAnnotation]
			evictedOf[group] = true
			// The workload recreates the pod (a new UID): qa keeps its demand.
			s.pod(group, p.Name, 1)
			np := s.pods["ns/"+p.Name]
			np.UID = np.UID + "-again"
		}
		history = append(history, s.boundGPUs())
	}
	got := s.boundGPUs()
	t.Logf("allocation per cycle: %v", history)
	if got["qb"] < 12 || got["qb"] > 20 || got["qa"] < 12 {
		t.Fatalf("after reclaim: %v (history %v), want qb at 16±4 and qa at its share", got, history)
	}
	// Whole gangs, the newest first: a7 and a6 (then, at most, a5) went; a0..a3 never.
	for _, g := range []string{"a0", "a1", "a2", "a3"} {
		if evictedOf[g] {
			t.Errorf("old gang %s evicted (evicted: %v)", g, evictedOf)
		}
	}
	if !evictedOf["a7"] || !evictedOf["a6"] {
		t.Errorf("the newest gangs a7 and a6 were not the ones evicted: %v", evictedOf)
	}
	// Stable: the last cycles evicted nothing more.
	if last := history[len(history)-1]; last["qb"] != history[len(history)-3]["qb"] {
		t.Errorf("still moving at the end: %v", history)
	}
}

// Waiting gangs know where they stand: in their queue by priority then age, and overall;
// a placed gang has no position.
func TestQueuePositions(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.queue("q", "", "8", "", 1)
	s.queue("r", "", "0", "", 1)
	s.gang("run", "q", 8, 1, priority(10)) // above the waiting gangs: no preemption
	s.cycle(time.Second)
	s.gang("w1", "q", 8, 1)
	s.gang("w2", "q", 8, 1, priority(5))
	s.gang("w3", "q", 8, 1)
	s.gang("r1", "r", 8, 1)
	s.cycle(time.Second)
	s.cycle(time.Second)
	if p := s.pgs["ns/run"].Status.QueuePosition; p != nil {
		t.Errorf("placed gang has position %+v", p)
	}
	overall := map[int32]string{}
	for g, want := range map[string]int32{"w2": 1, "w1": 2, "w3": 3, "r1": 1} {
		p := s.pgs["ns/"+g].Status.QueuePosition
		if p == nil || p.InQueue != want {
			t.Fatalf("%s: position %+v, want %d in its queue", g, p, want)
		}
		overall[p.Overall] = g
	}
	if len(overall) != 4 {
		t.Fatalf("overall positions %v are not 1..4", overall)
	}
	var order []string
	for i := int32(1); i <= 4; i++ {
		if g := overall[i]; g != "r1" {
			order = append(order, g)
		}
	}
	if strings.Join(order, ",") != "w2,w1,w3" {
		t.Fatalf("overall order of q's gangs %v, want w2,w1,w3", order)
	}
}

// A non-preemptible high-priority gang that would have to borrow evicts nobody: after the
// eviction it still could not run (it runs only within quota).
func TestNonPreemptibleGangDoesNotPreemptToBorrow(t *testing.T) {
	s := newSim(t)
	s.node("a", 8)
	s.node("b", 8)
	s.queue("q", "", "8", "", 1)
	s.gang("lo", "q", 16, 1)
	s.cycle(time.Second)
	if boundPods(s, "lo") != 16 {
		t.Fatalf("setup: lo has %d bound, want 16 (borrowing)", boundPods(s, "lo"))
	}
	s.gang("hi", "q", 16, 1, priority(100), notPreemptible)
	d := s.cycle(time.Second)
	if len(d.Evictions) != 0 {
		t.Fatalf("evicted %v for a gang that may not borrow", evictedGangs(d))
	}
}

// The elastic case under reclaim: an elastic gang (min 4 of 8) placed 6 pods on the 6
// free GPUs; when another queue reclaims its quota, the 2 pods above minMember go, not core
// pods; once capacity returns the gang grows back to 8.
func TestReclaimTakesElasticExtrasFirstAndTheGangGrowsBack(t *testing.T) {
	s := newSim(t)
	for i := range 8 {
		s.node(fmt.Sprintf("n%d", i), 1)
	}
	s.queue("qe", "", "4", "", 1)
	s.queue("qo", "", "4", "", 1)
	s.gang("o1", "qo", 2, 1)
	s.cycle(time.Second)
	s.gang("e", "qe", 8, 1, minMember(4))
	s.cycle(time.Second)
	if got := boundPods(s, "e"); got != 6 {
		t.Fatalf("elastic gang has %d pods bound, want 6", got)
	}
	s.gang("o2", "qo", 2, 1)
	d := s.cycle(time.Second)
	if got := evictedGangs(d); len(got) != 1 || got["e"] != 2 {
		t.Fatalf("evicted %v, want the 2 pods of e above its minMember", got)
	}
	for _, p := range d.Evictions { // the workload recreates them
		s.pod("e", p.Name, 1)
		np := s.pods["ns/"+p.Name]
		np.UID += "-again"
	}
	s.cycle(time.Second)
	if boundPods(s, "o2") != 2 || boundPods(s, "e") != 4 {
		t.Fatalf("after reclaim: o2 %d, e %d bound; want 2 and 4", boundPods(s, "o2"), boundPods(s, "e"))
	}
	s.finish("o1")
	s.finish("o2")
	s.cycle(time.Second)
	if got := boundPods(s, "e"); got != 8 {
		t.Fatalf("after capacity came back e has %d pods bound, want 8", got)
	}
}
