package scheduler

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

func TestRelevantUpdate(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	heartbeat := node.DeepCopy()
	heartbeat.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []v1.Taint{{Key: "x", Effect: v1.TaintEffectNoSchedule}}
	pod := &v1.Pod{}
	ready := pod.DeepCopy()
	ready.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
	done := pod.DeepCopy()
	done.Status.Phase = v1.PodSucceeded
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	pgStatus := pg.DeepCopy()
	pgStatus.Status.Phase = v1alpha1.PodGroupPending
	pgSpec := pg.DeepCopy()
	pgSpec.Generation = 2
	claim := &resourceapi.ResourceClaim{}
	allocated := claim.DeepCopy()
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	for name, tc := range map[string]struct {
		old, cur any
		want     bool
	}{
		"node heartbeat":         {node, heartbeat, false},
		"node taint":             {node, tainted, true},
		"pod ready condition":    {pod, ready, false},
		"pod finished":           {pod, done, true},
		"own PodGroup status":    {pg, pgStatus, false},
		"PodGroup spec":          {pg, pgSpec, true},
		"claim allocated":        {claim, allocated, true},
		"claim unchanged status": {claim, claim.DeepCopy(), false},
	} {
		if got := relevantUpdate(tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: relevant = %v, want %v", name, got, tc.want)
		}
	}
	if !updateFreesCapacity(pod, done) || updateFreesCapacity(claim, allocated) || !updateFreesCapacity(allocated, claim) {
		t.Error("capacity: a finished pod and a deallocated claim free capacity, an allocation does not")
	}
}

// TestCycleWait: after an event the loop waits for the burst to settle (10 ms, or the
// interval when that is shorter) and keeps cycle starts minInterval apart; a long cycle adds
// no wait beyond the settle time.
func TestCycleWait(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		sinceStart, minInterval, want time.Duration
	}{
		{sinceStart: 2 * ms, minInterval: 50 * ms, want: 48 * ms},   // the interval
		{sinceStart: 45 * ms, minInterval: 50 * ms, want: 10 * ms},  // the settle time
		{sinceStart: 800 * ms, minInterval: 50 * ms, want: 10 * ms}, // after a long cycle, or idle
		{sinceStart: 2 * ms, minInterval: 5 * ms, want: 5 * ms},     // a short interval settles for as long
		{sinceStart: 1 * ms, minInterval: 20 * ms, want: 19 * ms},
		{sinceStart: 15 * ms, minInterval: 20 * ms, want: 10 * ms},
	} {
		if got := cycleWait(tc.sinceStart, tc.minInterval); got != tc.want {
			t.Errorf("cycleWait(since %s, interval %s) = %s, want %s", tc.sinceStart, tc.minInterval, got, tc.want)
		}
	}
}
