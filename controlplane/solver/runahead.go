package solver

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// Run-ahead allocation: fewer allocator calls for pods of one shape on one node.
//
// The depth-first search places one pod at a time and asks the structured allocator about
// each pod's claims on top of what the gang already holds on the node. Every call pays for
// its setup whatever it allocates: it converts the node's slices (GatherPools), sums the
// counters consumed in every pool, and evaluates the CEL selectors of each device it
// reaches, with a cache that lives for the call. On a partitionable node that setup is most
// of the call. Pods of one shape go to non-decreasing candidate positions (the symmetry rule
// of run), so after one of them fits on a node the next ones are tried there first.
//
// So when a pod's own allocation succeeds, the claims of the pods that follow it in search
// order with the same shape — as many as the node's free GPU units can hold, at most
// maxAhead — are allocated together in one more call, on top of the new placement. When
// those pods are tried on the node, each takes its devices from that result instead of a
// call of its own; the filter plugins still check every pod. A pod uses the run-ahead result
// only while the gang's placements on the node are exactly the ones it was computed on plus
// the earlier pods of the run, each placed from it: the allocator allocated all the run's
// claims together, so every prefix of its result is a valid allocation on that state.
//
// The allocator may pick other devices for a later pod than a call of its own would (it
// backtracks when a later claim does not fit), which is as valid; the search stays
// deterministic. The run-ahead call has a step budget of a few times what the pod's own
// call took per claim, so a run that does not fit (free units counted that counters block)
// costs about one more call; it is then dropped without a trace in the search's outcome
// (no failure reason, no memo), and the pods fall back to calls of their own. Not used for
// prioritized lists, constrained pod order (orderMatters), extended-resource claims, claims
// shared between pods, or network-attached devices, where a pod's devices depend on more
// than the node.

// maxAhead bounds the pods one run-ahead allocation covers.
const maxAhead = 16

// runAhead is one run-ahead allocation on a node.
type runAhead struct {
	node int
	// base are the gang's placements on the node the allocation was made on top of, in
	// onNode order.
	base []*placed
	// pods the results are for, in search order; results[j] are pods[j]'s claims' results
	// (in the order tryPlace allocates them).
	pods    []int
	results [][]resourceapi.AllocationResult
}

// allocateAhead runs ahead of the pod at search depth, just placed on node ni by an
// allocator call of its own that took steps.
func (st *search) allocateAhead(depth, ni int, steps int64) {
	// A pod placed by a call of its own means the search has moved on: the previous run is
	// over (fromAhead would refuse it anyway).
	st.ahead = nil
	if st.s.cfg.NoRunAhead || st.probing || st.snap.HasSharedSlices() {
		return
	}
	p := st.pods[st.order[depth]]
	if !aheadEligible(p) {
		return
	}
	ng := st.onNode[ni]
	node := st.snap.Nodes[ni]
	held := 0.0
	for _, o := range ng.pods {
		held += st.pods[o].gpuNeed
	}
	room := min(maxAhead, int((node.GPUFree()-held)/p.gpuNeed))
	var pods []int
	var claims []*resourceapi.ResourceClaim
	var spans []int // claims per pod
	for d := depth + 1; d < len(st.order) && len(pods) < room; d++ {
		qi := st.order[d]
		q := st.pods[qi]
		if q.shape != p.shape || !aheadEligible(q) || !st.ownClaims(q) {
			break
		}
		pods = append(pods, qi)
		claims = append(claims, q.claims...)
		spans = append(spans, len(q.claims))
	}
	if len(pods) == 0 {
		return
	}
	var extra []resourceapi.AllocationResult
	base := make([]*placed, 0, len(ng.pods))
	for _, o := range ng.pods {
		base = append(base, st.placements[o])
		extra = append(extra, st.placements[o].allResults()...)
	}
	// A first fit of n more claims walks about as far per claim as the pod's own call, plus
	// the devices the earlier claims of the run took.
	n := int64(len(pods))
	budget := min(st.s.cfg.MaxSteps-st.steps, 2*n*(steps+n)+16)
	if budget <= 0 {
		return
	}
	res, a, err := st.snap.AllocateBounded(st.ctx, node, extra, claims, budget)
	st.allocCalls++
	st.steps += a.Steps
	if err != nil || a.Exhausted || len(res) != len(claims) {
		// The pods' own calls will report an error, or find what fits.
		return
	}
	ra := &runAhead{node: ni, base: base, pods: pods}
	for _, k := range spans {
		ra.results = append(ra.results, res[:k:k])
		res = res[k:]
	}
	st.ahead = ra
}

// aheadEligible: the pod's devices depend only on the node's state (see above).
func aheadEligible(p *podInfo) bool {
	return !p.flexible && !p.orderMatters && len(p.extended) == 0 && p.gpuNeed > 0
}

// ownClaims: every claim of the pod is unallocated and named by no other gang pod, so
// tryPlace allocates all of them, in order.
func (st *search) ownClaims(p *podInfo) bool {
	if len(p.claims) == 0 {
		return false
	}
	for _, c := range p.claims {
		if c.Status.Allocation != nil || st.claimRefs[claimKey{c.Namespace, c.Name}] != 1 {
			return false
		}
	}
	return true
}

// dropAheadOver ends the run-ahead allocation made on top of pl, which is being undone.
func (st *search) dropAheadOver(pl *placed) {
	if ra := st.ahead; ra != nil && ra.node == pl.node && slices.Contains(ra.base, pl) {
		st.ahead = nil
	}
}

// fromAhead returns the run-ahead allocation and pod pi's position in it when pi can take
// its devices on node ni from it: the gang's placements on the node are the allocation's
// base followed by the run's earlier pods, each placed from it.
func (st *search) fromAhead(pi, ni int) (*runAhead, int, bool) {
	ra := st.ahead
	if ra == nil || ra.node != ni {
		return nil, 0, false
	}
	j := -1
	for i, q := range ra.pods {
		if q == pi {
			j = i
			break
		}
	}
	if j < 0 {
		return nil, 0, false
	}
	var on []int
	if ng := st.onNode[ni]; ng != nil {
		on = ng.pods
	}
	if len(on) != len(ra.base)+j {
		return nil, 0, false
	}
	for i, b := range ra.base {
		if st.placements[on[i]] != b {
			return nil, 0, false
		}
	}
	for i := 0; i < j; i++ {
		pl := st.placements[on[len(ra.base)+i]]
		if pl.ahead != ra || pl.aheadIdx != i || on[len(ra.base)+i] != ra.pods[i] {
			return nil, 0, false
		}
	}
	return ra, j, true
}
