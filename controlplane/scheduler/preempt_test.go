package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
)

// TestPriorityPreemptsYoungestPreemptibleGang: queue q (quota 24) is full with three
// priority-0 gangs of 8 GPUs, the youngest non-preemptible. A priority-1000 gang of 8 GPUs
// comes: the youngest preemptible gang is evicted whole (Preempted Event), the protected one
// and the oldest keep running, and the new gang binds.
func TestPriorityPreemptsYoungestPreemptibleGang(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	e.addNode("b", 8, false, nil)
	e.addNode("c", 8, false, nil)
	q := e.addQueue("q", "", "24", "", 1)
	e.reapTerminating()
	e.startScheduler(defaultOptions())
	var low [][]string
	for _, g := range []struct {
		name        string
		preemptible bool
	}{{"lo1", true}, {"lo2", true}, {"lo3", false}} {
		pods := e.gang(g.name, q, 8, gpuClaim, func(pg *v1alpha1.PodGroup) { pg.Spec.Preemptible = ptr.To(g.preemptible) })
		e.waitBound(pods, 60*time.Second)
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		low = append(low, names)
		time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of one second
	}
	e.markRunning()
	waitQueueGPU(t, e, q, "24")

	before := victimSetsSimulated(t, decide.RulePreemption)
	hi := e.gang("hi", q, 8, gpuClaim, func(pg *v1alpha1.PodGroup) { pg.Spec.Priority = 1000 })
	e.waitBound(hi, 60*time.Second)
	if after := victimSetsSimulated(t, decide.RulePreemption); after < before+1 {
		t.Errorf("tessera_scheduler_victim_sets_simulated_total{rule=preemption} went from %v to %v, want at least one set more", before, after)
	}
	all := e.pods()
	for i, want := range []bool{true, false, true} {
		for _, name := range low[i] {
			if alive := all[name] != nil && all[name].Spec.NodeName != ""; alive != want {
				t.Fatalf("pod %s of gang lo%d alive=%v, want %v", name, i+1, alive, want)
			}
		}
	}
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PodGroup,involvedObject.name=lo2,reason=" + decide.ReasonPreempted})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no Preempted event on lo2 (err %v)", err)
	}
	e.checkClaims()
}

// TestReclaimToFairShareBetweenSiblings: queues A and B under P (quota 0 each, weight 1:1) on
// 32 GPUs. A holds all 32 in 4-GPU gangs; B submits 16 GPUs of demand in 4-GPU gangs: B gets
// its fair share of 16 by eviction of A's newest whole gangs (Reclaimed Events), one reclaim at
// a time; A's oldest gangs keep running.
func TestReclaimToFairShareBetweenSiblings(t *testing.T) {
	e := newEnv(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		e.addNode(n, 8, false, nil)
	}
	e.addQueue("p", "", "", "", 1)
	qa := e.addQueue("qa", "p", "0", "", 1) // addQueue prefixes the parent's name
	qb := e.addQueue("qb", "p", "0", "", 1)
	e.reapTerminating()
	e.startScheduler(defaultOptions())
	var a [][]*v1.Pod
	for i := range 8 {
		a = append(a, e.gang(fmt.Sprintf("a%d", i), qa, 4, gpuClaim))
	}
	for _, pods := range a {
		e.waitBound(pods, 60*time.Second)
	}
	e.markRunning()
	waitQueueGPU(t, e, qa, "32")
	before := victimSetsSimulated(t, decide.RuleReclaim)
	var b []*v1.Pod
	for i := range 4 {
		b = append(b, e.gang(fmt.Sprintf("b%d", i), qb, 4, gpuClaim)...)
	}
	e.waitBound(b, 120*time.Second)
	all := e.pods()
	for i := range 4 {
		for _, pod := range a[i] {
			if all[pod.Name] == nil || all[pod.Name].Spec.NodeName == "" {
				t.Fatalf("pod %s of A's old gang a%d was evicted", pod.Name, i)
			}
		}
	}
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PodGroup,involvedObject.name=a7,reason=" + decide.ReasonReclaimed})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no Reclaimed event on A's newest gang a7 (err %v)", err)
	}
	waitQueueGPU(t, e, qb, "16")
	if after := victimSetsSimulated(t, decide.RuleReclaim); after < before+4 {
		t.Errorf("tessera_scheduler_victim_sets_simulated_total{rule=reclaim} went from %v to %v, want at least four sets more (one per evicted gang)", before, after)
	}
	e.checkClaims()
}

// victimSetsSimulated reads the scheduler's victim-set counter of rule from the registry
// the scheduler serves.
func victimSetsSimulated(t *testing.T, rule string) float64 {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tessera_scheduler_victim_sets_simulated_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" && l.GetValue() == rule {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
