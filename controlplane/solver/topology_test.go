package solver

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// blocks builds 2 blocks × 2 racks × 4 nodes × 8 GPUs (node b<block>-r<rack>-n<node>) with
// used GPUs taken on every node.
func blocks(used func(block, rack, node int) int) *cluster {
	c := &cluster{}
	for b := range 2 {
		for r := range 2 {
			for n := range 4 {
				name := fmt.Sprintf("b%d-r%d-n%d", b, r, n)
				c.node(name, 8, false, map[string]string{"block": fmt.Sprintf("b%d", b), "rack": fmt.Sprintf("b%d-r%d", b, r)})
				if u := used(b, r, n); u > 0 {
					c.use(name, u)
				}
			}
		}
	}
	return c
}

// racksOf counts the pods of a placement per block and per rack.
func racksOf(res *Result) (blocks, racks map[string]int) {
	blocks, racks = map[string]int{}, map[string]int{}
	for _, p := range res.Placements {
		parts := strings.Split(p.Node, "-")
		blocks[parts[0]]++
		racks[parts[0]+"-"+parts[1]]++
	}
	return blocks, racks
}

// "Require block, prefer rack": a gang stays in one block and, when no rack has room for it,
// uses as few racks as it can; a gang bigger than any block waits and says which level held
// it back and the largest free block in numbers. Without a gang constraint the configured
// keys are all used (the most specific preferred, the broader ones keep a spanning gang
// together).
func TestMultiLevelTopology(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	requireBlockPreferRack := &Topology{RequiredKeys: []string{"block"}, PreferredKey: "rack", Levels: []string{"block", "rack"}}
	for _, tc := range []struct {
		name       string
		used       func(b, r, n int) int
		topology   *Topology
		keys       []string
		pods       int
		wantBlocks int
		wantRacks  int
		wantErr    string
	}{
		{
			name: "fits one rack", used: func(b, r, n int) int { return 0 },
			topology: requireBlockPreferRack, pods: 24, wantBlocks: 1, wantRacks: 1,
		},
		{
			// Every rack has 16 free: 24 GPUs take two racks of one block, not three racks.
			name: "spans the fewest racks of one block", used: func(b, r, n int) int { return 4 },
			topology: requireBlockPreferRack, pods: 24, wantBlocks: 1, wantRacks: 2,
		},
		{
			// Block b0 is empty (64 free), b1 has exactly 24 free (3 per node): the gang
			// goes to the best-fit block b1 and fills both of its racks.
			name: "best-fit block", used: func(b, r, n int) int {
				if b == 1 {
					return 5
				}
				return 0
			},
			topology: requireBlockPreferRack, pods: 24, wantBlocks: 1, wantRacks: 2,
		},
		{
			name: "bigger than any block waits", used: func(b, r, n int) int { return 0 },
			topology: requireBlockPreferRack, pods: 64 + 1,
			wantErr: "largest topology domain block=b0 has 64 free (required level block, 2 domains)",
		},
		{
			// No gang constraint, --topology-keys=rack,block: 40 GPUs fit no rack (32) but
			// one block (64): they stay in one block.
			name: "configured keys: all levels used", used: func(b, r, n int) int { return 0 },
			keys: []string{"rack", "block"}, pods: 40, wantBlocks: 1, wantRacks: 2,
		},
		{
			// Rack b0-r0 is the freest (32) but its block has no other room (b0-r1 is full);
			// block b1 has 56 free over two racks of 28. Grouping by rack alone would fill
			// b0-r0 and then a rack of b1: two blocks. The block level keeps it in b1.
			name: "configured keys: broader level keeps a spanning gang together", used: func(b, r, n int) int {
				switch {
				case b == 0 && r == 1:
					return 8
				case b == 1:
					return 1
				}
				return 0
			},
			keys: []string{"rack", "block"}, pods: 56, wantBlocks: 1, wantRacks: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := blocks(tc.used)
			snap := c.snapshot()
			s := newSolver(t, Config{TopologyKeys: tc.keys})
			g := gpuGang("g", tc.pods)
			g.Topology = tc.topology
			res, err := s.Solve(ctx, snap, g)
			if tc.wantErr != "" {
				if !IsUnschedulable(err) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkNoDoubleAllocation(t, snap, res)
			bs, rs := racksOf(res)
			if len(bs) != tc.wantBlocks || len(rs) != tc.wantRacks {
				t.Fatalf("placed over blocks %v and racks %v, want %d blocks and %d racks", bs, rs, tc.wantBlocks, tc.wantRacks)
			}
		})
	}
}
