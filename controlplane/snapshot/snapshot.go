// Package snapshot is the scheduler's in-memory view of the cluster for one scheduling cycle:
// nodes with their ResourceSlices, what pods request on them, which devices are allocated, and
// what a device is worth in GPU units. The gang solver searches on it; the structured allocator
// from k8s.io/dynamic-resource-allocation decides device feasibility on one node at a time.
package snapshot

import (
	"context"
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/filters"
)

// DefaultGPUDriver is the DRA driver whose devices count as GPUs.
const DefaultGPUDriver = contract.DriverName

// Config says how to interpret the cluster.
type Config struct {
	// Features the structured allocator uses. Must be every feature the cluster serves: a zero
	// value silently turns off prioritized lists, partitionable devices, consumable capacity
	// and device taints.
	Features structured.Features
	// GPUDrivers are the DRA drivers whose devices are counted in GPU units. Default:
	// gpu.tessera.dev.
	GPUDrivers []string
	// CELCache compiles selectors once across cycles. Created when nil.
	CELCache *cel.Cache
	// PodInfos keeps the kube-scheduler's parsed view of bound pods across cycles; nil
	// parses every pod each time.
	PodInfos *filters.PodInfoCache
	// Cache keeps what the snapshot derives from unchanged objects across cycles (see
	// Cache); nil derives everything each time.
	Cache *Cache
	// AllDevices shows the allocator every device of a node instead of the pre-selected
	// ones (prefilter.go): the path before pre-selection, kept so that benchmarks and
	// equivalence tests can compare both in one run. The decisions are the same.
	AllDevices bool
	// NoFitCheck turns off the count check that rejects a node before the allocator runs
	// when it has too few free matching devices (fit.go): kept so that benchmarks and
	// equivalence tests can compare both in one run. The decisions are the same; only the
	// allocator steps taken differ.
	NoFitCheck bool
	// NoElision gives the allocator the claims' selectors even where pre-selection has
	// already answered them (elide.go): kept so that benchmarks and equivalence tests can
	// compare both in one run. The decisions and the allocator steps are the same.
	NoElision bool
}

// Input is the raw state a snapshot is built from (informer listers, plus the scheduler's
// assumed changes that the informers have not caught up with yet).
type Input struct {
	Nodes   []*v1.Node
	Pods    []*v1.Pod
	Slices  []*resourceapi.ResourceSlice
	Claims  []*resourceapi.ResourceClaim
	Classes []*resourceapi.DeviceClass
}

// NodeInfo is one node and what is in use on it.
type NodeInfo struct {
	Node *v1.Node
	// Slices published for this node (spec.nodeName).
	Slices []*resourceapi.ResourceSlice
	// Requested is the sum of the requests of non-terminal pods bound or assumed on the node.
	Requested v1.ResourceList
	// Pods is how many non-terminal pods are on the node.
	Pods int
	// Allocated are the devices of the node's pools that claims hold.
	Allocated structured.AllocatedState
	// GPUTotal is the node's capacity in GPU units; GPUUsed what allocated claims hold of it.
	GPUTotal, GPUUsed float64

	// plainGPUs are the whole-GPU devices that consume no shared counters.
	plainGPUs []structured.DeviceID
	// costs are what allocations of the node's GPU-driver devices cost (a device not in
	// it costs nothing).
	costs map[structured.DeviceID]contract.Cost
	// shared: Requested and Allocated belong to the Cache (and to the snapshots of other
	// cycles) and are copied before the snapshot changes them (own).
	shared bool
}

// own copies what the node shares with other snapshots before this one changes it.
func (n *NodeInfo) own() {
	if !n.shared {
		return
	}
	n.Requested = n.Requested.DeepCopy()
	n.Allocated = cloneAllocated(n.Allocated)
	n.shared = false
}

func cloneAllocated(a structured.AllocatedState) structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         a.AllocatedDevices.Clone(),
		AllocatedSharedDeviceIDs: a.AllocatedSharedDeviceIDs.Clone(),
		AggregatedCapacity:       a.AggregatedCapacity.Clone(),
	}
}

// GPUFree is the node's free capacity in GPU units.
func (n *NodeInfo) GPUFree() float64 { return n.GPUTotal - n.GPUUsed }

// Name is the node's name.
func (n *NodeInfo) Name() string { return n.Node.Name }

// PlainGPUsFree counts the node's free whole GPUs that are not partitionable:
// whole-GPU devices of a GPU driver that consume no shared counters (the whole
// device of a dynamic-MIG GPU does) and that no claim holds. Placing a
// whole-GPU pod on such a GPU strands no MIG capacity.
func (n *NodeInfo) PlainGPUsFree() int {
	free := 0
	for _, id := range n.plainGPUs {
		if !n.Allocated.AllocatedDevices.Has(id) {
			free++
		}
	}
	return free
}

type poolKey struct{ driver, pool string }

// Snapshot is immutable apart from Assume, which the solver's caller uses to carry a placed
// gang into the next gang's search within the same cycle.
type Snapshot struct {
	cfg      Config
	features structured.Features
	celCache *cel.Cache
	classes  *classLister
	// extended maps extended resource names to DeviceClasses, with the kube-scheduler's
	// rules (explicit extendedResourceName, newest class wins; implicit
	// deviceclass.resource.kubernetes.io/<class>).
	extended *extendedresourcecache.ExtendedResourceCache

	Nodes  []*NodeInfo
	byName map[string]*NodeInfo
	// Pods is the kube-scheduler's view of the pods on the nodes, which its filter plugins
	// read (filters.View).
	Pods *filters.View

	sharedSlices    []*resourceapi.ResourceSlice
	sharedCosts     map[structured.DeviceID]contract.Cost
	sharedAllocated structured.AllocatedState
	// sharedOwned: sharedAllocated is this snapshot's own (else the Cache's: copied first).
	sharedOwned bool

	// poolNode maps a pool to the node that publishes it. Not changed once a snapshot has it.
	poolNode map[poolKey]string
	claims   claimIndex

	// inc is the incremental state this snapshot was published from at epoch (nil for New
	// and what-if snapshots): what-if snapshots of the same input reuse it (whatif.go).
	inc   *incremental
	epoch uint64
	// devicesEpoch is inc's when this snapshot was derived (0: not a Cache's snapshot).
	devicesEpoch uint64

	// pre is the device pre-selection of the nodes evaluated so far (prefilter.go).
	preMu sync.Mutex
	pre   map[string]*nodeDevices
}

// New builds a snapshot from scratch. It never fails: objects it cannot interpret are
// ignored the way the allocator would ignore them. A scheduler that builds one per cycle
// uses Cache.Snapshot instead, which derives the same snapshot from what changed.
func New(in Input, cfg Config) *Snapshot {
	cfg = defaults(cfg)
	s := newSnapshot(in, cfg, len(in.Nodes))
	s.sharedOwned = true
	gpuDrv := sets.New(cfg.GPUDrivers...)
	nodes := append([]*v1.Node(nil), in.Nodes...)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	infos := make([]NodeInfo, len(nodes))
	for i, node := range nodes {
		ni := &infos[i]
		*ni = NodeInfo{Node: node, Requested: v1.ResourceList{}, Allocated: newAllocatedState()}
		s.Nodes = append(s.Nodes, ni)
		s.byName[node.Name] = ni
	}
	for _, slice := range in.Slices {
		nodeName := ptr.Deref(slice.Spec.NodeName, "")
		if nodeName == "" {
			// Network-attached devices: visible from every node that matches the slice's
			// node selector; the allocator filters them per node.
			s.sharedSlices = append(s.sharedSlices, slice)
			continue
		}
		ni, ok := s.byName[nodeName]
		if !ok {
			continue
		}
		ni.Slices = append(ni.Slices, slice)
		// A pool is one node's (pool names are per node); should two nodes publish the
		// same pool, the first by name has it, whatever order the informer lists them in.
		k := poolKey{slice.Spec.Driver, slice.Spec.Pool.Name}
		if cur, ok := s.poolNode[k]; !ok || nodeName < cur {
			s.poolNode[k] = nodeName
		}
	}
	if cfg.Cache != nil {
		cfg.Cache.retain(s.byName)
	}
	for _, ni := range s.Nodes {
		// By name, as the allocator orders them: the same slices give the same list in every
		// cycle, whatever order the informer lists them in.
		sortSlices(ni.Slices)
		ni.costs, ni.GPUTotal, ni.plainGPUs = nodeDevicesOf(ni.Slices, gpuDrv)
	}
	sortSlices(s.sharedSlices)
	s.sharedCosts, _, _ = nodeDevicesOf(s.sharedSlices, gpuDrv)
	s.Pods = filters.NewView(in.Nodes, in.Pods, cfg.PodInfos)
	s.Pods.SetExtendedResources(s.extended)
	for _, pod := range in.Pods {
		if pod.Spec.NodeName == "" || isTerminal(pod) {
			continue
		}
		if ni, ok := s.byName[pod.Spec.NodeName]; ok {
			addList(ni.Requested, PodRequests(pod))
			ni.Pods++
		}
	}
	// Claims in name order: a node's GPUUsed is a sum of floats, which must not depend on
	// the order the informer lists the claims in.
	claims := append([]*resourceapi.ResourceClaim(nil), in.Claims...)
	sort.Slice(claims, func(i, j int) bool { return claimLess(claims[i], claims[j]) })
	full := make(map[objKey]*resourceapi.ResourceClaim, len(claims))
	for _, claim := range claims {
		full[keyOf(&claim.ObjectMeta)] = claim
		if claim.Status.Allocation != nil {
			s.addAllocation(claim.Status.Allocation.Devices.Results)
		}
	}
	s.claims = claimIndex{base: full}
	return s
}

func defaults(cfg Config) Config {
	if len(cfg.GPUDrivers) == 0 {
		cfg.GPUDrivers = []string{DefaultGPUDriver}
	}
	if cfg.CELCache == nil {
		cfg.CELCache = NewCELCache(cfg.Features)
	}
	return cfg
}

// newSnapshot returns a snapshot with the parts that are built the same way by New and by
// Cache.Snapshot: the classes and extended resources (a handful of objects, built anew).
func newSnapshot(in Input, cfg Config, nodes int) *Snapshot {
	s := &Snapshot{
		cfg:             cfg,
		features:        cfg.Features,
		celCache:        cfg.CELCache,
		classes:         newClassLister(in.Classes),
		byName:          make(map[string]*NodeInfo, nodes),
		sharedAllocated: newAllocatedState(),
		poolNode:        make(map[poolKey]string),
		pre:             map[string]*nodeDevices{},
		Nodes:           make([]*NodeInfo, 0, nodes),
	}
	s.extended = extendedresourcecache.NewExtendedResourceCache(klog.Background())
	for _, c := range in.Classes {
		s.extended.OnAdd(c, true)
	}
	return s
}

func sortSlices(slices []*resourceapi.ResourceSlice) {
	sort.Slice(slices, func(i, j int) bool { return slices[i].Name < slices[j].Name })
}

// nodeDevicesOf derives from one node's slices (sorted) what a device allocation costs in
// GPU units, the node's GPU capacity and its whole GPUs that consume no shared counters.
func nodeDevicesOf(slices []*resourceapi.ResourceSlice, gpuDrv sets.Set[string]) (map[structured.DeviceID]contract.Cost, float64, []structured.DeviceID) {
	var total float64
	var plain []structured.DeviceID
	costs := map[structured.DeviceID]contract.Cost{}
	var byRef map[contract.DeviceRef]contract.Cost
	for _, slice := range slices {
		if !gpuDrv.Has(slice.Spec.Driver) {
			continue
		}
		if byRef == nil {
			byRef = contract.Costs(slices)
		}
		for i := range slice.Spec.Devices {
			d := &slice.Spec.Devices[i]
			id := structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, d.Name)
			costs[id] = byRef[contract.DeviceRef{Driver: slice.Spec.Driver, Pool: slice.Spec.Pool.Name, Device: d.Name}]
			if contract.TypeOf(d) == contract.TypeGPU {
				total++
				if len(d.ConsumesCounters) == 0 {
					plain = append(plain, id)
				}
			}
		}
	}
	return costs, total, plain
}

type objKey struct{ namespace, name string }

func keyOf(m *metav1.ObjectMeta) objKey { return objKey{m.Namespace, m.Name} }

func claimLess(a, b *resourceapi.ResourceClaim) bool {
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

// claimIndex finds claims by namespace/name: base, with delta laid over it (a nil value is
// a claim deleted since base). Neither map is changed once a snapshot has it.
type claimIndex struct {
	base, delta map[objKey]*resourceapi.ResourceClaim
}

func (c claimIndex) get(k objKey) *resourceapi.ResourceClaim {
	if cl, ok := c.delta[k]; ok {
		return cl
	}
	return c.base[k]
}

// NewCELCache returns a CEL cache that compiles with the given allocator features.
func NewCELCache(f structured.Features) *cel.Cache {
	return cel.NewCache(64, cel.Features{
		EnableConsumableCapacity: f.ConsumableCapacity,
		EnableListTypeAttributes: f.ListTypeAttributes,
	})
}

// Features returns the allocator features the snapshot uses.
func (s *Snapshot) Features() structured.Features { return s.features }

// Node returns the node of that name, or nil.
func (s *Snapshot) Node(name string) *NodeInfo { return s.byName[name] }

// Claim returns the claim namespace/name, or nil.
func (s *Snapshot) Claim(namespace, name string) *resourceapi.ResourceClaim {
	return s.claims.get(objKey{namespace, name})
}

// ResultUnits is the GPU units one device allocation result costs. A share of a device with
// consumable capacity costs its memory over the device's memory.
func (s *Snapshot) ResultUnits(r *resourceapi.DeviceRequestAllocationResult) float64 {
	if ptr.Deref(r.AdminAccess, false) {
		return 0
	}
	costs := s.sharedCosts
	if ni := s.byName[s.poolNode[poolKey{r.Driver, r.Pool}]]; ni != nil {
		costs = ni.costs
	}
	return costs[structured.MakeDeviceID(r.Driver, r.Pool, r.Device)].Result(r)
}

// AllocationUnits sums ResultUnits over an allocation.
func (s *Snapshot) AllocationUnits(a *resourceapi.AllocationResult) float64 {
	if a == nil {
		return 0
	}
	u := 0.0
	for i := range a.Devices.Results {
		u += s.ResultUnits(&a.Devices.Results[i])
	}
	return u
}

func (s *Snapshot) addAllocation(results []resourceapi.DeviceRequestAllocationResult) {
	for i := range results {
		r := &results[i]
		if ptr.Deref(r.AdminAccess, false) {
			// Admin access does not take the device (same rule as the kube-scheduler).
			continue
		}
		ni := s.byName[s.poolNode[poolKey{r.Driver, r.Pool}]]
		var state *structured.AllocatedState
		if ni != nil {
			ni.own()
			state = &ni.Allocated
			ni.GPUUsed += s.ResultUnits(r)
		} else {
			if !s.sharedOwned {
				s.sharedAllocated = cloneAllocated(s.sharedAllocated)
				s.sharedOwned = true
			}
			state = &s.sharedAllocated
		}
		addResult(state, r, s.features.ConsumableCapacity)
	}
}

func addResult(state *structured.AllocatedState, r *resourceapi.DeviceRequestAllocationResult, consumable bool) {
	id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
	if consumable && r.ShareID != nil {
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
		return
	}
	state.AllocatedDevices.Insert(id)
}

// Assume records a placed pod and its new allocations in the snapshot, so that the next gang
// of the same cycle sees them as taken.
func (s *Snapshot) Assume(nodeName string, pod *v1.Pod, allocations []*resourceapi.AllocationResult) {
	if ni := s.byName[nodeName]; ni != nil {
		ni.own()
		addList(ni.Requested, PodRequests(pod))
		ni.Pods++
		// The node exists, so this cannot fail.
		_ = s.Pods.Assume(pod, nodeName)
	}
	for _, a := range allocations {
		if a != nil {
			s.addAllocation(a.Devices.Results)
		}
	}
}

// AllocateOnNode runs the structured allocator for claims on one node, with the node's
// allocated devices plus extra (devices chosen for other pods of the gang being placed) taken.
// A nil result and nil error means "does not fit".
func (s *Snapshot) AllocateOnNode(ctx context.Context, ni *NodeInfo, extra []resourceapi.AllocationResult, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	res, _, err := s.AllocateBounded(ctx, ni, extra, claims, 0)
	return res, err
}

// Allocation is the outcome of a bounded allocator call.
type Allocation struct {
	// Steps the allocator took (its search steps: one per device tried for a request).
	Steps int64
	// Rejected is set when the count check (fit.go) found too few free devices and the
	// allocator was not run; the result is then nil ("does not fit") and Steps 0.
	Rejected bool
	// Exhausted is set when the step budget ran out before the allocator decided; the
	// result is then nil ("not found within the budget").
	Exhausted bool
}

// AllocateBounded is AllocateOnNode with the allocator's search bounded by steps (0: no
// bound). The bound is work, not time, so the same snapshot gives the same answer on any
// machine under any load.
func (s *Snapshot) AllocateBounded(ctx context.Context, ni *NodeInfo, extra []resourceapi.AllocationResult, claims []*resourceapi.ResourceClaim, steps int64) ([]resourceapi.AllocationResult, Allocation, error) {
	// The allocator only reads the state (the kube-scheduler shares one across the nodes it
	// filters in parallel), so the node's own serves when nothing is added to it.
	state := ni.Allocated
	if len(extra) > 0 || len(s.sharedSlices) > 0 {
		state = cloneAllocated(ni.Allocated)
	}
	if len(s.sharedSlices) > 0 {
		state.AllocatedDevices = state.AllocatedDevices.Union(s.sharedAllocated.AllocatedDevices)
		state.AllocatedSharedDeviceIDs = state.AllocatedSharedDeviceIDs.Union(s.sharedAllocated.AllocatedSharedDeviceIDs)
		for id, c := range s.sharedAllocated.AggregatedCapacity {
			state.AggregatedCapacity[id] = c.Clone()
		}
	}
	for i := range extra {
		for j := range extra[i].Devices.Results {
			addResult(&state, &extra[i].Devices.Results[j], s.features.ConsumableCapacity)
		}
	}
	if s.cannotFit(ctx, ni, &state, claims) {
		return nil, Allocation{Rejected: true}, nil
	}
	slices, answered := s.restrictedSlices(ctx, ni, &state, extra, claims)
	var classes structured.DeviceClassLister = s.classes
	if answered && len(s.sharedSlices) == 0 {
		// Network-attached slices are not pre-selected, so their devices still need
		// the selectors.
		claims, classes = elideSelectors(claims, s.classes)
	}
	if len(s.sharedSlices) > 0 {
		slices = append(append([]*resourceapi.ResourceSlice(nil), slices...), s.sharedSlices...)
	}
	alloc, err := structured.NewAllocator(ctx, s.features, state, classes, slices, s.celCache)
	if err != nil {
		return nil, Allocation{}, fmt.Errorf("create allocator: %w", err)
	}
	sc := newStepContext(ctx, steps)
	res, err := alloc.Allocate(sc, ni.Node, claims)
	out := Allocation{Steps: sc.steps.Load(), Exhausted: sc.exhausted()}
	if out.Exhausted && ctx.Err() == nil {
		return nil, out, nil
	}
	return res, out, err
}

// SharedResult reports whether an allocation result is a device of a network-attached slice
// (no spec.nodeName): such a device may be reached from several nodes, so it is taken for the
// whole gang, not just for pods on one node.
func (s *Snapshot) SharedResult(r *resourceapi.DeviceRequestAllocationResult) bool {
	_, local := s.poolNode[poolKey{r.Driver, r.Pool}]
	return !local
}

// ExtendedClass returns the DeviceClass that backs an extended resource name, or nil.
func (s *Snapshot) ExtendedClass(name v1.ResourceName) *resourceapi.DeviceClass {
	return s.extended.GetDeviceClass(name)
}

// ExtendedResources returns, of a pod's requests (PodRequests), the extended resources that
// a DeviceClass backs (DRA extended resources, KEP-5004), in whole units; nil when none.
func (s *Snapshot) ExtendedResources(requests v1.ResourceList) map[v1.ResourceName]int64 {
	var out map[v1.ResourceName]int64
	for name, q := range requests {
		if q.IsZero() || s.extended.GetDeviceClass(name) == nil {
			continue
		}
		if out == nil {
			out = map[v1.ResourceName]int64{}
		}
		out[name] = q.Value()
	}
	return out
}

// HasSharedSlices reports whether any network-attached slice exists.
func (s *Snapshot) HasSharedSlices() bool { return len(s.sharedSlices) > 0 }

// PodRequests are the pod's resource requests (containers, init containers, overhead), as
// the kube-scheduler computes them.
func PodRequests(pod *v1.Pod) v1.ResourceList {
	return resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
}

func isTerminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

func newAllocatedState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

func addList(dst, src v1.ResourceList) {
	for name, q := range src {
		cur := dst[name]
		cur.Add(q)
		dst[name] = cur
	}
}

type classLister struct {
	byName map[string]*resourceapi.DeviceClass
	list   []*resourceapi.DeviceClass
}

func newClassLister(classes []*resourceapi.DeviceClass) *classLister {
	l := &classLister{byName: make(map[string]*resourceapi.DeviceClass, len(classes)), list: classes}
	for _, c := range classes {
		l.byName[c.Name] = c
	}
	return l
}

func (l *classLister) List() ([]*resourceapi.DeviceClass, error) { return l.list, nil }

func (l *classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l.byName[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("device class %q not found", name)
}
