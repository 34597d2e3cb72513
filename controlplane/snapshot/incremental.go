package snapshot

import (
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/filters"
)

// The incremental snapshot (Cache.Snapshot).
//
// Building a snapshot from scratch (New) derives everything from every object: the device
// costs of every slice, the requests and the kube-scheduler's parsed view of every bound
// pod, the allocated devices of every claim. Between two cycles only a few objects change,
// and objects from informers are replaced, never modified: an unchanged object is the same
// pointer in the next cycle's lists (the scheduler's assumed pods and claims are new
// objects, so they count as changed). The incremental state keeps what was derived per
// node and, each cycle, compares the lists with what it saw by identity and derives again
// only what the changed objects touch:
//   - a node's devices part (slices by name, pools, costs, GPU capacity) when its node
//     object is new or one of its slices changed;
//   - its pods part (requests, pod count, the kube-scheduler's NodeInfo) when its node
//     object or one of the pods bound to it changed;
//   - its allocations part (allocated devices, GPU units used) when a claim with a result
//     in one of its pools changed, its pools changed, or a pool changed hands.
//
// The derived parts are never changed once a snapshot has them: a snapshot's NodeInfos
// share them and copy what Assume changes first (NodeInfo.own, filters.NewSharedView), so
// a snapshot stays valid after later cycles. The result is the snapshot New builds from the
// same input (TestIncrementalMatchesFull).

// Parts of a node's derived state to derive again.
const (
	partDevices uint8 = 1 << iota
	partPods
	partAllocs
)

type incremental struct {
	// key is the configuration the state was derived with (a different one starts over).
	key    configKey
	cfg    Config
	gpuDrv sets.Set[string]
	epoch  uint64
	// devicesEpoch changes whenever what prices an allocation may have changed: a node's
	// devices part, the network-attached slices or which node publishes a pool. Claims'
	// units kept in their entries (ClaimUnits) are those of one devicesEpoch.
	devicesEpoch uint64

	nodes  map[string]*nodeEntry
	slices map[string]*sliceEntry
	pods   map[objKey]*podEntry
	claims map[objKey]*claimEntry

	// slicesByNode: spec.nodeName ("" for network-attached slices) → slice name → entry.
	slicesByNode map[string]map[string]*sliceEntry
	// podsByNode: spec.nodeName → the non-terminal pods bound to it.
	podsByNode map[string]map[objKey]*podEntry
	// claimsByPool: the claims with a result (not admin access) in the pool.
	claimsByPool map[poolKey]map[objKey]*claimEntry
	// publishers: pool → known node → how many of its slices are of the pool.
	publishers map[poolKey]map[string]int

	// Published state: handed to snapshots, replaced rather than changed.
	poolNode     map[poolKey]string
	sorted       []string
	sharedSlices []*resourceapi.ResourceSlice
	sharedCosts  map[structured.DeviceID]contract.Cost
	sharedAlloc  structured.AllocatedState
	pvcRefs      map[string]int
	pvcPublished bool
	claimIdx     claimIndex
}

// configKey is what of a Config the derived state depends on.
type configKey struct {
	features   structured.Features
	gpuDrivers string
	celCache   any
	allDevices bool
}

func keyOfConfig(cfg Config) configKey {
	return configKey{features: cfg.Features, gpuDrivers: strings.Join(cfg.GPUDrivers, "\x00"), celCache: cfg.CELCache, allDevices: cfg.AllDevices}
}

type nodeEntry struct {
	node  *v1.Node
	epoch uint64
	st    *nodeState
}

// nodeState is what is derived from one node's objects; never changed once built.
type nodeState struct {
	// devices part
	slices   []*resourceapi.ResourceSlice
	pools    []poolKey
	costs    map[structured.DeviceID]contract.Cost
	gpuTotal float64
	plain    []structured.DeviceID
	// pods part
	requested v1.ResourceList
	pods      int
	view      *framework.NodeInfo
	pvcKeys   []string
	// allocations part
	allocated structured.AllocatedState
	gpuUsed   float64
}

type sliceEntry struct {
	slice *resourceapi.ResourceSlice
	node  string
	epoch uint64
}

type podEntry struct {
	pod   *v1.Pod
	epoch uint64
	// node is spec.nodeName of a non-terminal pod, "" when the pod counts on no node.
	node     string
	requests v1.ResourceList
	// cpu and memory are requests' as floats (Snapshot.RequestedCPUMemory).
	cpu, memory float64
	info        *framework.PodInfo
	pvcKeys     []string
}

type claimEntry struct {
	claim *resourceapi.ResourceClaim
	epoch uint64
	pools []poolKey
	// units is AllocationUnits of the claim's allocation in devicesEpoch unitsEpoch (0:
	// not known; set by Snapshot.ClaimUnits under the Cache's incMu).
	units      float64
	unitsEpoch uint64
}

func newIncremental(key configKey, cfg Config) *incremental {
	return &incremental{
		key:          key,
		cfg:          cfg,
		gpuDrv:       sets.New(cfg.GPUDrivers...),
		nodes:        map[string]*nodeEntry{},
		slices:       map[string]*sliceEntry{},
		pods:         map[objKey]*podEntry{},
		claims:       map[objKey]*claimEntry{},
		slicesByNode: map[string]map[string]*sliceEntry{},
		podsByNode:   map[string]map[objKey]*podEntry{},
		claimsByPool: map[poolKey]map[objKey]*claimEntry{},
		publishers:   map[poolKey]map[string]int{},
		poolNode:     map[poolKey]string{},
		sharedCosts:  map[structured.DeviceID]contract.Cost{},
		sharedAlloc:  newAllocatedState(),
		pvcRefs:      map[string]int{},
	}
}

// changes collects what one update touched.
type changes struct {
	dirty        map[string]uint8
	pools        map[poolKey]bool // pools whose publishers changed
	claimPools   map[poolKey]bool // pools whose claims changed
	claimDelta   map[objKey]*resourceapi.ResourceClaim
	sharedSlices bool
	sharedAlloc  bool
	nodeSet      bool
}

func (c *changes) mark(node string, parts uint8) { c.dirty[node] |= parts }

// update brings the state to in and returns the snapshot of it.
func (b *incremental) update(in Input) *Snapshot {
	b.epoch++
	ch := &changes{dirty: map[string]uint8{}, pools: map[poolKey]bool{}, claimPools: map[poolKey]bool{}, claimDelta: map[objKey]*resourceapi.ResourceClaim{}}
	b.updateNodes(in.Nodes, ch)
	b.updateSlices(in.Slices, ch)
	b.updatePods(in.Pods, ch)
	b.updateClaims(in.Claims, ch)

	// Devices first: they decide which node publishes which pool. A removed node's pools
	// (ch.pools, from updateNodes), the network-attached slices or any node's devices part
	// change what allocations cost (devicesEpoch).
	devicesChanged := len(ch.pools) > 0 || ch.sharedSlices || b.devicesEpoch == 0
	for name, parts := range ch.dirty {
		ne := b.nodes[name]
		if ne == nil || (parts&partDevices == 0 && ne.st != nil) {
			continue
		}
		devicesChanged = true
		st := &nodeState{}
		if ne.st != nil {
			*st = *ne.st
			b.unpublish(name, ne.st.pools, ch)
		}
		b.deriveDevices(name, st)
		b.publish(name, st.pools, ch)
		ne.st = st
		ch.dirty[name] |= partAllocs | partPods
	}
	// A claim changed in a pool that had no node before this update, or has none after
	// it, changes the network-attached (shared) state.
	for p := range ch.claimPools {
		if _, ok := b.poolNode[p]; !ok {
			ch.sharedAlloc = true
		}
	}
	b.updateOwners(ch)
	for p := range ch.claimPools {
		if owner, ok := b.poolNode[p]; ok {
			ch.mark(owner, partAllocs)
		} else {
			ch.sharedAlloc = true
		}
	}
	for name, parts := range ch.dirty {
		ne := b.nodes[name]
		if ne == nil {
			continue
		}
		st := ne.st
		if parts&(partPods|partAllocs) != 0 {
			cp := *st
			st = &cp
		}
		if parts&partPods != 0 {
			b.derivePods(name, ne.node, st)
		}
		if parts&partAllocs != 0 {
			b.deriveAllocs(name, st)
		}
		ne.st = st
	}
	if ch.sharedSlices {
		b.sharedSlices = sortedSlices(b.slicesByNode[""])
		b.sharedCosts, _, _ = nodeDevicesOf(b.sharedSlices, b.gpuDrv)
	}
	if ch.sharedAlloc {
		b.deriveSharedAllocs()
	}

	if ch.nodeSet {
		b.sorted = make([]string, 0, len(b.nodes))
		for name := range b.nodes {
			b.sorted = append(b.sorted, name)
		}
		sort.Strings(b.sorted)
	}
	if devicesChanged {
		b.devicesEpoch++
	}
	b.publishClaims(ch.claimDelta)
	return b.snapshot(in, ch.nodeSet)
}

func (b *incremental) updateNodes(nodes []*v1.Node, ch *changes) {
	for _, n := range nodes {
		ne := b.nodes[n.Name]
		switch {
		case ne == nil:
			ne = &nodeEntry{}
			b.nodes[n.Name] = ne
			ch.nodeSet = true
			ch.mark(n.Name, partDevices|partPods|partAllocs)
		case ne.node != n:
			// The kube-scheduler's NodeInfo holds the node object.
			ch.mark(n.Name, partPods)
		}
		ne.node, ne.epoch = n, b.epoch
	}
	for name, ne := range b.nodes {
		if ne.epoch == b.epoch {
			continue
		}
		if ne.st != nil {
			b.unpublish(name, ne.st.pools, ch)
			b.countPVCs(ne.st.pvcKeys, -1)
		}
		delete(b.nodes, name)
		ch.nodeSet = true
	}
}

func (b *incremental) updateSlices(list []*resourceapi.ResourceSlice, ch *changes) {
	markNode := func(node string) {
		if node == "" {
			ch.sharedSlices = true
		} else {
			ch.mark(node, partDevices)
		}
	}
	for _, sl := range list {
		se := b.slices[sl.Name]
		if se != nil && se.slice == sl {
			se.epoch = b.epoch
			continue
		}
		if se != nil {
			delete(b.slicesByNode[se.node], sl.Name)
			markNode(se.node)
		}
		se = &sliceEntry{slice: sl, node: ptr.Deref(sl.Spec.NodeName, ""), epoch: b.epoch}
		b.slices[sl.Name] = se
		m := b.slicesByNode[se.node]
		if m == nil {
			m = map[string]*sliceEntry{}
			b.slicesByNode[se.node] = m
		}
		m[sl.Name] = se
		markNode(se.node)
	}
	for name, se := range b.slices {
		if se.epoch != b.epoch {
			delete(b.slicesByNode[se.node], name)
			if len(b.slicesByNode[se.node]) == 0 {
				delete(b.slicesByNode, se.node)
			}
			delete(b.slices, name)
			markNode(se.node)
		}
	}
}

func (b *incremental) updatePods(list []*v1.Pod, ch *changes) {
	for _, p := range list {
		k := keyOf(&p.ObjectMeta)
		pe := b.pods[k]
		if pe != nil && pe.pod == p {
			pe.epoch = b.epoch
			continue
		}
		if pe != nil {
			b.unindexPod(k, pe, ch)
		}
		pe = &podEntry{pod: p, epoch: b.epoch}
		if p.Spec.NodeName != "" && !isTerminal(p) {
			pe.node = p.Spec.NodeName
			pe.requests = PodRequests(p)
			pe.cpu, pe.memory = cpuMemory(pe.requests)
			if info, err := framework.NewPodInfo(p); err == nil {
				pe.info = info
				for key := range framework.PodPVCKeys(p) {
					pe.pvcKeys = append(pe.pvcKeys, key)
				}
			}
			m := b.podsByNode[pe.node]
			if m == nil {
				m = map[objKey]*podEntry{}
				b.podsByNode[pe.node] = m
			}
			m[k] = pe
			ch.mark(pe.node, partPods)
		}
		b.pods[k] = pe
	}
	for k, pe := range b.pods {
		if pe.epoch != b.epoch {
			b.unindexPod(k, pe, ch)
			delete(b.pods, k)
		}
	}
}

func (b *incremental) unindexPod(k objKey, pe *podEntry, ch *changes) {
	if pe.node == "" {
		return
	}
	delete(b.podsByNode[pe.node], k)
	if len(b.podsByNode[pe.node]) == 0 {
		delete(b.podsByNode, pe.node)
	}
	ch.mark(pe.node, partPods)
}

func (b *incremental) updateClaims(list []*resourceapi.ResourceClaim, ch *changes) {
	for _, c := range list {
		k := keyOf(&c.ObjectMeta)
		ce := b.claims[k]
		if ce != nil && ce.claim == c {
			ce.epoch = b.epoch
			continue
		}
		if ce != nil {
			b.unindexClaim(k, ce, ch)
		}
		ce = &claimEntry{claim: c, epoch: b.epoch, pools: claimPools(c)}
		for _, p := range ce.pools {
			m := b.claimsByPool[p]
			if m == nil {
				m = map[objKey]*claimEntry{}
				b.claimsByPool[p] = m
			}
			m[k] = ce
			ch.claimPools[p] = true
		}
		b.claims[k] = ce
		ch.claimDelta[k] = c
	}
	for k, ce := range b.claims {
		if ce.epoch != b.epoch {
			b.unindexClaim(k, ce, ch)
			delete(b.claims, k)
			ch.claimDelta[k] = nil
		}
	}
}

func (b *incremental) unindexClaim(k objKey, ce *claimEntry, ch *changes) {
	for _, p := range ce.pools {
		delete(b.claimsByPool[p], k)
		if len(b.claimsByPool[p]) == 0 {
			delete(b.claimsByPool, p)
		}
		ch.claimPools[p] = true
	}
}

// claimPools are the pools of a claim's allocation results that take a device (admin
// access does not).
func claimPools(c *resourceapi.ResourceClaim) []poolKey {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []poolKey
	for i := range c.Status.Allocation.Devices.Results {
		r := &c.Status.Allocation.Devices.Results[i]
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		k := poolKey{r.Driver, r.Pool}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func (b *incremental) publish(node string, pools []poolKey, ch *changes) {
	for _, p := range pools {
		m := b.publishers[p]
		if m == nil {
			m = map[string]int{}
			b.publishers[p] = m
		}
		m[node]++
		ch.pools[p] = true
	}
}

func (b *incremental) unpublish(node string, pools []poolKey, ch *changes) {
	for _, p := range pools {
		m := b.publishers[p]
		if m[node]--; m[node] <= 0 {
			delete(m, node)
		}
		if len(m) == 0 {
			delete(b.publishers, p)
		}
		ch.pools[p] = true
	}
}

// updateOwners gives each pool whose publishers changed to the first of them by name (as
// New does), and marks what a change of hands touches.
func (b *incremental) updateOwners(ch *changes) {
	copied := false
	for p := range ch.pools {
		owner := ""
		for n := range b.publishers[p] {
			if owner == "" || n < owner {
				owner = n
			}
		}
		cur := b.poolNode[p]
		if owner == cur {
			continue
		}
		if !copied {
			// Snapshots have the current map: this update gets a new one.
			next := make(map[poolKey]string, len(b.poolNode)+len(ch.pools))
			for k, v := range b.poolNode {
				next[k] = v
			}
			b.poolNode = next
			copied = true
		}
		if owner == "" {
			delete(b.poolNode, p)
		} else {
			b.poolNode[p] = owner
			ch.mark(owner, partAllocs)
		}
		if cur != "" {
			ch.mark(cur, partAllocs)
		}
		// The pool's results move between a node and the shared state (rare: a node or
		// its slices came or went).
		ch.sharedAlloc = true
	}
}

func sortedSlices(m map[string]*sliceEntry) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, 0, len(m))
	for _, se := range m {
		out = append(out, se.slice)
	}
	sortSlices(out)
	return out
}

func (b *incremental) deriveDevices(node string, st *nodeState) {
	st.slices = sortedSlices(b.slicesByNode[node])
	st.pools = nil
	for _, sl := range st.slices {
		k := poolKey{sl.Spec.Driver, sl.Spec.Pool.Name}
		if !slices.Contains(st.pools, k) {
			st.pools = append(st.pools, k)
		}
	}
	st.costs, st.gpuTotal, st.plain = nodeDevicesOf(st.slices, b.gpuDrv)
}

func (b *incremental) derivePods(node string, n *v1.Node, st *nodeState) {
	b.countPVCs(st.pvcKeys, -1)
	b.podsPart(node, n, st, nil)
	b.countPVCs(st.pvcKeys, 1)
}

// podsPart derives the pods part of st from the node's pods, leaving out those in skip (a
// what-if's victims, whatif.go). It changes nothing but st.
func (b *incremental) podsPart(node string, n *v1.Node, st *nodeState, skip map[objKey]bool) {
	st.requested = v1.ResourceList{}
	st.pods = 0
	st.pvcKeys = nil
	st.view = framework.NewNodeInfo()
	st.view.SetNode(n)
	for k, pe := range b.podsByNode[node] {
		if skip[k] {
			continue
		}
		addList(st.requested, pe.requests)
		st.pods++
		if pe.info != nil {
			st.view.AddPodInfo(pe.info)
			st.pvcKeys = append(st.pvcKeys, pe.pvcKeys...)
		}
	}
}

func (b *incremental) countPVCs(keys []string, delta int) {
	if len(keys) == 0 {
		return
	}
	if b.pvcPublished {
		own := make(map[string]int, len(b.pvcRefs))
		for k, n := range b.pvcRefs {
			own[k] = n
		}
		b.pvcRefs = own
		b.pvcPublished = false
	}
	for _, k := range keys {
		if b.pvcRefs[k] += delta; b.pvcRefs[k] <= 0 {
			delete(b.pvcRefs, k)
		}
	}
}

// deriveAllocs sums the results in the pools the node has, claims in name order (as New).
func (b *incremental) deriveAllocs(node string, st *nodeState) { b.allocsPart(node, st, nil) }

// allocsPart is deriveAllocs leaving out the claims in skip (a what-if's released claims,
// whatif.go). It changes nothing but st.
func (b *incremental) allocsPart(node string, st *nodeState, skip map[objKey]bool) {
	var claims []*resourceapi.ResourceClaim
	seen := map[objKey]bool{}
	for _, p := range st.pools {
		if b.poolNode[p] != node {
			continue
		}
		for k, ce := range b.claimsByPool[p] {
			if !seen[k] && !skip[k] {
				seen[k] = true
				claims = append(claims, ce.claim)
			}
		}
	}
	sort.Slice(claims, func(i, j int) bool { return claimLess(claims[i], claims[j]) })
	st.allocated = newAllocatedState()
	st.gpuUsed = 0
	for _, c := range claims {
		results := c.Status.Allocation.Devices.Results
		for i := range results {
			r := &results[i]
			if ptr.Deref(r.AdminAccess, false) || b.poolNode[poolKey{r.Driver, r.Pool}] != node {
				continue
			}
			st.gpuUsed += st.costs[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)].Result(r)
			addResult(&st.allocated, r, b.cfg.Features.ConsumableCapacity)
		}
	}
}

// deriveSharedAllocs collects the results in pools no known node publishes.
func (b *incremental) deriveSharedAllocs() { b.sharedAlloc = b.sharedAllocsOf(nil) }

// sharedAllocsOf collects the results in pools no known node publishes, leaving out the
// claims in skip.
func (b *incremental) sharedAllocsOf(skip map[objKey]bool) structured.AllocatedState {
	out := newAllocatedState()
	for p, claims := range b.claimsByPool {
		if _, owned := b.poolNode[p]; owned {
			continue
		}
		for k, ce := range claims {
			if skip[k] {
				continue
			}
			results := ce.claim.Status.Allocation.Devices.Results
			for i := range results {
				r := &results[i]
				if ptr.Deref(r.AdminAccess, false) || (poolKey{r.Driver, r.Pool}) != p {
					continue
				}
				addResult(&out, r, b.cfg.Features.ConsumableCapacity)
			}
		}
	}
	return out
}

// publishClaims lays the changed claims over the index, merging the layers once the
// changes are a good part of the whole (so a lookup stays two map reads and an update
// costs about what changed).
func (b *incremental) publishClaims(delta map[objKey]*resourceapi.ResourceClaim) {
	if len(delta) == 0 {
		return
	}
	next := make(map[objKey]*resourceapi.ResourceClaim, len(b.claimIdx.delta)+len(delta))
	for k, c := range b.claimIdx.delta {
		next[k] = c
	}
	for k, c := range delta {
		next[k] = c
	}
	if len(next) <= len(b.claimIdx.base)/8+32 {
		b.claimIdx = claimIndex{base: b.claimIdx.base, delta: next}
		return
	}
	base := make(map[objKey]*resourceapi.ResourceClaim, len(b.claims))
	for k, ce := range b.claims {
		base[k] = ce.claim
	}
	b.claimIdx = claimIndex{base: base}
}

func (b *incremental) snapshot(in Input, nodeSet bool) *Snapshot {
	s := b.build(in, b.cfg, nil, b.pvcRefs, b.sharedAlloc, b.claimIdx)
	b.pvcPublished = true
	if nodeSet && b.cfg.Cache != nil {
		b.cfg.Cache.retain(s.byName)
	}
	s.inc, s.epoch, s.devicesEpoch = b, b.epoch, b.devicesEpoch
	return s
}

// build returns a snapshot of the state, with the nodes in override derived otherwise (a
// what-if's, whatif.go) and the given pvcRefs, network-attached allocations and claims.
// Every node shares its derived state with the incremental state (copy on write); the
// caller marks pvcRefs published when it is b's.
func (b *incremental) build(in Input, cfg Config, override map[string]*nodeState, pvcRefs map[string]int, sharedAlloc structured.AllocatedState, claims claimIndex) *Snapshot {
	s := newSnapshot(in, cfg, len(b.sorted))
	s.poolNode = b.poolNode
	infos := make([]NodeInfo, len(b.sorted))
	views := make([]*framework.NodeInfo, len(b.sorted))
	for i, name := range b.sorted {
		ne := b.nodes[name]
		st := ne.st
		if o := override[name]; o != nil {
			st = o
		}
		infos[i] = NodeInfo{
			Node: ne.node, Slices: st.slices, Requested: st.requested, Pods: st.pods,
			Allocated: st.allocated, GPUTotal: st.gpuTotal, GPUUsed: st.gpuUsed,
			plainGPUs: st.plain, costs: st.costs, shared: true,
		}
		s.Nodes = append(s.Nodes, &infos[i])
		s.byName[name] = &infos[i]
		views[i] = st.view
	}
	s.sharedSlices = b.sharedSlices
	s.sharedCosts = b.sharedCosts
	s.sharedAllocated = sharedAlloc
	s.Pods = filters.NewSharedView(views, pvcRefs)
	s.Pods.SetExtendedResources(s.extended)
	s.claims = claims
	return s
}
