package scheduler_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/scheduler"
	"github.com/tessera-gpu/tessera/controlplane/solver"
	"github.com/tessera-gpu/tessera/test/framework"
)

// idle lets n cycles pass and returns the solver's counters before and after.
func idle(t *testing.T, s *scheduler.Scheduler, n uint64, timeout time.Duration) (before, after solver.Stats) {
	t.Helper()
	before = s.SolverStats()
	start, deadline := s.Cycles(), time.Now().Add(timeout)
	for s.Cycles() < start+n {
		if time.Now().After(deadline) {
			t.Fatalf("%d cycles did not run in %s", n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return before, s.SolverStats()
}

func unschedulable(c metav1.Condition) bool { return c.Reason == v1alpha1.ReasonUnschedulable }

// deletePodsAtEnd deletes the test's pods when it ends, so that its waiting gangs do not stay
// in the shared control plane for the schedulers of later tests.
func deletePodsAtEnd(e *env) {
	e.t.Cleanup(func() {
		_ = e.kube.CoreV1().Pods(e.ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{})
	})
}

// TestWaitingGangIsNotSearchedWhileNothingChanges: a gang that does not fit is not searched
// again in idle cycles (decide asks, the solver answers from its last failure), its reason
// stays; it is searched again, and placed, right after a claim is released (pods finish) and
// right after a node joins — long before the safety-net retry (an hour here).
//
// Its own control plane: in the shared one, what earlier tests left (gangs still waiting or
// placed late, their status writes) changes the input, and the gang is rightly searched again.
func TestWaitingGangIsNotSearchedWhileNothingChanges(t *testing.T) {
	cp := framework.StartForTest(t, framework.Options{Controllers: framework.DefaultControllers})
	e := newEnvOn(t, cp)
	deletePodsAtEnd(e)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	opts := defaultOptions()
	opts.UnfitRetry = time.Hour
	s, _ := e.startSchedulerInstance(opts)
	running := e.gang("run", q, 4, gpuClaim)
	e.waitBound(running, 60*time.Second)
	e.markRunning()

	big := e.gang("big", q, 6, gpuClaim)
	c := e.waitCondition("big", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, unschedulable)
	// The scheduler writes the waiting pods' PodScheduled conditions after the first search
	// (new pod versions: the next search runs). Then idle for 20 cycles (4 s): decide's
	// backoff asks again after 1, 2 and 4 s.
	idle(t, s, 8, 30*time.Second)
	before, after := idle(t, s, 20, 30*time.Second)
	if after.Searches != before.Searches {
		t.Errorf("a waiting gang was searched %d times in idle cycles", after.Searches-before.Searches)
	}
	if after.Unchanged <= before.Unchanged {
		t.Errorf("decide did not ask for the waiting gang in 20 idle cycles (%+v → %+v): the test shows nothing", before, after)
	}
	pg, err := e.sc.PodGroups(e.ns).Get(e.ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range pg.Status.Conditions {
		if cond.Type == v1alpha1.PodGroupConditionScheduled && (cond.Reason != c.Reason || cond.Message != c.Message) {
			t.Errorf("the reason changed while nothing changed: %q → %q", c.Message, cond.Message)
		}
	}
	if n := e.boundCount(big); n != 0 {
		t.Fatalf("%d pods of the waiting gang bound", n)
	}

	// Capacity comes back: the running gang's pods finish and their claims are released.
	e.finish(running)
	e.waitBound(big, 30*time.Second)
	e.markRunning()

	// A gang larger than what is left waits; a node joins and it is placed.
	huge := e.gang("huge", q, 9, gpuClaim)
	e.waitCondition("huge", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, unschedulable)
	idle(t, s, 8, 30*time.Second)
	before, after = idle(t, s, 10, 30*time.Second)
	if after.Searches != before.Searches {
		t.Errorf("the waiting gang was searched %d times in idle cycles", after.Searches-before.Searches)
	}
	e.addNode("b", 8, false, nil)
	e.waitBound(huge, 30*time.Second)
	e.checkClaims()
}

// TestWaitingGangIsSearchedAgainAfterUnfitRetry: with nothing changed, the safety net still
// searches a waiting gang again every UnfitRetry.
func TestWaitingGangIsSearchedAgainAfterUnfitRetry(t *testing.T) {
	e := newEnv(t)
	deletePodsAtEnd(e)
	e.addNode("a", 2, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	opts := defaultOptions()
	opts.UnfitRetry = 500 * time.Millisecond
	s, _ := e.startSchedulerInstance(opts)
	pods := e.gang("big", q, 3, gpuClaim)
	e.waitCondition("big", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, unschedulable)
	// 40 cycles (8 s): decide asks at least twice more (its backoff doubles up to 10 s), each
	// more than UnfitRetry apart.
	before, after := idle(t, s, 40, 60*time.Second)
	if after.Searches < before.Searches+2 {
		t.Errorf("searches %d → %d in 8 s with UnfitRetry 500ms", before.Searches, after.Searches)
	}
	if n := e.boundCount(pods); n != 0 {
		t.Fatalf("%d pods bound", n)
	}
}
