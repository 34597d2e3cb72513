package snapshot

import (
	"context"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Device pre-selection: what the allocator is shown of a node.
//
// The structured allocator is created per node evaluation, and each Allocate call converts
// every device of the node's slices into its internal form (GatherPools) and evaluates the
// CEL selectors of the request's class and of the request on every free device it reaches:
// its cache of selector results lives for one call. On a node of eight partitionable GPUs
// (8 whole + 112 MIG devices) a one-GPU request evaluates the class selector of a hundred
// MIG devices on every call only to skip them; in a 64-pod gang on 1,000 such nodes that was
// two thirds of the solve (docs/benchmarks.md).
//
// Whether a device satisfies a request's selectors depends on the device and the expressions
// only, so it is computed once per node and request (and kept across cycles with a Cache)
// and the allocator is given the node's slices restricted to the devices that can matter:
//   - devices that match some alternative (exact request or firstAvailable subrequest) of
//     some request of the claims being allocated, and those whose selectors failed to
//     evaluate (the allocator reports the error as it would have);
//   - every device in use — allocated, held by an earlier pod of the gang, or shared — since
//     in-use devices consume counters that the free ones compete for;
//   - devices with binding conditions (a pool with any is ordered last by the allocator).
//
// A device left out is one the allocator would have found "not selectable" for every
// request and skipped, so the allocation is the same: the same devices in the same order
// are tried, the same allocator steps are taken. Slices are kept whole (a slice emptied of
// devices still counts for its pool), counter sets are untouched. Nodes whose pools the
// allocator would reject as invalid (duplicate device or counter-set names, a device that
// consumes an unknown counter, several generations) are not restricted: leaving a bad device
// out could make an invalid pool valid. Neither are nodes when the allocator features
// include compatibility groups or derived attributes, which read devices beyond selectors.

// maxViews bounds the claim shapes a node's entry keeps views (and selector results) for.
const maxViews = 64

// alternative is one way a request can be satisfied: a class and selectors, all of whose
// CEL expressions must be true.
type alternative struct {
	key   string
	exprs []string
}

// nodeDevices is what pre-selection knows of one node's slices.
type nodeDevices struct {
	mu sync.Mutex
	// slices are the node's slices this entry was computed for (identity check for the
	// cross-cycle cache).
	slices   []*resourceapi.ResourceSlice
	features structured.Features
	// restrictable: the pools pass the allocator's validity checks.
	restrictable bool
	// matches per alternative key: one bool per device, slices concatenated.
	matches map[string][]bool
	// failed per alternative key: some selector failed to compile or to evaluate on some
	// device (the match is then set, and the count check of fit.go does not reject).
	failed map[string]bool
	// ids and multi of every device (slices concatenated), for the count check; built on
	// first use.
	ids   []structured.DeviceID
	multi []bool
	// views per claims key.
	views map[string]*deviceView
}

// deviceView is the node's slices restricted for one set of claims.
type deviceView struct {
	keep   []bool
	slices []*resourceapi.ResourceSlice
	// kept are the devices in the view, for the check that in-use devices are in it.
	kept sets.Set[structured.DeviceID]
	// answered: the claims have one alternative, whose selectors evaluated without error on
	// every device, and every device of the view matches it except those in unmatched (kept
	// for their binding conditions). Where those are in use, the selectors are answered for
	// every device the allocator can select (see elide.go).
	answered  bool
	unmatched []structured.DeviceID
}

func newNodeDevices(slices []*resourceapi.ResourceSlice, features structured.Features) *nodeDevices {
	nd := &nodeDevices{slices: slices, features: features, matches: map[string][]bool{}, failed: map[string]bool{}, views: map[string]*deviceView{}}
	nd.restrictable = !features.CompatibilityGroups && !features.DerivedAttributes && poolsValid(slices)
	return nd
}

// poolsValid reports whether every pool of the slices passes the checks by which the
// allocator marks a pool invalid, read strictly: one generation per pool, unique device and
// counter-set names, every consumed counter defined in the pool.
func poolsValid(slices []*resourceapi.ResourceSlice) bool {
	type pool struct {
		generation int64
		devices    sets.Set[string]
		counters   map[string]sets.Set[string]
	}
	pools := map[poolKey]*pool{}
	for _, s := range slices {
		k := poolKey{s.Spec.Driver, s.Spec.Pool.Name}
		p := pools[k]
		if p == nil {
			p = &pool{generation: s.Spec.Pool.Generation, devices: sets.New[string](), counters: map[string]sets.Set[string]{}}
			pools[k] = p
		} else if p.generation != s.Spec.Pool.Generation {
			return false
		}
		for _, cs := range s.Spec.SharedCounters {
			if _, dup := p.counters[cs.Name]; dup {
				return false
			}
			names := sets.New[string]()
			for n := range cs.Counters {
				names.Insert(n)
			}
			p.counters[cs.Name] = names
		}
		for i := range s.Spec.Devices {
			if p.devices.Has(s.Spec.Devices[i].Name) {
				return false
			}
			p.devices.Insert(s.Spec.Devices[i].Name)
		}
	}
	for _, s := range slices {
		p := pools[poolKey{s.Spec.Driver, s.Spec.Pool.Name}]
		for i := range s.Spec.Devices {
			for _, c := range s.Spec.Devices[i].ConsumesCounters {
				set, ok := p.counters[c.CounterSet]
				if !ok {
					return false
				}
				for n := range c.Counters {
					if !set.Has(n) {
						return false
					}
				}
			}
		}
	}
	return true
}

// alternatives lists the ways the claims' requests can be satisfied and a key for the list;
// ok is false when some class is missing (the allocator reports that, whatever the devices).
func (s *Snapshot) alternatives(claims []*resourceapi.ResourceClaim) (alts []alternative, key string, ok bool) {
	var kb strings.Builder
	seen := map[string]bool{}
	add := func(class string, selectors []resourceapi.DeviceSelector) bool {
		a, ok := s.alternativeFor(class, selectors)
		if !ok {
			return false
		}
		if !seen[a.key] {
			seen[a.key] = true
			alts = append(alts, a)
			kb.WriteString(a.key)
			kb.WriteByte(1)
		}
		return true
	}
	for _, claim := range claims {
		for i := range claim.Spec.Devices.Requests {
			r := &claim.Spec.Devices.Requests[i]
			if r.Exactly != nil {
				if !add(r.Exactly.DeviceClassName, r.Exactly.Selectors) {
					return nil, "", false
				}
			}
			for j := range r.FirstAvailable {
				if !add(r.FirstAvailable[j].DeviceClassName, r.FirstAvailable[j].Selectors) {
					return nil, "", false
				}
			}
		}
	}
	return alts, kb.String(), true
}

// alternativeFor is the alternative of one request or subrequest: its class's selectors and
// its own; ok is false when the class is missing.
func (s *Snapshot) alternativeFor(class string, selectors []resourceapi.DeviceSelector) (alternative, bool) {
	c, err := s.classes.Get(class)
	if err != nil {
		return alternative{}, false
	}
	var exprs []string
	var b strings.Builder
	b.WriteString(class)
	for _, sel := range c.Spec.Selectors {
		if sel.CEL == nil {
			continue
		}
		exprs = append(exprs, sel.CEL.Expression)
		b.WriteByte(0)
		b.WriteString(sel.CEL.Expression)
	}
	for _, sel := range selectors {
		if sel.CEL == nil {
			continue
		}
		exprs = append(exprs, sel.CEL.Expression)
		b.WriteByte(0)
		b.WriteString(sel.CEL.Expression)
	}
	return alternative{key: b.String(), exprs: exprs}, true
}

// devicesFor returns the node's entry, from the cross-cycle cache when its slices are the
// same objects.
func (s *Snapshot) devicesFor(ni *NodeInfo) *nodeDevices {
	s.preMu.Lock()
	defer s.preMu.Unlock()
	if nd := s.pre[ni.Name()]; nd != nil {
		return nd
	}
	var nd *nodeDevices
	if s.cfg.Cache != nil {
		nd = s.cfg.Cache.nodeDevices(ni.Name(), ni.Slices, s.features)
	} else {
		nd = newNodeDevices(ni.Slices, s.features)
	}
	s.pre[ni.Name()] = nd
	return nd
}

// restrictedSlices returns the node's slices as the allocator should see them for claims,
// given the devices in use (allocated state plus the gang's tentative results on the node),
// and whether every device of them that the allocator can select for the claims is known to
// match their selectors (answered: the selectors may be elided, elide.go).
func (s *Snapshot) restrictedSlices(ctx context.Context, ni *NodeInfo, state *structured.AllocatedState, extra []resourceapi.AllocationResult, claims []*resourceapi.ResourceClaim) (_ []*resourceapi.ResourceSlice, answered bool) {
	if len(ni.Slices) == 0 || s.cfg.AllDevices {
		return ni.Slices, false
	}
	nd := s.devicesFor(ni)
	if !nd.restrictable {
		return ni.Slices, false
	}
	alts, key, ok := s.alternatives(claims)
	if !ok {
		return ni.Slices, false
	}
	nd.mu.Lock()
	defer nd.mu.Unlock()
	view := nd.views[key]
	if view == nil {
		if len(nd.views) >= maxViews {
			// Claims with selectors of their own can make every shape new; a node keeps
			// the views of the shapes seen recently, not of every shape ever seen.
			nd.views = map[string]*deviceView{}
			nd.matches = map[string][]bool{}
			nd.failed = map[string]bool{}
		}
		view = nd.buildView(ctx, s.celCache, alts)
		nd.views[key] = view
	}
	// Every device in use on the node must be in the view.
	var missing []structured.DeviceID
	// Ids of other pools (network-attached slices, which the allocator is given apart)
	// are no device of this node.
	check := func(id structured.DeviceID) {
		if s.poolNode[poolKey{id.Driver.String(), id.Pool.String()}] == ni.Name() && !view.kept.Has(id) {
			missing = append(missing, id)
		}
	}
	for id := range state.AllocatedDevices {
		check(id)
	}
	for id := range state.AllocatedSharedDeviceIDs {
		check(id.GetDeviceID())
	}
	for id := range state.AggregatedCapacity {
		check(id)
	}
	for i := range extra {
		for j := range extra[i].Devices.Results {
			r := &extra[i].Devices.Results[j]
			check(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	// The allocator skips a device in AllocatedDevices before it evaluates selectors, so a
	// kept device that does not match is harmless there and nowhere else.
	answered = view.answered && !s.cfg.NoElision && elidable(claims)
	for _, id := range view.unmatched {
		answered = answered && state.AllocatedDevices.Has(id)
	}
	if len(missing) == 0 {
		return view.slices, answered
	}
	// Devices in use that the view lacks (rare: a gang of several shapes, devices allocated
	// for another class): this call gets the view plus them. Ids that are no device of the
	// node (state of other pools) add nothing.
	inUse := sets.New(missing...)
	keep := append([]bool(nil), view.keep...)
	added := false
	pos := 0
	for _, sl := range nd.slices {
		for i := range sl.Spec.Devices {
			if id := structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, sl.Spec.Devices[i].Name); !keep[pos] && inUse.Has(id) {
				keep[pos] = true
				added = true
				// Added because it is in use; selectable again if it is not in
				// AllocatedDevices (a shared device), and it does not match.
				answered = answered && state.AllocatedDevices.Has(id)
			}
			pos++
		}
	}
	if !added {
		return view.slices, answered
	}
	return restrict(nd.slices, keep), answered
}

// buildView evaluates the alternatives on every device of the node (once per alternative)
// and restricts the slices to the devices that match one, are in error, or have binding
// conditions. The caller holds nd.mu.
func (nd *nodeDevices) buildView(ctx context.Context, cache *cel.Cache, alts []alternative) *deviceView {
	n := 0
	for _, sl := range nd.slices {
		n += len(sl.Spec.Devices)
	}
	keep := make([]bool, n)
	for _, a := range alts {
		m := nd.matchesOf(ctx, cache, a, n)
		for i, ok := range m {
			keep[i] = keep[i] || ok
		}
	}
	pos := 0
	for _, sl := range nd.slices {
		for i := range sl.Spec.Devices {
			if len(sl.Spec.Devices[i].BindingConditions) > 0 {
				keep[pos] = true
			}
			pos++
		}
	}
	v := &deviceView{keep: keep, slices: restrict(nd.slices, keep), kept: sets.New[structured.DeviceID]()}
	var only []bool // the matches of the one alternative, if there is one without errors
	if len(alts) == 1 && !nd.failed[alts[0].key] {
		only = nd.matches[alts[0].key]
		v.answered = true
	}
	pos = 0
	for _, sl := range nd.slices {
		for i := range sl.Spec.Devices {
			if keep[pos] {
				id := structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, sl.Spec.Devices[i].Name)
				v.kept.Insert(id)
				if only != nil && !only[pos] {
					v.unmatched = append(v.unmatched, id)
				}
			}
			pos++
		}
	}
	return v
}

// evaluate runs one alternative's selectors on every device the way the allocator does
// (cel.Device with the driver, allow-multiple flag, attributes and capacity). A compile or
// runtime error counts as a match: the allocator must see the device to report the error.
func evaluate(ctx context.Context, cache *cel.Cache, slices []*resourceapi.ResourceSlice, a alternative, n int) (out []bool, failed bool) {
	out = make([]bool, n)
	compiled := make([]cel.CompilationResult, len(a.exprs))
	for i, e := range a.exprs {
		compiled[i] = cache.GetOrCompile(e)
		if compiled[i].Error != nil {
			for j := range out {
				out[j] = true
			}
			return out, true
		}
	}
	pos := 0
	for _, sl := range slices {
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			match := true
			for _, c := range compiled {
				ok, _, err := c.DeviceMatches(ctx, cel.Device{Driver: sl.Spec.Driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
				if err != nil {
					match, failed = true, true
					break
				}
				if !ok {
					match = false
					break
				}
			}
			out[pos] = match
			pos++
		}
	}
	return out, failed
}

// restrict returns copies of the slices that hold only the devices marked in keep (in their
// order); a slice that keeps all its devices is returned as it is.
func restrict(slices []*resourceapi.ResourceSlice, keep []bool) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(slices))
	pos := 0
	for si, sl := range slices {
		all := true
		for i := range sl.Spec.Devices {
			if !keep[pos+i] {
				all = false
				break
			}
		}
		if all {
			out[si] = sl
			pos += len(sl.Spec.Devices)
			continue
		}
		c := *sl
		c.Spec.Devices = nil
		for i := range sl.Spec.Devices {
			if keep[pos] {
				c.Spec.Devices = append(c.Spec.Devices, sl.Spec.Devices[i])
			}
			pos++
		}
		out[si] = &c
	}
	return out
}
