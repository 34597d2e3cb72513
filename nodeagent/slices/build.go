// Package slices turns a node's discovered GPUs and its partition plan into
// the ResourceSlices of one pool, within the API's limits, with health taints.
package slices

import (
	"fmt"
	"slices"
	"sort"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/partition"

	"github.com/tessera-gpu/tessera/contract"
)

const (
	// DriverName is tessera's DRA driver name.
	DriverName = contract.DriverName
	// TaintKeyXID taints the devices of a GPU with a critical XID or ECC error.
	TaintKeyXID = contract.TaintKeyXID
	// TaintKeyLost taints the devices of a GPU that is gone.
	TaintKeyLost = contract.TaintKeyLost
)

// Features are the DRA features the cluster serves.
type Features struct {
	// PartitionableDevices (shared counters) are needed for dynamic MIG.
	PartitionableDevices bool
	// ConsumableCapacity is needed for shared GPUs.
	ConsumableCapacity bool
	// DeviceTaints are needed to publish health.
	DeviceTaints bool
}

// AllFeatures is what a current cluster serves.
var AllFeatures = Features{PartitionableDevices: true, ConsumableCapacity: true, DeviceTaints: true}

// The DRA feature gates the features stand for (contract.Mode.RequiredFeatures
// names them; the API server's DroppedFieldsError does too).
const (
	FeaturePartitionableDevices = "DRAPartitionableDevices"
	FeatureConsumableCapacity   = "DRAConsumableCapacity"
	FeatureDeviceTaints         = "DRADeviceTaints"
)

// Has says whether the cluster serves the named feature gate; unknown names
// are assumed served.
func (f Features) Has(gate string) bool {
	switch gate {
	case FeaturePartitionableDevices:
		return f.PartitionableDevices
	case FeatureConsumableCapacity:
		return f.ConsumableCapacity
	case FeatureDeviceTaints:
		return f.DeviceTaints
	}
	return true
}

// Without returns the features with the named feature gate turned off.
func (f Features) Without(gate string) Features {
	switch gate {
	case FeaturePartitionableDevices:
		f.PartitionableDevices = false
	case FeatureConsumableCapacity:
		f.ConsumableCapacity = false
	case FeatureDeviceTaints:
		f.DeviceTaints = false
	}
	return f
}

// Input is what a pool is built from.
type Input struct {
	Node     *discovery.Node
	Plan     *partition.Plan
	Features Features
	// Unhealthy lists the current unhealthy conditions (health.Broadcaster.Unhealthy).
	Unhealthy []health.Event
	// Withdrawn lists, by GPU UUID, device types not to publish for now.
	Withdrawn map[string][]contract.DeviceType
}

// Counts are the published devices by type.
type Counts struct {
	Whole  int `json:"whole"`
	MIG    int `json:"mig"`
	Shared int `json:"shared"`
}

func (c *Counts) sub(t contract.DeviceType) {
	switch t {
	case contract.TypeGPU:
		c.Whole--
	case contract.TypeMIG:
		c.MIG--
	case contract.TypeShared:
		c.Shared--
	}
}

// Result is a built pool.
type Result struct {
	Pool   resourceslice.Pool
	Counts Counts
	// Degraded explains every GPU offered with less than its plan asks for,
	// because the cluster lacks a feature.
	Degraded []string
}

// limits of the ResourceSlice API (k8s.io/api/resource/v1).
const (
	maxDevices         = resourceapi.ResourceSliceMaxDevices
	maxDevicesAdvanced = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
	maxCounterSets     = resourceapi.ResourceSliceMaxCounterSets
)

// group is the devices of one GPU, kept together in one slice where possible.
type group struct {
	devices  []resourceapi.Device
	advanced bool // uses counters or taints
}

// Build builds the pool of a node.
func Build(in Input) Result {
	var res Result
	var groups []group
	var counterSets []resourceapi.CounterSet
	taints := taintsByGPU(in.Unhealthy, in.Features.DeviceTaints)
	plan, degraded := Degrade(in.Node, in.Plan, in.Features)
	res.Degraded = degraded
	for i := range in.Node.GPUs {
		g := &in.Node.GPUs[i]
		gp := planFor(plan, g)
		mode := gp.Mode
		if !mode.PublishedThroughDRA() {
			// Served as an extended resource by the device plugin: never
			// published, so no DRA claim can get it too.
			continue
		}
		var devs []resourceapi.Device
		switch mode {
		case partition.ModeWhole:
			devs = append(devs, wholeDevice(in.Node, g))
			res.Counts.Whole++
		case partition.ModeDynamicMIG:
			cs, whole, migs := dynamicMIG(in.Node, g, gp.Profiles)
			counterSets = append(counterSets, cs)
			devs = append(devs, whole)
			devs = append(devs, migs...)
			res.Counts.Whole++
			res.Counts.MIG += len(migs)
		case partition.ModeStaticMIG:
			for _, inst := range g.MigInstances {
				p, ok := g.Profile(inst.Profile)
				if !ok {
					p = profileByID(g, inst.GIProfileID)
				}
				if p == nil {
					continue
				}
				d := migDevice(in.Node, g, *p, inst.Placement, inst.Profile)
				// A static MIG device consumes no counters (its GPU publishes no
				// counter set): its placement says where it is, and its size over
				// the parent's slice count prices it in GPU units
				// (contract.DeviceUnits).
				d.Attributes[contract.AttrPlacementStart] = integer(inst.Placement.Start)
				d.Attributes[contract.AttrPlacementSize] = integer(inst.Placement.Size)
				d.Attributes[contract.AttrParentMemorySlices] = integer(g.MemorySlices)
				if inst.UUID != "" {
					d.Attributes["uuid"] = str(inst.UUID)
				}
				devs = append(devs, d)
				res.Counts.MIG++
			}
		case partition.ModeShared:
			devs = append(devs, sharedDevice(in.Node, g, gp.Shared))
			res.Counts.Shared++
		}
		if w := in.Withdrawn[g.UUID]; len(w) > 0 {
			kept := devs[:0]
			for _, d := range devs {
				if !slices.Contains(w, contract.TypeOf(&d)) {
					kept = append(kept, d)
				} else {
					res.Counts.sub(contract.TypeOf(&d))
				}
			}
			devs = kept
		}
		t := taints[g.UUID]
		advanced := len(t) > 0
		for j := range devs {
			if len(t) > 0 {
				devs[j].Taints = append([]resourceapi.DeviceTaint(nil), t...)
			}
			advanced = advanced || len(devs[j].ConsumesCounters) > 0
		}
		if len(devs) > 0 {
			groups = append(groups, group{devices: devs, advanced: advanced})
		}
	}

	var out []resourceslice.Slice
	for len(counterSets) > 0 {
		n := min(len(counterSets), maxCounterSets)
		out = append(out, resourceslice.Slice{SharedCounters: counterSets[:n]})
		counterSets = counterSets[n:]
	}
	out = append(out, pack(groups)...)
	if len(out) == 0 {
		// An empty pool says "the driver runs and has no devices", which
		// differs from no pool at all.
		out = append(out, resourceslice.Slice{})
	}
	res.Pool = resourceslice.Pool{Slices: out}
	return res
}

// Degrade returns the plan as the cluster can serve it: a GPU whose mode
// needs a DRA feature the cluster lacks (contract.Mode.RequiredFeatures:
// partitionable devices for dynamic MIG, consumable capacity for shared
// GPUs) is offered whole. It explains every change; the plan given is not
// modified. The agent applies it before preparing MIG state, so that a GPU
// offered whole is not left in MIG mode.
func Degrade(node *discovery.Node, plan *partition.Plan, f Features) (*partition.Plan, []string) {
	if plan == nil {
		return nil, nil
	}
	out := *plan
	out.GPUs = append([]partition.GPUPlan(nil), plan.GPUs...)
	var reasons []string
	for i := range out.GPUs {
		gp := &out.GPUs[i]
		what := fmt.Sprintf("GPU %d (%s)", gp.Index, gp.UUID)
		if g, ok := node.GPUByUUID(gp.UUID); ok {
			what = fmt.Sprintf("GPU %d (%s, %s)", g.Index, g.ProductName, g.UUID)
		}
		for _, gate := range gp.Mode.RequiredFeatures() {
			if f.Has(gate) {
				continue
			}
			reasons = append(reasons, fmt.Sprintf("%s is offered whole instead of %s: the cluster does not serve %s (%s)", what, gp.Mode, featureDescription[gate], gate))
			gp.Mode, gp.Profiles, gp.Layout, gp.Shared = partition.ModeWhole, nil, nil, partition.SharedPlan{}
			break
		}
	}
	return &out, reasons
}

var featureDescription = map[string]string{
	FeaturePartitionableDevices: "partitionable devices",
	FeatureConsumableCapacity:   "consumable capacity",
	FeatureDeviceTaints:         "device taints",
}

// pack puts groups into slices of at most 128 devices, or 64 where a device
// uses counters or taints, splitting a group only when it alone is too big.
func pack(groups []group) []resourceslice.Slice {
	var out []resourceslice.Slice
	var cur []resourceapi.Device
	curAdvanced := false
	flush := func() {
		if len(cur) > 0 {
			out = append(out, resourceslice.Slice{Devices: cur})
		}
		cur, curAdvanced = nil, false
	}
	for _, g := range groups {
		limit := maxDevices
		if curAdvanced || g.advanced {
			limit = maxDevicesAdvanced
		}
		if len(cur)+len(g.devices) > limit {
			flush()
		}
		devs := g.devices
		groupLimit := maxDevices
		if g.advanced {
			groupLimit = maxDevicesAdvanced
		}
		for len(devs) > groupLimit {
			out = append(out, resourceslice.Slice{Devices: devs[:groupLimit]})
			devs = devs[groupLimit:]
		}
		cur = append(cur, devs...)
		curAdvanced = curAdvanced || g.advanced
	}
	flush()
	return out
}

func planFor(plan *partition.Plan, g *discovery.GPU) partition.GPUPlan {
	if plan != nil {
		for _, gp := range plan.GPUs {
			if gp.UUID == g.UUID {
				return gp
			}
		}
	}
	return partition.GPUPlan{Index: g.Index, UUID: g.UUID, Mode: partition.ModeWhole}
}

func profileByID(g *discovery.GPU, id int) *discovery.MigProfile {
	for i := range g.MigProfiles {
		if g.MigProfiles[i].GIProfileID == id {
			return &g.MigProfiles[i]
		}
	}
	return nil
}

func taintsByGPU(events []health.Event, enabled bool) map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	if !enabled {
		return out
	}
	sorted := append([]health.Event(nil), events...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Kind < sorted[j].Kind })
	for _, ev := range sorted {
		if ev.Healthy {
			continue
		}
		t := resourceapi.DeviceTaint{Key: TaintKeyXID, Effect: resourceapi.DeviceTaintEffectNoSchedule}
		switch ev.Kind {
		case health.KindLost:
			t = resourceapi.DeviceTaint{Key: TaintKeyLost, Effect: resourceapi.DeviceTaintEffectNoExecute}
		case health.KindECC:
			t.Value = "ecc"
		default:
			t.Value = strconv.FormatUint(ev.XID, 10)
		}
		if !ev.Time.IsZero() {
			t.TimeAdded = ptr.To(metav1.NewTime(ev.Time.Truncate(1e9)))
		}
		out[ev.UUID] = append(out[ev.UUID], t)
	}
	return out
}

func str(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}
func version(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{VersionValue: ptr.To(s)}
}
func integer(i int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
}
func quantity(v int64) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(v, resource.BinarySI)}
}

// gpuAttributes are the attributes every device of a GPU carries, named as
// NVIDIA's own DRA driver names them so that its CEL selectors work.
func gpuAttributes(n *discovery.Node, g *discovery.GPU, typ contract.DeviceType) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		contract.AttrType:                  str(string(typ)),
		contract.AttrProductName:           str(g.ProductName),
		contract.AttrBrand:                 str(g.Brand),
		contract.AttrArchitecture:          str(g.Architecture),
		contract.AttrCUDAComputeCapability: version(g.CUDAComputeCapability),
		contract.AttrDriverVersion:         version(n.DriverVersion),
		contract.AttrCUDADriverVersion:     version(n.CUDADriverVersion),
		contract.AttrIndex:                 integer(g.Index),
		contract.AttrMinor:                 integer(g.Minor),
	}
	if g.PCIBusID != "" {
		a[contract.AttrPCIBusID] = str(g.PCIBusID)
	}
	if g.PCIeRoot != "" {
		a[contract.AttrPCIeRoot] = str(g.PCIeRoot)
	}
	return a
}

func wholeDevice(n *discovery.Node, g *discovery.GPU) resourceapi.Device {
	d := resourceapi.Device{
		Name:       devicename.GPU(g.Minor),
		Attributes: gpuAttributes(n, g, contract.TypeGPU),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			contract.CapMemory: quantity(int64(g.MemoryBytes)),
		},
	}
	d.Attributes[contract.AttrUUID] = str(g.UUID)
	if g.Multiprocessors > 0 {
		d.Capacity[contract.CapMultiprocessors] = quantity(int64(g.Multiprocessors))
	}
	return d
}

func sharedDevice(n *discovery.Node, g *discovery.GPU, sp partition.SharedPlan) resourceapi.Device {
	d := resourceapi.Device{
		Name:                     devicename.Shared(g.Minor),
		Attributes:               gpuAttributes(n, g, contract.TypeShared),
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			// Every capacity of a device that allows multiple allocations
			// is consumable, so only memory and the compute share are
			// capacities here; multiprocessors is an attribute.
			contract.CapMemory: {
				Value: *resource.NewQuantity(sp.Memory, resource.BinarySI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: resource.NewQuantity(sp.DefaultMemory, resource.BinarySI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(sp.MemoryStep, resource.BinarySI),
						Step: resource.NewQuantity(sp.MemoryStep, resource.BinarySI),
					},
				},
			},
			contract.CapCompute: {
				Value: *resource.NewQuantity(100, resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: resource.NewQuantity(sp.DefaultComputeShare, resource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  resource.NewQuantity(0, resource.DecimalSI),
						Max:  resource.NewQuantity(100, resource.DecimalSI),
						Step: resource.NewQuantity(1, resource.DecimalSI),
					},
				},
			},
		},
	}
	d.Attributes[contract.AttrUUID] = str(g.UUID)
	if g.Multiprocessors > 0 {
		d.Attributes[contract.AttrMultiprocessors] = integer(g.Multiprocessors)
	}
	return d
}

// CounterSetName is the counter set of a dynamic-MIG GPU.
func CounterSetName(minor int) string { return devicename.GPU(minor) + "-counters" }

// MemorySliceCounter is the counter of one MIG memory slice. Every slice is a
// counter of one, so that devices whose placements overlap can never be
// allocated together, while devices on disjoint slices can.
func MemorySliceCounter(i int) string { return contract.MemorySliceCounter(i) }

// ProfileCounter limits the number of instances of a profile that NVML
// allows at once (InstanceCount), where the placements alone do not.
func ProfileCounter(giProfileID int) string {
	return "profile-" + strconv.Itoa(giProfileID) + "-instances"
}

func one() resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
}

// dynamicMIG returns the counter set of a GPU, its whole device consuming
// every counter, and a device for every (profile, placement).
func dynamicMIG(n *discovery.Node, g *discovery.GPU, profiles []discovery.MigProfile) (resourceapi.CounterSet, resourceapi.Device, []resourceapi.Device) {
	cs := resourceapi.CounterSet{Name: CounterSetName(g.Minor), Counters: map[string]resourceapi.Counter{}}
	for i := 0; i < g.MemorySlices; i++ {
		cs.Counters[MemorySliceCounter(i)] = one()
	}
	for _, p := range profiles {
		if p.MaxInstances > 0 && p.MaxInstances < len(p.Placements) {
			cs.Counters[ProfileCounter(p.GIProfileID)] = resourceapi.Counter{Value: *resource.NewQuantity(int64(p.MaxInstances), resource.DecimalSI)}
		}
	}
	whole := wholeDevice(n, g)
	// The whole GPU needs every memory slice; it does not consume the
	// per-profile instance counters, which only limit MIG devices.
	wholeUse := map[string]resourceapi.Counter{}
	for i := 0; i < g.MemorySlices; i++ {
		wholeUse[MemorySliceCounter(i)] = one()
	}
	whole.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: cs.Name, Counters: wholeUse}}

	var migs []resourceapi.Device
	for _, p := range profiles {
		for _, pl := range p.Placements {
			d := migDevice(n, g, p, pl, p.Name)
			use := map[string]resourceapi.Counter{}
			for s := pl.Start; s < pl.Start+pl.Size; s++ {
				use[MemorySliceCounter(s)] = one()
			}
			if _, limited := cs.Counters[ProfileCounter(p.GIProfileID)]; limited {
				use[ProfileCounter(p.GIProfileID)] = one()
			}
			d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: cs.Name, Counters: use}}
			migs = append(migs, d)
		}
	}
	return cs, whole, migs
}

// MaxDynamicMIGAttributes is the most attributes a dynamic MIG device carries.
//
// Every component that watches ResourceSlices (tessera-scheduler, the kube-scheduler)
// holds each device's attribute map, and dynamic MIG publishes 25 devices per H100: on
// 5,000 such nodes a million maps. A Go map holds up to 14 entries in two groups of 8
// slots; the 15th doubles it to four. With a 128-byte DeviceAttribute a map of 9 to 14
// entries keeps 2.8 KB and one of 15 keeps 5.0 KB (BenchmarkAttributeMap): 4.8 GB of the
// scheduler's heap at that size (docs/benchmarks.md). A dynamic MIG device therefore does
// not carry what its counters already say: placementStart, placementSize and
// parentMemorySlices (the memory-slice counters it consumes are its placement, and
// contract.DeviceUnits prices it by them; its name says the placement to a reader). Then
// the devices of one profile on one GPU carry the same attributes, and a watcher that
// shares equal maps (informerset.SliceTransform) holds one map per (GPU, profile) instead
// of one per placement: 7 instead of 25 on an H100. A static MIG device, which consumes no
// counters, carries all three.
const MaxDynamicMIGAttributes = 13

// migDevice is a MIG device of profile p at placement pl: the attributes of its GPU, the
// parent UUID and the profile. Static MIG adds the placement (see MaxDynamicMIGAttributes).
func migDevice(n *discovery.Node, g *discovery.GPU, p discovery.MigProfile, pl discovery.Placement, profileName string) resourceapi.Device {
	a := gpuAttributes(n, g, contract.TypeMIG)
	a[contract.AttrParentUUID] = str(g.UUID)
	a[contract.AttrProfile] = str(profileName)
	d := resourceapi.Device{
		Name:       devicename.MIG(g.Minor, profileName, pl.Start),
		Attributes: a,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			contract.CapMemory:          quantity(int64(p.MemoryBytes)),
			contract.CapMultiprocessors: quantity(int64(p.Multiprocessors)),
			contract.CapCopyEngines:     quantity(int64(p.CopyEngines)),
			contract.CapDecoders:        quantity(int64(p.Decoders)),
			contract.CapEncoders:        quantity(int64(p.Encoders)),
			contract.CapJPEGEngines:     quantity(int64(p.JpegEngines)),
			contract.CapOFAEngines:      quantity(int64(p.OfaEngines)),
		},
	}
	return d
}
