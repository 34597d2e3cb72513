package solver

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// TestUnchangedInputIsNotSearchedAgain: a gang that failed on a snapshot of an input epoch is
// answered without a search, with the same message, on a new snapshot of the same epoch; a
// new epoch, a snapshot the caller did not name (a what-if), a changed gang, or a snapshot on
// which a gang was placed this cycle search again.
func TestUnchangedInputIsNotSearchedAgain(t *testing.T) {
	var c cluster
	c.node("a", 8, false, nil)
	c.node("b", 8, true, nil)
	c.use("a", 3)
	s := newSolver(t, Config{})
	ctx := context.Background()
	big := gpuGang("big", 14)
	want := s.Stats()
	solve := func(ctx context.Context, snap *snapshot.Snapshot, g *Gang, searched bool) error {
		t.Helper()
		_, err := s.Solve(ctx, snap, g)
		if searched {
			want.Searches++
		} else {
			want.Unchanged++
		}
		if got := s.Stats(); got != want {
			t.Fatalf("stats %+v, want %+v", got, want)
		}
		return err
	}

	snap1 := c.snapshot()
	err1 := solve(WithInput(ctx, snap1, 1), snap1, big, true)
	if !IsUnschedulable(err1) {
		t.Fatalf("the gang of 14 fits on 13 free GPUs: %v", err1)
	}
	// The next cycle: a new snapshot of the same objects.
	snap2 := c.snapshot()
	if err := solve(WithInput(ctx, snap2, 1), snap2, big, false); err == nil || err.Error() != err1.Error() {
		t.Fatalf("answer from the memo %v, want %v", err, err1)
	}
	// No input named, or another snapshot than the one named (decide's what-if snapshots).
	solve(ctx, snap2, big, true)
	solve(WithInput(ctx, snap2, 1), c.snapshot(), big, true)
	// The gang changed: a pod's new resourceVersion.
	changed := gpuGang("big", 14)
	changed.Pods[3].Pod.ResourceVersion = "2"
	solve(WithInput(ctx, snap2, 1), snap2, changed, true)
	solve(WithInput(ctx, snap2, 1), snap2, changed, false)
	// A new status (the PodScheduled condition the scheduler writes: a new resourceVersion,
	// the same generation) is no change; a new generation (the spec changed) is.
	gen := gpuGang("gen", 14)
	for _, p := range gen.Pods {
		p.Pod.Generation, p.Pod.ResourceVersion = 1, "1"
	}
	solve(WithInput(ctx, snap2, 1), snap2, gen, true)
	gen.Pods[0].Pod.ResourceVersion = "9"
	gen.Pods[0].Pod.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse}}
	solve(WithInput(ctx, snap2, 1), snap2, gen, false)
	gen.Pods[0].Pod.Generation = 2
	solve(WithInput(ctx, snap2, 1), snap2, gen, true)
	// A new epoch: everything is searched again.
	snap3 := c.snapshot()
	solve(WithInput(ctx, snap3, 2), snap3, big, true)
	solve(WithInput(ctx, snap3, 2), snap3, big, false)

	// A gang placed on the snapshot (and assumed in it by the caller): later failures on it
	// are searched and not kept; the next snapshot of the epoch starts clean.
	snap4 := c.snapshot()
	in4 := WithInput(ctx, snap4, 3)
	if err := solve(in4, snap4, gpuGang("small", 2), true); err != nil {
		t.Fatal(err)
	}
	solve(in4, snap4, big, true)
	solve(in4, snap4, big, true)
	snap5 := c.snapshot()
	solve(WithInput(ctx, snap5, 3), snap5, big, true)
	solve(WithInput(ctx, snap5, 3), snap5, big, false)
}

// TestWallClockFailureIsSearchedAgain: a search the wall-clock guard cut short may get
// further next time, so it is not kept.
func TestWallClockFailureIsSearchedAgain(t *testing.T) {
	var c cluster
	for _, n := range []string{"a", "b", "c", "d"} {
		c.node(n, 8, false, nil)
		c.use(n, 1)
	}
	s := newSolver(t, Config{WallClockGuard: 1})
	snap := c.snapshot()
	ctx := WithInput(context.Background(), snap, 1)
	for i := 0; i < 2; i++ {
		_, err := s.Solve(ctx, snap, gpuGang("big", 30))
		var u *Unschedulable
		if !asUnschedulable(err, &u) || !u.WallClock {
			t.Fatalf("want a wall-clock abort, got %v", err)
		}
	}
	if st := s.Stats(); st.Searches != 2 || st.Unchanged != 0 {
		t.Fatalf("stats %+v: a wall-clock abort was kept", st)
	}
}
