package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
)

// TestReservationSurvivesRestart is decide's TestFreedCapacityIsReservedForTheGang
// ("preemption, restarted scheduler") on the real API server: queue q (quota 16) is full with
// two priority-0 gangs of 8 GPUs on two nodes; a priority-1000 gang preempts the younger one.
// While the victim's pods are still terminating (nothing reaps them yet) the scheduler is
// stopped, so the reservation exists only in the PodGroup's status. A new scheduler starts,
// a 4-GPU gang of a queue that ranks first arrives, and then the victim's pods go away: the
// freed node goes to the gang it was freed for, not to the small gang, and the new scheduler
// evicts no second victim for the same capacity.
func TestReservationSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	e.addNode("b", 8, false, nil)
	q := e.addQueue("q", "", "16", "", 1)
	stopFirst := e.startScheduler(defaultOptions())
	lo1 := e.gang("lo1", q, 8, gpuClaim)
	e.waitBound(lo1, 60*time.Second)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of one second
	lo2 := e.gang("lo2", q, 8, gpuClaim)
	e.waitBound(lo2, 60*time.Second)
	e.markRunning()
	waitQueueGPU(t, e, q, "16")

	hi := e.gang("hi", q, 8, gpuClaim, func(pg *v1alpha1.PodGroup) { pg.Spec.Priority = 1000 })
	var reserved *v1alpha1.Reservation
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pg, err := e.sc.PodGroups(e.ns).Get(ctx, "hi")
		if err != nil {
			return false, nil
		}
		reserved = pg.Status.Reservation
		return reserved != nil, nil
	}); err != nil {
		t.Fatalf("hi's status.reservation never written: %v", err)
	}
	if reserved.Reason != decide.ReasonPreempting || len(reserved.Nodes) != 1 {
		t.Fatalf("hi's reservation %+v, want one node for %s", reserved, decide.ReasonPreempting)
	}
	freed := reserved.Nodes[0]
	// The evictions are written after the status: wait until every victim pod is terminating.
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		all := e.pods()
		for _, p := range lo2 {
			cur := all[p.Name]
			if cur == nil || cur.Spec.NodeName != freed {
				return false, fmt.Errorf("lo2's pod %s gone or not on the reserved node %s", p.Name, freed)
			}
			if cur.DeletionTimestamp == nil {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("lo2's pods not all terminating on %s: %v", freed, err)
	}
	stopFirst()

	// A new leader: its memory is empty; the reservation is only in hi's status.
	e.startScheduler(defaultOptions())
	first := e.addQueue("first", "", "8", "", 1)
	small := e.gang("small", first, 4, gpuClaim)
	time.Sleep(2 * time.Second) // a few cycles of the new scheduler while the victim goes away
	e.reapTerminating()
	e.waitBound(hi, 60*time.Second)
	all := e.pods()
	for _, p := range hi {
		if n := all[p.Name].Spec.NodeName; n != freed {
			t.Errorf("hi's pod %s on %s, want the node freed for it (%s)", p.Name, n, freed)
		}
	}
	for _, p := range lo1 {
		if cur := all[p.Name]; cur == nil || cur.DeletionTimestamp != nil {
			t.Errorf("lo1's pod %s was evicted: the new scheduler chose a second victim", p.Name)
		}
	}
	if n := e.boundCount(small); n != 0 {
		t.Errorf("small has %d pods bound, want 0 (the cluster is full)", n)
	}
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pg, err := e.sc.PodGroups(e.ns).Get(ctx, "hi")
		return err == nil && pg.Status.Reservation == nil, nil
	}); err != nil {
		t.Errorf("placed gang hi still shows a reservation: %v", err)
	}
	e.checkClaims()
}
