package solver

import (
	"context"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// TestSolverIsCompleteOnSmallClusters compares the solver with brute force on random small
// clusters (whole and partitionable GPUs, some in use) and random gangs (whole GPUs, MIG
// profiles, prioritized lists): whenever some assignment of pods to nodes exists in which
// every node can allocate the claims of all its pods together, the solver must find a
// placement, and every placement it returns must be valid.
//
// The machine is loaded on purpose (busy goroutines on every CPU): the search is bounded by
// work, not time, so load must not change its answers. Run it with -race too.
func TestSolverIsCompleteOnSmallClusters(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	loadMachine(t)
	rng := rand.New(rand.NewSource(42))
	s := newSolver(t, Config{})
	profiles := []string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb"}
	solvable, unsolvable := 0, 0
	for iter := 0; iter < 400; iter++ {
		c := &cluster{}
		nodes := 1 + rng.Intn(3)
		for n := 0; n < nodes; n++ {
			name := fmt.Sprintf("n%d", n)
			c.node(name, 1+rng.Intn(2), rng.Intn(2) == 0, nil)
			if rng.Intn(3) == 0 {
				c.use(name, 1)
			}
		}
		snap := c.snapshot()
		g := &Gang{Name: fmt.Sprintf("ns/g%d", iter)}
		for p := 0; p < 2+rng.Intn(3); p++ {
			name := fmt.Sprintf("g%d-p%d", iter, p)
			var claim *resourceapi.ResourceClaim
			switch rng.Intn(3) {
			case 0:
				claim = fixture.GPUClaim("ns", name, 1)
			case 1:
				claim = fixture.MIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
			default:
				claim = fixture.GPUOrMIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
			}
			g.Pods = append(g.Pods, Pod{Pod: fixture.Pod("ns", name, claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
		}
		res, err := s.Solve(ctx, snap, g)
		exists := bruteForce(ctx, t, snap, g)
		switch {
		case err != nil && !IsUnschedulable(err):
			t.Fatalf("iteration %d: %v", iter, err)
		case err != nil && exists:
			t.Fatalf("iteration %d: solver says %q but brute force finds a placement", iter, err)
		case err == nil && !exists:
			t.Fatalf("iteration %d: solver placed a gang that brute force says does not fit", iter)
		case err == nil:
			solvable++
			checkNoDoubleAllocation(t, snap, res)
			if len(res.Placements) != len(g.Pods) {
				t.Fatalf("iteration %d: %d placements for %d pods", iter, len(res.Placements), len(g.Pods))
			}
		default:
			unsolvable++
		}
	}
	t.Logf("%d solvable and %d unsolvable gangs agreed with brute force", solvable, unsolvable)
	if solvable < 20 || unsolvable < 20 {
		t.Fatalf("the random cases should include both outcomes: %d solvable, %d unsolvable", solvable, unsolvable)
	}
}

// bruteForce tries every assignment of pods to nodes, allocating all claims of a node's pods in
// one allocator call.
func bruteForce(ctx context.Context, t *testing.T, snap *snapshot.Snapshot, g *Gang) bool {
	n := len(snap.Nodes)
	assign := make([]int, len(g.Pods))
	var try func(i int) bool
	try = func(i int) bool {
		if i == len(g.Pods) {
			for ni, node := range snap.Nodes {
				var claims []*resourceapi.ResourceClaim
				for pi, a := range assign {
					if a == ni {
						claims = append(claims, g.Pods[pi].Claims...)
					}
				}
				if len(claims) == 0 {
					continue
				}
				res, err := snap.AllocateOnNode(ctx, node, nil, claims)
				if err != nil {
					t.Fatalf("brute force: %v", err)
				}
				if res == nil {
					return false
				}
			}
			return true
		}
		for a := 0; a < n; a++ {
			assign[i] = a
			if try(i + 1) {
				return true
			}
		}
		return false
	}
	return try(0)
}

// loadMachine keeps every CPU busy until the test ends.
func loadMachine(t *testing.T) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 * runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for {
				select {
				case <-stop:
					return
				default:
					for i := range 100000 {
						x += i
					}
				}
			}
		}()
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// TestSameSnapshotSameDecision: repeated searches of the same gangs on the same snapshot,
// under load, give identical placements and devices and take the same work.
func TestSameSnapshotSameDecision(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	loadMachine(t)
	rng := rand.New(rand.NewSource(7))
	profiles := []string{"1g.10gb", "2g.20gb", "3g.40gb"}
	c := &cluster{}
	for n := range 6 {
		c.node(fmt.Sprintf("n%d", n), 2, n%2 == 0, nil)
	}
	c.use("n1", 1)
	g := &Gang{Name: "ns/g"}
	for p := range 8 {
		name := fmt.Sprintf("p%d", p)
		claim := fixture.GPUOrMIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
		if p%3 == 0 {
			claim = fixture.MIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
		}
		g.Pods = append(g.Pods, Pod{Pod: fixture.Pod("ns", name, claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
	}
	s := newSolver(t, Config{})
	render := func() string {
		res, err := s.Solve(ctx, c.snapshot(), g)
		if err != nil {
			return err.Error()
		}
		out := fmt.Sprintf("tries=%d steps=%d:", res.Tries, res.Steps)
		for _, p := range res.Placements {
			out += " " + p.Pod.Name + "@" + p.Node
			for _, a := range p.Allocate {
				for _, r := range a.Allocation.Devices.Results {
					out += "/" + r.Device
				}
			}
		}
		return out
	}
	first := render()
	t.Log(first)
	for i := range 20 {
		if got := render(); got != first {
			t.Fatalf("run %d differs:\n%s\nfirst:\n%s", i, got, first)
		}
	}
}
