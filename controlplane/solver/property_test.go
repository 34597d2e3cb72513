package solver

import (
	"context"
	"fmt"
	"math/rand"
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
func TestSolverIsCompleteOnSmallClusters(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	rng := rand.New(rand.NewSource(42))
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
		res, err := New(Config{}).Solve(ctx, snap, g)
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
