package solver

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// TestRunAheadOneCallPerNodeForIdenticalPods: a gang of 32 one-GPU pods on four empty 8-GPU
// nodes takes two allocator calls per node with run-ahead (the first pod's own, then the
// other seven together) instead of one per pod, and lands on the same nodes.
func TestRunAheadOneCallPerNodeForIdenticalPods(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, partitionable := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitionable=%v", partitionable), func(t *testing.T) {
			c := &cluster{}
			for n := range 4 {
				c.node(fmt.Sprintf("n%d", n), 8, partitionable, nil)
			}
			snap := c.snapshot()
			on, err := newSolver(t, Config{}).Solve(ctx, snap, gpuGang("g", 32))
			if err != nil {
				t.Fatalf("Solve: %v", err)
			}
			off, err := newSolver(t, Config{NoRunAhead: true}).Solve(ctx, snap, gpuGang("g", 32))
			if err != nil {
				t.Fatalf("Solve without run-ahead: %v", err)
			}
			// Both also count the tries on nodes already full (answered by the count check)
			// and, on whole GPUs, preferPlainGPUs' probe. Per node, run-ahead makes two calls
			// where each pod made one: 6 fewer per node.
			if on.RunAhead != 28 || off.RunAhead != 0 {
				t.Errorf("pods from run-ahead: %d with it, %d without; want 28 and 0", on.RunAhead, off.RunAhead)
			}
			if saved := off.AllocatorCalls - on.AllocatorCalls; saved != 24 {
				t.Errorf("allocator calls: %d with run-ahead, %d without; want 24 fewer with it", on.AllocatorCalls, off.AllocatorCalls)
			}
			if a, b := assignment(on), assignment(off); a != b {
				t.Errorf("placements differ:\nwith run-ahead    %s\nwithout run-ahead %s", a, b)
			}
			checkValid(t, snap, c.in, on)
		})
	}
}

// TestRunAheadAgreesWithOwnCalls compares the solver with and without run-ahead on random
// clusters (whole and partitionable GPUs, some in use) and gangs of mixed shapes (one or two
// whole GPUs, MIG profiles, prioritized lists), many of whose searches backtrack: both must
// agree on whether the gang fits and on every pod's node, and every placement run-ahead
// makes must be valid: no device twice, no counter set overdrawn.
func TestRunAheadAgreesWithOwnCalls(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	rng := rand.New(rand.NewSource(20261201))
	on, off := newSolver(t, Config{}), newSolver(t, Config{NoRunAhead: true})
	profiles := []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}
	fit, nofit, used := 0, 0, 0
	callsOn, callsOff := 0, 0
	for iter := range 300 {
		c := &cluster{}
		for n := range 1 + rng.Intn(4) {
			name := fmt.Sprintf("n%d", n)
			c.node(name, 2+rng.Intn(7), rng.Intn(2) == 0, nil)
			if rng.Intn(3) == 0 {
				c.use(name, 1+rng.Intn(2))
			}
		}
		snap := c.snapshot()
		g := &Gang{Name: fmt.Sprintf("ns/g%d", iter)}
		for p := range 2 + rng.Intn(12) {
			name := fmt.Sprintf("g%d-p%d", iter, p)
			var claim *resourceapi.ResourceClaim
			switch rng.Intn(6) {
			case 0, 1, 2:
				claim = fixture.GPUClaim("ns", name, 1)
			case 3:
				claim = fixture.GPUClaim("ns", name, 2)
			case 4:
				claim = fixture.MIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
			default:
				claim = fixture.GPUOrMIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
			}
			g.Pods = append(g.Pods, Pod{Pod: fixture.Pod("ns", name, claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
		}
		a, errA := on.Solve(ctx, snap, g)
		b, errB := off.Solve(ctx, snap, g)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("iteration %d: with run-ahead %v, without %v", iter, errA, errB)
		}
		if errA != nil {
			if !IsUnschedulable(errA) {
				t.Fatalf("iteration %d: %v", iter, errA)
			}
			nofit++
			continue
		}
		fit++
		if x, y := assignment(a), assignment(b); x != y {
			t.Fatalf("iteration %d: nodes differ:\nwith run-ahead    %s\nwithout run-ahead %s", iter, x, y)
		}
		checkValid(t, snap, c.in, a)
		if a.RunAhead > 0 {
			used++
		}
		callsOn += a.AllocatorCalls
		callsOff += b.AllocatorCalls
	}
	t.Logf("%d gangs fit, %d did not; run-ahead used in %d; allocator calls %d with it, %d without", fit, nofit, used, callsOn, callsOff)
	if fit < 50 || nofit < 30 || used < 30 {
		t.Fatalf("the random cases should include fitting and failing gangs and gangs that use run-ahead: %d, %d, %d", fit, nofit, used)
	}
	if callsOn >= callsOff {
		t.Errorf("run-ahead should save allocator calls: %d with it, %d without", callsOn, callsOff)
	}
}

// assignment renders pod → node of a result, sorted by pod.
func assignment(res *Result) string {
	var out []string
	for _, p := range res.Placements {
		out = append(out, p.Pod.Name+"@"+p.Node)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// checkValid checks a result against the cluster it was solved on: no device twice, none
// already in use, every device on its pod's node, and no counter set of a partitionable GPU
// overdrawn by the devices in use before and those the gang takes.
func checkValid(t *testing.T, snap *snapshot.Snapshot, in snapshot.Input, res *Result) {
	t.Helper()
	checkNoDoubleAllocation(t, snap, res)
	taken := map[structured.DeviceID]bool{}
	for _, c := range in.Claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			taken[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)] = true
		}
	}
	for _, p := range res.Placements {
		for _, ca := range p.Allocate {
			for _, r := range ca.Allocation.Devices.Results {
				taken[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)] = true
			}
		}
	}
	type setKey struct{ pool, set, counter string }
	limit, drawn := map[setKey]resource.Quantity{}, map[setKey]resource.Quantity{}
	for _, s := range in.Slices {
		for _, cs := range s.Spec.SharedCounters {
			for name, c := range cs.Counters {
				limit[setKey{s.Spec.Pool.Name, cs.Name, name}] = c.Value
			}
		}
		for _, d := range s.Spec.Devices {
			if !taken[structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)] {
				continue
			}
			for _, cc := range d.ConsumesCounters {
				for name, c := range cc.Counters {
					k := setKey{s.Spec.Pool.Name, cc.CounterSet, name}
					q := drawn[k]
					q.Add(c.Value)
					drawn[k] = q
				}
			}
		}
	}
	for k, q := range drawn {
		if l := limit[k]; q.Cmp(l) > 0 {
			t.Fatalf("counter %s of set %s on node %s overdrawn: %s of %s", k.counter, k.set, k.pool, q.String(), l.String())
		}
	}
}

// TestFromAheadChecksTheNodeState: a run-ahead result is handed out only to the run's pods,
// on its node, while the node holds exactly its base followed by the run's earlier pods,
// each placed from it; anything else (another node, a base placement redone, a pod of the
// run skipped or placed by a call of its own) gets none.
func TestFromAheadChecksTheNodeState(t *testing.T) {
	base := &placed{node: 3}
	ra := &runAhead{node: 3, base: []*placed{base}, pods: []int{1, 2, 3}, results: make([][]resourceapi.AllocationResult, 3)}
	fromRun := func(idx int) *placed { return &placed{node: 3, ahead: ra, aheadIdx: idx} }
	cases := []struct {
		name       string
		onNode     []int
		placements map[int]*placed
		pod, node  int
		want       int // position in the run, -1 for none
	}{
		{"first of the run", []int{0}, map[int]*placed{0: base}, 1, 3, 0},
		{"second after the first", []int{0, 1}, map[int]*placed{0: base, 1: fromRun(0)}, 2, 3, 1},
		{"another node", []int{0}, map[int]*placed{0: base}, 1, 4, -1},
		{"not in the run", []int{0}, map[int]*placed{0: base}, 5, 3, -1},
		{"base redone", []int{0}, map[int]*placed{0: {node: 3}}, 1, 3, -1},
		{"base gone", nil, map[int]*placed{}, 1, 3, -1},
		{"earlier pod of the run skipped", []int{0}, map[int]*placed{0: base}, 2, 3, -1},
		{"earlier pod placed by its own call", []int{0, 1}, map[int]*placed{0: base, 1: {node: 3}}, 2, 3, -1},
		{"earlier pod from another run", []int{0, 1}, map[int]*placed{0: base, 1: {node: 3, ahead: &runAhead{}, aheadIdx: 0}}, 2, 3, -1},
		{"another pod in the earlier pod's place", []int{0, 4}, map[int]*placed{0: base, 4: fromRun(0)}, 2, 3, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := &search{ahead: ra, placements: make([]*placed, 6), onNode: map[int]*nodeGang{}}
			for pi, pl := range tc.placements {
				st.placements[pi] = pl
			}
			if tc.onNode != nil {
				st.onNode[3] = &nodeGang{pods: tc.onNode}
			}
			got, j, ok := st.fromAhead(tc.pod, tc.node)
			switch {
			case tc.want < 0 && ok:
				t.Fatalf("got position %d, want none", j)
			case tc.want >= 0 && (!ok || got != ra || j != tc.want):
				t.Fatalf("got %v at %d, want position %d", ok, j, tc.want)
			}
		})
	}
}
