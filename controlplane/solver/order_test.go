package solver

import (
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"testing"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// TestSortNodesAsByName: the candidate order (keys computed once per node, ties broken by
// the node's index in the snapshot) is the order of the comparison by free GPU units, plain
// GPUs and node name that it replaced, on random nodes (free units in eighths, equal ones
// frequent, some full), random subsets, bin-packing and spreading, with and without the
// plain-GPU preference.
func TestSortNodesAsByName(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for iter := 0; iter < 200; iter++ {
		c := &cluster{}
		n := 1 + rng.Intn(30)
		for i := 0; i < n; i++ {
			// Names out of index order in the input: the snapshot sorts them.
			name := fmt.Sprintf("node-%03d", rng.Intn(1000))
			if c.has(name) {
				continue
			}
			c.node(name, 1+rng.Intn(4), rng.Intn(2) == 0, nil)
			if rng.Intn(2) == 0 {
				var devs []string
				for d := 0; d < rng.Intn(4); d++ {
					devs = append(devs, fmt.Sprintf("gpu-%d", d))
				}
				if rng.Intn(3) == 0 {
					devs = append(devs, fixture.MIGDeviceName(0, "1g.10gb", rng.Intn(7)))
				}
				c.in.Claims = append(c.in.Claims, fixture.AllocatedClaim("other", "used-"+name, name, devs...))
			}
		}
		snap := c.snapshot()
		st := &search{snap: snap, s: &Solver{cfg: Config{Spread: rng.Intn(2) == 0}}, preferPlain: rng.Intn(2) == 0}
		st.plainFree = make([]int, len(snap.Nodes))
		for i, ni := range snap.Nodes {
			st.plainFree[i] = ni.PlainGPUsFree()
		}
		var subset []int
		if rng.Intn(2) == 0 {
			for i := range snap.Nodes {
				if rng.Intn(2) == 0 {
					subset = append(subset, i)
				}
			}
			rng.Shuffle(len(subset), func(i, j int) { subset[i], subset[j] = subset[j], subset[i] })
		}
		got := st.sortNodes(subset)
		want := sortNodesByName(st, subset)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("iter %d: order %v, by the old comparison %v", iter, got, want)
		}
	}
}

func (c *cluster) has(name string) bool {
	for _, n := range c.in.Nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

// sortNodesByName is the candidate order as it was computed before: a stable sort with the
// keys read per comparison and ties broken by node name.
func sortNodesByName(st *search, subset []int) []int {
	if subset == nil {
		subset = make([]int, len(st.snap.Nodes))
		for i := range subset {
			subset[i] = i
		}
	} else {
		subset = append([]int(nil), subset...)
	}
	nodes := st.snap.Nodes
	spread := st.s.cfg.Spread
	sort.SliceStable(subset, func(a, b int) bool {
		na, nb := nodes[subset[a]], nodes[subset[b]]
		fa, fb := na.GPUFree(), nb.GPUFree()
		if (fa <= 0) != (fb <= 0) {
			return fa > 0
		}
		if st.preferPlain {
			if pa, pb := st.plainFree[subset[a]] > 0, st.plainFree[subset[b]] > 0; pa != pb {
				return pa
			}
		}
		if fa != fb {
			if spread {
				return fa > fb
			}
			return fa < fb
		}
		return na.Name() < nb.Name()
	})
	return subset
}
