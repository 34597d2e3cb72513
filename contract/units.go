package contract

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// GPU units are how quota, fair share and every view count GPUs: a whole GPU is 1, a
// MIG device the share of its GPU's memory slices it takes, a fraction of a shared GPU
// the share of the GPU's memory it consumes. This file is the only place that
// computes them from devices; the scheduler (controlplane/snapshot), the overview
// (tessera top, tessera get) and the catalog's demand estimates all call it.

// CounterSets are the shared counter sets of one pool: set name → counter → total.
type CounterSets map[string]map[string]resource.Quantity

// AddCounterSets adds the counter sets a slice publishes to sets (a pool usually
// publishes them in a slice of their own).
func (sets CounterSets) AddCounterSets(slice *resourceapi.ResourceSlice) {
	for _, cs := range slice.Spec.SharedCounters {
		m := map[string]resource.Quantity{}
		for name, c := range cs.Counters {
			m[name] = c.Value
		}
		sets[cs.Name] = m
	}
}

// StringAttr returns a device's string attribute, or "".
func StringAttr(d *resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// Capacity returns a device's capacity, or nil.
func Capacity(d *resourceapi.Device, name resourceapi.QualifiedName) *resource.Quantity {
	if c, ok := d.Capacity[name]; ok {
		q := c.Value
		return &q
	}
	return nil
}

// TypeOf returns the device's type attribute; devices of other drivers that have none
// are taken for a whole GPU unless they look like a MIG device (a parent UUID, shared
// counters) or a shared one (multiple allocations).
func TypeOf(d *resourceapi.Device) DeviceType {
	if t := StringAttr(d, AttrType); t != "" {
		return DeviceType(t)
	}
	switch {
	case StringAttr(d, AttrParentUUID) != "" || len(d.ConsumesCounters) > 0:
		return TypeMIG
	case ptr.Deref(d.AllowMultipleAllocations, false):
		return TypeShared
	}
	return TypeGPU
}

// DeviceUnits is what an exclusive allocation of device d of a GPU driver costs.
//
//   - a whole GPU is 1;
//   - a MIG device published with shared counters (dynamic MIG) is the memory counters it
//     consumes over all memory counters of its counter set: with tessera's counter of one
//     per memory slice, a 1g.10gb device on an 8-slice H100 is 1/8, a 3g.40gb 4/8; without
//     memory counters the largest share of any counter it consumes;
//   - a MIG device without counters (static MIG) is its placement size over its
//     parent's memory slices (AttrPlacementSize / AttrParentMemorySlices, which
//     tessera publishes on every MIG device), else its memory over its parent GPU's
//     (parentMemory, by parent UUID; nil when unknown);
//   - a shared GPU is 1 for an exclusive allocation; a share costs ShareUnits.
func DeviceUnits(d *resourceapi.Device, sets CounterSets, parentMemory func(uuid string) *resource.Quantity) float64 {
	if TypeOf(d) == TypeGPU {
		return 1
	}
	var best float64
	for _, cc := range d.ConsumesCounters {
		total := sets[cc.CounterSet]
		var memUsed, memTotal float64
		for name, c := range cc.Counters {
			t, ok := total[name]
			if !ok || t.IsZero() {
				continue
			}
			if IsMemoryCounter(name) {
				memUsed += c.Value.AsApproximateFloat64()
				continue
			}
			best = max(best, c.Value.AsApproximateFloat64()/t.AsApproximateFloat64())
		}
		if memUsed > 0 {
			for name, t := range total {
				if IsMemoryCounter(name) {
					memTotal += t.AsApproximateFloat64()
				}
			}
			return memUsed / memTotal
		}
	}
	if best > 0 {
		return best
	}
	if TypeOf(d) == TypeShared {
		return 1
	}
	if u, ok := sliceUnits(d); ok {
		return u
	}
	if parent := StringAttr(d, AttrParentUUID); parent != "" && parentMemory != nil {
		if pm, mem := parentMemory(parent), Capacity(d, CapMemory); pm != nil && mem != nil && !pm.IsZero() {
			return mem.AsApproximateFloat64() / pm.AsApproximateFloat64()
		}
	}
	return 0
}

// ShareUnits is what one share of a device with consumable capacity costs: the device's
// units times the consumed memory over the device's memory (10Gi of an 80Gi GPU is
// 0.125). Without memory on either side a share costs nothing.
func ShareUnits(deviceUnits float64, deviceMemory, consumedMemory *resource.Quantity) float64 {
	if deviceMemory == nil || consumedMemory == nil || deviceMemory.IsZero() {
		return 0
	}
	if deviceUnits <= 0 {
		deviceUnits = 1
	}
	return deviceUnits * consumedMemory.AsApproximateFloat64() / deviceMemory.AsApproximateFloat64()
}

// Cost is what allocations of one device cost, computed once per device.
type Cost struct {
	// Units of an exclusive allocation (DeviceUnits).
	Units float64
	// Memory of the device, for shares (nil: unknown).
	Memory *resource.Quantity
}

// CostOf computes a device's Cost (see DeviceUnits for the arguments).
func CostOf(d *resourceapi.Device, sets CounterSets, parentMemory func(uuid string) *resource.Quantity) Cost {
	return Cost{Units: DeviceUnits(d, sets, parentMemory), Memory: Capacity(d, CapMemory)}
}

// Result is what one allocation result of the device costs: admin access nothing, a
// share ShareUnits of its consumed memory, an exclusive allocation the device's units.
func (c Cost) Result(r *resourceapi.DeviceRequestAllocationResult) float64 {
	if ptr.Deref(r.AdminAccess, false) {
		return 0
	}
	if r.ShareID != nil {
		mem, ok := r.ConsumedCapacity[CapMemory]
		if !ok {
			return 0
		}
		return ShareUnits(c.Units, c.Memory, &mem)
	}
	return c.Units
}

// DeviceRef names a device of a pool.
type DeviceRef struct{ Driver, Pool, Device string }

// Costs computes the Cost of every device in slices, which should be all slices of the
// pools they belong to (one node's, say): counter sets are looked up per pool, and a
// static MIG device's parent GPU by UUID among the whole GPUs of the same slices.
func Costs(slices []*resourceapi.ResourceSlice) map[DeviceRef]Cost {
	gpuMemory := map[string]*resource.Quantity{}
	type poolKey struct{ driver, pool string }
	counters := map[poolKey]CounterSets{}
	for _, slice := range slices {
		pk := poolKey{slice.Spec.Driver, slice.Spec.Pool.Name}
		if counters[pk] == nil {
			counters[pk] = CounterSets{}
		}
		counters[pk].AddCounterSets(slice)
		for i := range slice.Spec.Devices {
			d := &slice.Spec.Devices[i]
			if TypeOf(d) == TypeGPU {
				if uuid := StringAttr(d, AttrUUID); uuid != "" {
					gpuMemory[uuid] = Capacity(d, CapMemory)
				}
			}
		}
	}
	parentMemory := func(uuid string) *resource.Quantity { return gpuMemory[uuid] }
	out := map[DeviceRef]Cost{}
	for _, slice := range slices {
		sets := counters[poolKey{slice.Spec.Driver, slice.Spec.Pool.Name}]
		for i := range slice.Spec.Devices {
			d := &slice.Spec.Devices[i]
			out[DeviceRef{slice.Spec.Driver, slice.Spec.Pool.Name, d.Name}] = CostOf(d, sets, parentMemory)
		}
	}
	return out
}
