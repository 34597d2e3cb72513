package snapshot

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What-if snapshots: the cycle's cluster without some pods.
//
// Preemption, reclaim and consolidation each simulate victim sets: "does the gang fit once
// these pods are gone (and the claims only they used are released)?". Building each such
// snapshot from scratch (New) derives every node again, though a victim set touches a few.
// A WhatIf derives them from the incremental state (incremental.go) the cycle's snapshot was
// published from: the nodes of the victims (their pods part) and the nodes that publish the
// pools of the released claims (their allocations part) are derived again, leaving the
// victims out; every other node shares its derived state with the cycle's snapshot, copy on
// write as between cycles. The result is the snapshot New(Without(in, pods), cfg) builds
// (TestWhatIfMatchesFull). A cycle snapshot that New built has no such state: its what-ifs
// are built with New.

// Without returns the input without the given pods, and with the claims that only they
// used (every reservedFor entry is one of them) unallocated (a copy with no allocation and
// no reservedFor): the cluster once the pods are evicted.
func Without(in Input, pods map[types.UID]bool) Input {
	out := in
	out.Pods = make([]*v1.Pod, 0, len(in.Pods))
	for _, p := range in.Pods {
		if !pods[p.UID] {
			out.Pods = append(out.Pods, p)
		}
	}
	out.Claims = make([]*resourceapi.ResourceClaim, 0, len(in.Claims))
	for _, c := range in.Claims {
		if releasedBy(c, pods) {
			c = released(c)
		}
		out.Claims = append(out.Claims, c)
	}
	return out
}

// releasedBy reports whether evicting pods releases the claim: it is allocated and
// reserved for them only.
func releasedBy(c *resourceapi.ResourceClaim, pods map[types.UID]bool) bool {
	if c.Status.Allocation == nil || len(c.Status.ReservedFor) == 0 {
		return false
	}
	for _, r := range c.Status.ReservedFor {
		if !pods[r.UID] {
			return false
		}
	}
	return true
}

func released(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c = c.DeepCopy()
	c.Status.Allocation, c.Status.ReservedFor = nil, nil
	return c
}

// WhatIf derives the what-if snapshots of one cycle. Safe for concurrent use (what-ifs of
// one WhatIf are derived one at a time).
type WhatIf struct {
	in  Input
	cfg Config
	// key is cfg's as Cache.Snapshot keys its state (before defaults).
	key configKey
	// cycle is the cycle's snapshot: while the incremental state it was published from is
	// unchanged (no later Cache.Snapshot call), what-ifs are derived from that state.
	cycle *Snapshot

	mu sync.Mutex
	// byUID: the pods of in by UID; reservedBy: the allocated claims of in by the UIDs
	// they are reserved for.
	byUID      map[types.UID][]*v1.Pod
	reservedBy map[types.UID][]*resourceapi.ResourceClaim

	// copies are the released copies of claims, one per claim for all what-ifs.
	copies map[objKey]*resourceapi.ResourceClaim
	// fromCycle, fromNew count the what-ifs derived from the cycle's state and those built
	// with New (for tests).
	fromCycle, fromNew int
}

// NewWhatIf returns the what-ifs of in, the input the cycle's snapshot cycle was built from
// by Cache.Snapshot (nil or a snapshot New built: each what-if is then built with New).
// cfg is the configuration cycle was built with.
func NewWhatIf(cycle *Snapshot, in Input, cfg Config) *WhatIf {
	return &WhatIf{in: in, cfg: defaults(cfg), key: keyOfConfig(cfg), cycle: cycle, copies: map[objKey]*resourceapi.ResourceClaim{}}
}

func (w *WhatIf) index() {
	w.byUID = make(map[types.UID][]*v1.Pod, len(w.in.Pods))
	for _, p := range w.in.Pods {
		w.byUID[p.UID] = append(w.byUID[p.UID], p)
	}
	w.reservedBy = map[types.UID][]*resourceapi.ResourceClaim{}
	for _, c := range w.in.Claims {
		if c.Status.Allocation == nil {
			continue
		}
		seen := map[types.UID]bool{}
		for _, r := range c.Status.ReservedFor {
			if !seen[r.UID] {
				seen[r.UID] = true
				w.reservedBy[r.UID] = append(w.reservedBy[r.UID], c)
			}
		}
	}
}

// Without returns the snapshot New(Without(in, pods), cfg) builds.
func (w *WhatIf) Without(pods map[types.UID]bool) *Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.cycle.currentState()
	if b == nil {
		// No state to derive from: built from scratch. (Deriving a state of in first
		// costs more than the one or two New a cycle's rules build in the benchmark: a
		// WhatIf pays off where the cycle's state exists already.)
		w.fromNew++
		return New(Without(w.in, pods), w.cfg)
	}
	defer b.cfg.Cache.incMu.Unlock()
	if w.byUID == nil {
		w.index()
	}
	victims := map[objKey]*v1.Pod{}
	var rel []*resourceapi.ResourceClaim
	seen := map[*resourceapi.ResourceClaim]bool{}
	for uid := range pods {
		for _, p := range w.byUID[uid] {
			victims[keyOf(&p.ObjectMeta)] = p
		}
		for _, c := range w.reservedBy[uid] {
			if !seen[c] {
				seen[c] = true
				if releasedBy(c, pods) {
					rel = append(rel, c)
				}
			}
		}
	}
	if s := w.derive(b, victims, rel); s != nil {
		w.fromCycle++
		return s
	}
	// The cycle's snapshot was built from another input.
	w.fromNew++
	return New(Without(w.in, pods), w.cfg)
}

// currentState returns, locked, the incremental state s was published from when it is
// still at that epoch; nil when s has none or it moved on.
func (s *Snapshot) currentState() *incremental {
	if s == nil || s.inc == nil || s.inc.cfg.Cache == nil {
		return nil
	}
	c := s.inc.cfg.Cache
	c.incMu.Lock()
	if c.inc != s.inc || s.inc.epoch != s.epoch {
		c.incMu.Unlock()
		return nil
	}
	return s.inc
}

// derive returns the what-if of b without the victims and with rel released; nil when b
// is not the state of in (another configuration, other numbers of pods or claims, other
// objects for the victims or the released claims: the cycle's snapshot was built from
// another input).
func (w *WhatIf) derive(b *incremental, victims map[objKey]*v1.Pod, rel []*resourceapi.ResourceClaim) *Snapshot {
	if b.key != w.key || len(b.pods) != len(w.in.Pods) || len(b.claims) != len(w.in.Claims) {
		return nil
	}
	override := map[string]*nodeState{}
	// state returns the node's state to derive again (a copy), nil for an unknown node.
	state := func(node string) *nodeState {
		if st := override[node]; st != nil {
			return st
		}
		ne := b.nodes[node]
		if ne == nil || ne.st == nil {
			return nil
		}
		cp := *ne.st
		override[node] = &cp
		return &cp
	}
	skipPods := make(map[objKey]bool, len(victims))
	podNodes := map[string]bool{}
	pvcRefs, pvcOwn := b.pvcRefs, false
	for k, p := range victims {
		pe := b.pods[k]
		if pe == nil || pe.pod != p {
			return nil
		}
		skipPods[k] = true
		if pe.node == "" || b.nodes[pe.node] == nil {
			continue
		}
		podNodes[pe.node] = true
		if pe.info != nil && len(pe.pvcKeys) > 0 {
			if !pvcOwn {
				pvcRefs = make(map[string]int, len(b.pvcRefs))
				for key, n := range b.pvcRefs {
					pvcRefs[key] = n
				}
				pvcOwn = true
			}
			for _, key := range pe.pvcKeys {
				if pvcRefs[key]--; pvcRefs[key] <= 0 {
					delete(pvcRefs, key)
				}
			}
		}
	}
	skipClaims := make(map[objKey]bool, len(rel))
	allocNodes := map[string]bool{}
	sharedChanged := false
	delta := map[objKey]*resourceapi.ResourceClaim{}
	for _, c := range rel {
		k := keyOf(&c.ObjectMeta)
		ce := b.claims[k]
		if ce == nil || ce.claim != c {
			return nil
		}
		skipClaims[k] = true
		for _, p := range ce.pools {
			if owner, ok := b.poolNode[p]; ok {
				allocNodes[owner] = true
			} else {
				sharedChanged = true
			}
		}
		cp := w.copies[k]
		if cp == nil {
			cp = released(c)
			w.copies[k] = cp
		}
		delta[k] = cp
	}
	for node := range podNodes {
		st := state(node)
		b.podsPart(node, b.nodes[node].node, st, skipPods)
	}
	for node := range allocNodes {
		if st := state(node); st != nil {
			b.allocsPart(node, st, skipClaims)
		}
	}
	sharedAlloc := b.sharedAlloc
	if sharedChanged {
		sharedAlloc = b.sharedAllocsOf(skipClaims)
	}
	claims := b.claimIdx
	if len(delta) > 0 {
		merged := make(map[objKey]*resourceapi.ResourceClaim, len(claims.delta)+len(delta))
		for k, c := range claims.delta {
			merged[k] = c
		}
		for k, c := range delta {
			merged[k] = c
		}
		claims = claimIndex{base: claims.base, delta: merged}
	}
	s := b.build(w.in, w.cfg, override, pvcRefs, sharedAlloc, claims)
	if !pvcOwn {
		b.pvcPublished = true
	}
	return s
}
