package scheduler_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	hi := e.gang("hi", q, 8, gpuClaim, func(pg *v1alpha1.PodGroup) { pg.Spec.Priority = 1000 })
	e.waitBound(hi, 60*time.Second)
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
