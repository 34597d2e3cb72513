package contract

import (
	"math"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func qty(s string) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: resource.MustParse(s)}
}

func one() resourceapi.Counter { return resourceapi.Counter{Value: resource.MustParse("1")} }

// An H100 80GB in dynamic-MIG mode as the node agent publishes it: 8 memory-slice
// counters of one (NVIDIA MIG User Guide: 8 memory slices on H100 80GB).
func h100Counters() CounterSets {
	m := map[string]resource.Quantity{}
	for i := 0; i < 8; i++ {
		m[MemorySliceCounter(i)] = resource.MustParse("1")
	}
	m["profile-9-instances"] = resource.MustParse("1")
	return CounterSets{"gpu-0-counters": m}
}

func migDevice(start, size int, extra ...string) resourceapi.Device {
	use := map[string]resourceapi.Counter{}
	for s := start; s < start+size; s++ {
		use[MemorySliceCounter(s)] = one()
	}
	for _, e := range extra {
		use[e] = one()
	}
	return resourceapi.Device{
		Name:             "mig",
		Attributes:       map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrType: str(string(TypeMIG)), AttrParentUUID: str("GPU-0")},
		Capacity:         map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: qty("10Gi")},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters", Counters: use}},
	}
}

func TestDeviceUnits(t *testing.T) {
	parent := func(uuid string) *resource.Quantity {
		if uuid == "GPU-0" {
			q := resource.MustParse("80Gi")
			return &q
		}
		return nil
	}
	staticMIG := resourceapi.Device{
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrType: str(string(TypeMIG)), AttrParentUUID: str("GPU-0")},
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: qty("20Gi")},
	}
	orphanMIG := staticMIG
	orphanMIG.Attributes = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrType: str(string(TypeMIG)), AttrParentUUID: str("GPU-9")}
	otherDriverGPU := resourceapi.Device{Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: qty("40Gi")}}
	shared := resourceapi.Device{
		Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrType: str(string(TypeShared))},
		AllowMultipleAllocations: ptr.To(true),
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: qty("80Gi")},
	}
	// A counter style of another driver: one counter holding the number of memory slices.
	otherStyle := resourceapi.Device{ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "s", Counters: map[string]resourceapi.Counter{"memorySlices": {Value: resource.MustParse("3")}, "smSlices": {Value: resource.MustParse("1")}}}}}
	otherSets := CounterSets{"s": {"memorySlices": resource.MustParse("8"), "smSlices": resource.MustParse("7")}}
	computeOnly := resourceapi.Device{ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "s", Counters: map[string]resourceapi.Counter{"smSlices": {Value: resource.MustParse("2")}}}}}

	for _, tc := range []struct {
		name string
		d    resourceapi.Device
		sets CounterSets
		want float64
	}{
		{"whole GPU", resourceapi.Device{Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrType: str("gpu")}}, nil, 1},
		{"whole GPU of another driver (no type)", otherDriverGPU, nil, 1},
		{"1g.10gb: 1 of 8 slices", migDevice(3, 1), h100Counters(), 1.0 / 8},
		{"3g.40gb: 4 of 8 slices", migDevice(4, 4), h100Counters(), 4.0 / 8},
		{"7g.80gb: all 8 slices", migDevice(0, 8), h100Counters(), 1},
		{"1g.10gb+me: instance counter does not count as memory", migDevice(0, 1, "profile-9-instances"), h100Counters(), 1.0 / 8},
		{"static MIG 20Gi of 80Gi parent", staticMIG, nil, 0.25},
		{"static MIG, parent unknown", orphanMIG, nil, 0},
		{"other driver: memory counter 3 of 8", otherStyle, otherSets, 3.0 / 8},
		{"other driver: no memory counter, largest share", computeOnly, otherSets, 2.0 / 7},
		{"shared GPU allocated exclusively", shared, nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DeviceUnits(&tc.d, tc.sets, parent); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("DeviceUnits = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCostOfResults(t *testing.T) {
	shared := resourceapi.Device{
		Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrType: str(string(TypeShared))},
		AllowMultipleAllocations: ptr.To(true),
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: qty("80Gi"), CapCompute: qty("100")},
	}
	c := CostOf(&shared, nil, nil)
	share := &resourceapi.DeviceRequestAllocationResult{ShareID: ptr.To(types.UID("abc")), ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{CapMemory: resource.MustParse("10Gi")}}
	if got := c.Result(share); got != 0.125 {
		t.Errorf("10Gi share of 80Gi = %v, want 0.125", got)
	}
	computeOnly := &resourceapi.DeviceRequestAllocationResult{ShareID: ptr.To(types.UID("abc")), ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{CapCompute: resource.MustParse("50")}}
	if got := c.Result(computeOnly); got != 0 {
		t.Errorf("share without memory = %v, want 0", got)
	}
	admin := &resourceapi.DeviceRequestAllocationResult{AdminAccess: ptr.To(true)}
	if got := (Cost{Units: 1}).Result(admin); got != 0 {
		t.Errorf("admin access = %v, want 0", got)
	}
	if got := (Cost{Units: 0.5}).Result(&resourceapi.DeviceRequestAllocationResult{}); got != 0.5 {
		t.Errorf("exclusive = %v, want 0.5", got)
	}
}

func TestModes(t *testing.T) {
	for _, m := range Modes {
		if !m.Valid() {
			t.Errorf("%s not valid", m)
		}
		if m.PublishedThroughDRA() != (len(m.DeviceTypes()) > 0) {
			t.Errorf("%s: published through DRA %v but device types %v", m, m.PublishedThroughDRA(), m.DeviceTypes())
		}
	}
	if Mode("spatial").Valid() {
		t.Error("unknown mode valid")
	}
	if ModeWhole.NeedsMIGMode() || !ModeDynamicMIG.NeedsMIGMode() || !ModeStaticMIG.NeedsMIGMode() {
		t.Error("MIG mode traits wrong")
	}
}

func TestFractionUnits(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want float64
		ok   bool
	}{
		{map[string]string{AnnotationGPUFraction: "0.5"}, 0.5, true},
		// KAI: a fraction of each of num-devices GPUs: 0.25 × 4 GPUs = 1 unit.
		{map[string]string{AnnotationGPUFraction: "0.25", AnnotationGPUFractionNumDevices: "4"}, 1, true},
		{map[string]string{AnnotationGPUFraction: "1.5"}, 0, false},
		{map[string]string{AnnotationGPUFraction: "half"}, 0, false},
		{map[string]string{AnnotationGPUFraction: "0.5", AnnotationGPUFractionNumDevices: "0"}, 0, false},
		{nil, 0, false},
	} {
		got, ok := FractionUnits(tc.ann)
		if got != tc.want || ok != tc.ok {
			t.Errorf("FractionUnits(%v) = %v, %v; want %v, %v", tc.ann, got, ok, tc.want, tc.ok)
		}
	}
}
