package contract

import (
	"math"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// TestStaticMIGUnitsWithoutAWholeGPU: a staticMIG GPU publishes only its MIG
// devices (no whole-GPU device, no counters). Each is priced by its
// placement over the parent's memory slices, in Costs too, where no parent
// memory can be found.
func TestStaticMIGUnitsWithoutAWholeGPU(t *testing.T) {
	dev := func(name string, size int64) resourceapi.Device {
		return resourceapi.Device{
			Name: name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				AttrType: str(string(TypeMIG)), AttrParentUUID: str("GPU-static"),
				AttrPlacementSize: {IntValue: ptr.To(size)}, AttrParentMemorySlices: {IntValue: ptr.To(int64(8))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: qty("40Gi")},
		}
	}
	slice := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: DriverName, Pool: resourceapi.ResourcePool{Name: "node-1"},
		Devices: []resourceapi.Device{dev("gpu-0-mig-3g-40gb-0", 4), dev("gpu-0-mig-2g-20gb-4", 2), dev("gpu-0-mig-1g-10gb-6", 1)},
	}}
	costs := Costs([]*resourceapi.ResourceSlice{slice})
	want := map[string]float64{"gpu-0-mig-3g-40gb-0": 0.5, "gpu-0-mig-2g-20gb-4": 0.25, "gpu-0-mig-1g-10gb-6": 0.125}
	for name, units := range want {
		got := costs[DeviceRef{DriverName, "node-1", name}].Units
		if math.Abs(got-units) > 1e-9 {
			t.Errorf("%s: %v GPU units, want %v", name, got, units)
		}
	}
	// Without the slice attributes (another driver) the old rule applies:
	// no parent memory known, no units.
	bare := dev("x", 4)
	delete(bare.Attributes, AttrParentMemorySlices)
	if u := DeviceUnits(&bare, nil, nil); u != 0 {
		t.Errorf("MIG device without slice count or parent: %v units", u)
	}
}
