package snapshot

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// The count check: an exact rejection before the allocator runs.
//
// A failing gang search asks the allocator about hundreds of nodes that are full: each call
// gathers the node's pools and walks its devices only to find too few free ones. Whether a
// node has enough free devices for a request is known cheaply from pre-selection
// (prefilter.go: which devices match each alternative of a request) and the allocated
// state. The check is a necessary condition of the allocator's success, applied only where
// the allocator's answer without it would be "does not fit" (nil result, nil error):
//
//   - a request in ExactCount mode needs count devices that match its selectors and are not
//     in use (AllocatedDevices: allocated, or taken by another pod of the gang); a request
//     with firstAvailable subrequests is rejected only when every subrequest fails that;
//     requests of the same claims with the same class and selectors compete for the same
//     devices, so their counts are also summed;
//   - a device that can be allocated more than once (allowMultipleAllocations) counts as
//     unbounded, and a device blocked by counters (a MIG device whose GPU is taken), a
//     taint or anything else the count does not know counts as available: that keeps the
//     check a necessary condition;
//   - nothing is rejected, and the allocator decides, wherever it could answer otherwise
//     than "does not fit": a request it refuses before searching (a missing class, a
//     feature it lacks, an unsupported mode, capacity requests, admin access, derived
//     attributes, more than AllocationResultsMaxSize devices in a claim, an unknown
//     constraint), "All" mode, a selector that failed to compile or evaluate on some
//     device of the node (the allocator reports that error), pools it would find invalid
//     or features that read devices beyond selectors (see restrictable), network-attached
//     slices (a request may be served off the node), or a cancelled context.
//
// The allocator checks "in use" before it evaluates selectors, so an in-use device never
// makes it report an error: counting only free devices is its own view.

// cannotFit reports whether the allocator is sure to find no allocation for claims on the
// node with state taken (the state AllocateBounded hands it).
func (s *Snapshot) cannotFit(ctx context.Context, ni *NodeInfo, state *structured.AllocatedState, claims []*resourceapi.ResourceClaim) bool {
	if s.cfg.NoFitCheck || len(ni.Slices) == 0 || len(s.sharedSlices) > 0 || ctx.Err() != nil {
		return false
	}
	type need struct {
		alt   alternative
		count int64
	}
	// reqs: per request, its alternatives (one for an exact request).
	var reqs [][]need
	for _, claim := range claims {
		if !s.checkable(claim) {
			return false
		}
		for i := range claim.Spec.Devices.Requests {
			r := &claim.Spec.Devices.Requests[i]
			var alts []need
			if r.Exactly != nil {
				a, _ := s.alternativeFor(r.Exactly.DeviceClassName, r.Exactly.Selectors)
				alts = append(alts, need{a, r.Exactly.Count})
			}
			for j := range r.FirstAvailable {
				sub := &r.FirstAvailable[j]
				a, _ := s.alternativeFor(sub.DeviceClassName, sub.Selectors)
				alts = append(alts, need{a, sub.Count})
			}
			reqs = append(reqs, alts)
		}
	}
	nd := s.devicesFor(ni)
	if !nd.restrictable {
		return false
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	nd.deviceIDs()
	n := len(nd.ids)
	// free per alternative key: matching devices not in use; -1 when unbounded or unknown.
	free := map[string]int64{}
	freeOf := func(a alternative) int64 {
		if f, ok := free[a.key]; ok {
			return f
		}
		m := nd.matchesOf(ctx, s.celCache, a, n)
		f := int64(0)
		if nd.failed[a.key] {
			f = -1
		} else {
			for pos, ok := range m {
				if !ok {
					continue
				}
				if nd.multi[pos] {
					f = -1
					break
				}
				if !state.AllocatedDevices.Has(nd.ids[pos]) {
					f++
				}
			}
		}
		free[a.key] = f
		return f
	}
	short := func(nd need) bool {
		f := freeOf(nd.alt)
		return f >= 0 && nd.count > f
	}
	// A selector error anywhere makes the allocator's answer an error, whichever request
	// falls short: no rejection then.
	for _, alts := range reqs {
		for _, a := range alts {
			if freeOf(a.alt); nd.failed[a.alt.key] {
				return false
			}
		}
	}
	summed := map[string]int64{}
	for _, alts := range reqs {
		all := true
		for _, a := range alts {
			if !short(a) {
				all = false
			}
		}
		if all {
			return true
		}
		if len(alts) == 1 {
			summed[alts[0].alt.key] += alts[0].count
			if f := freeOf(alts[0].alt); f >= 0 && summed[alts[0].alt.key] > f {
				return true
			}
		}
	}
	return false
}

// checkable reports whether the allocator would accept the claim's requests and search
// (see the list above): ExactCount requests or subrequests with a known class and CEL
// selectors only, no capacity, admin access or derived attributes, at most
// AllocationResultsMaxSize devices, constraints of known kinds.
func (s *Snapshot) checkable(claim *resourceapi.ResourceClaim) bool {
	ok := func(class string, selectors []resourceapi.DeviceSelector, mode resourceapi.DeviceAllocationMode, capacity *resourceapi.CapacityRequirements, derived int) bool {
		if class == "" || mode != resourceapi.DeviceAllocationModeExactCount || capacity != nil || derived > 0 {
			return false
		}
		for _, sel := range selectors {
			if sel.CEL == nil {
				return false
			}
		}
		_, found := s.alternativeFor(class, nil)
		return found
	}
	total := int64(0)
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		switch {
		case r.Exactly != nil && len(r.FirstAvailable) == 0:
			e := r.Exactly
			if e.AdminAccess != nil || !ok(e.DeviceClassName, e.Selectors, e.AllocationMode, e.Capacity, len(e.DerivedAttributes)) {
				return false
			}
			total += e.Count
		case r.Exactly == nil && len(r.FirstAvailable) > 0:
			if !s.features.PrioritizedList {
				return false
			}
			least := int64(-1)
			for j := range r.FirstAvailable {
				sub := &r.FirstAvailable[j]
				if !ok(sub.DeviceClassName, sub.Selectors, sub.AllocationMode, sub.Capacity, len(sub.DerivedAttributes)) {
					return false
				}
				if least < 0 || sub.Count < least {
					least = sub.Count
				}
			}
			total += least
		default:
			return false
		}
		if total > resourceapi.AllocationResultsMaxSize {
			return false
		}
	}
	for _, c := range claim.Spec.Devices.Constraints {
		if c.MatchAttribute == nil && c.DistinctAttribute == nil {
			return false
		}
	}
	// Class selectors must be CEL too (the allocator refuses an empty one).
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		classes := []string{}
		if r.Exactly != nil {
			classes = append(classes, r.Exactly.DeviceClassName)
		}
		for j := range r.FirstAvailable {
			classes = append(classes, r.FirstAvailable[j].DeviceClassName)
		}
		for _, name := range classes {
			c, err := s.classes.Get(name)
			if err != nil {
				return false
			}
			for _, sel := range c.Spec.Selectors {
				if sel.CEL == nil {
					return false
				}
			}
		}
	}
	return true
}

// matchesOf returns the alternative's selector results on the node's devices, evaluating
// them on first use. The caller holds nd.mu.
func (nd *nodeDevices) matchesOf(ctx context.Context, cache *cel.Cache, a alternative, n int) []bool {
	m := nd.matches[a.key]
	if m == nil {
		var failed bool
		m, failed = evaluate(ctx, cache, nd.slices, a, n)
		nd.matches[a.key] = m
		nd.failed[a.key] = failed
	}
	return m
}

// deviceIDs fills ids and multi once. The caller holds nd.mu.
func (nd *nodeDevices) deviceIDs() {
	if nd.ids != nil {
		return
	}
	for _, sl := range nd.slices {
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			nd.ids = append(nd.ids, structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name))
			nd.multi = append(nd.multi, ptr.Deref(d.AllowMultipleAllocations, false))
		}
	}
	if nd.ids == nil {
		nd.ids = []structured.DeviceID{}
	}
}
