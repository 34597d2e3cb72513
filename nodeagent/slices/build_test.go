package slices_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"

	"github.com/tessera-gpu/tessera/contract"
)

func setup(t *testing.T, backend, cfg string) (*discovery.Node, *partition.Plan) {
	t.Helper()
	lib, err := nvmlbackend.Open(backend)
	if err != nil {
		t.Fatal(err)
	}
	node, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	c, err := partition.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := partition.Resolve(c, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	return node, plan
}

func allDevices(r slices.Result) []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range r.Pool.Slices {
		out = append(out, s.Devices...)
	}
	return out
}

func TestLimitsOnABigNode(t *testing.T) {
	// 64 GPUs with dynamic MIG: 64 counter sets and thousands of devices.
	node, plan := setup(t, "mock:dgxh100?gpus=64", "default: {gpus: [{mode: dynamicMIG}]}")
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
	perGPU := 1
	for _, p := range node.GPUs[0].MigProfiles {
		perGPU += len(p.Placements)
	}
	if got := len(allDevices(res)); got != 64*perGPU {
		t.Fatalf("%d devices, want %d", got, 64*perGPU)
	}
	counterSlices, sets := 0, map[string]bool{}
	for i, s := range res.Pool.Slices {
		if len(s.SharedCounters) > 0 {
			counterSlices++
			if len(s.Devices) > 0 {
				t.Fatalf("slice %d mixes counters and devices", i)
			}
			if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
				t.Fatalf("slice %d has %d counter sets", i, len(s.SharedCounters))
			}
			for _, cs := range s.SharedCounters {
				sets[cs.Name] = true
				if len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
					t.Fatalf("counter set %s has %d counters", cs.Name, len(cs.Counters))
				}
			}
			continue
		}
		if len(s.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Fatalf("slice %d has %d devices with counters", i, len(s.Devices))
		}
		// A GPU's devices stay in one slice when they fit in one.
		minors := map[int]int{}
		for _, d := range s.Devices {
			n, err := devicename.Parse(d.Name)
			if err != nil {
				t.Fatal(err)
			}
			minors[n.Minor]++
			if len(d.Attributes)+len(d.Capacity) > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Fatalf("device %s has %d attributes and capacities", d.Name, len(d.Attributes)+len(d.Capacity))
			}
		}
		for m, n := range minors {
			if n != perGPU {
				t.Fatalf("slice %d holds %d of the %d devices of GPU %d", i, n, perGPU, m)
			}
		}
	}
	if counterSlices != 8 || len(sets) != 64 {
		t.Fatalf("%d counter slices with %d sets, want 8 with 64", counterSlices, len(sets))
	}
}

func TestWholeGPUsPackAndTaintsHalveTheLimit(t *testing.T) {
	// A synthetic node of 100 whole GPUs (more than a mock server holds).
	base, _ := setup(t, "mock:dgxa100?gpus=1", "")
	node := &discovery.Node{DriverVersion: base.DriverVersion, CUDADriverVersion: base.CUDADriverVersion}
	for i := 0; i < 100; i++ {
		g := base.GPUs[0]
		g.Index, g.Minor, g.UUID = i, i, fmt.Sprintf("GPU-%03d", i)
		node.GPUs = append(node.GPUs, g)
	}
	res := slices.Build(slices.Input{Node: node, Features: slices.AllFeatures})
	if len(res.Pool.Slices) != 1 || len(res.Pool.Slices[0].Devices) != 100 {
		t.Fatalf("100 whole GPUs without taints should fit one slice of 128, got %d slices", len(res.Pool.Slices))
	}
	// One tainted GPU makes its slice subject to the limit of 64.
	ev := []health.Event{{UUID: "GPU-070", Kind: health.KindXID, XID: 48, Time: time.Now()}}
	res = slices.Build(slices.Input{Node: node, Features: slices.AllFeatures, Unhealthy: ev})
	total := 0
	for i, s := range res.Pool.Slices {
		tainted := false
		for _, d := range s.Devices {
			tainted = tainted || len(d.Taints) > 0
		}
		if tainted && len(s.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Fatalf("slice %d: %d devices with a tainted one", i, len(s.Devices))
		}
		if len(s.Devices) > resourceapi.ResourceSliceMaxDevices {
			t.Fatalf("slice %d: %d devices", i, len(s.Devices))
		}
		total += len(s.Devices)
	}
	if total != 100 || len(res.Pool.Slices) != 2 {
		t.Fatalf("%d devices in %d slices, want 100 in 2", total, len(res.Pool.Slices))
	}
}

func TestDynamicMIGCounters(t *testing.T) {
	node, plan := setup(t, "mock:dgxh100?gpus=1", "default: {gpus: [{mode: dynamicMIG}]}")
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
	g := node.GPUs[0]
	var cs resourceapi.CounterSet
	for _, s := range res.Pool.Slices {
		if len(s.SharedCounters) == 1 {
			cs = s.SharedCounters[0]
		}
	}
	if cs.Name != slices.CounterSetName(g.Minor) {
		t.Fatalf("counter set %q", cs.Name)
	}
	for _, d := range allDevices(res) {
		if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != cs.Name {
			t.Fatalf("device %s consumes %+v", d.Name, d.ConsumesCounters)
		}
		use := d.ConsumesCounters[0].Counters
		for c := range use {
			if _, ok := cs.Counters[c]; !ok {
				t.Fatalf("device %s consumes unknown counter %s", d.Name, c)
			}
		}
		n, _ := devicename.Parse(d.Name)
		if n.Kind == devicename.KindGPU {
			if len(use) != g.MemorySlices {
				t.Fatalf("whole GPU consumes %d counters, want all %d memory slices", len(use), g.MemorySlices)
			}
			continue
		}
		target, err := node.Lookup(d.Name)
		if err != nil {
			t.Fatal(err)
		}
		for s := 0; s < g.MemorySlices; s++ {
			_, uses := use[slices.MemorySliceCounter(s)]
			inside := s >= target.Placement.Start && s < target.Placement.Start+target.Placement.Size
			if uses != inside {
				t.Fatalf("device %s (placement %+v) uses memory slice %d: %v", d.Name, target.Placement, s, uses)
			}
		}
		if p := d.Attributes["profile"]; p.StringValue == nil || *p.StringValue != n.Profile {
			t.Fatalf("device %s has profile attribute %v", d.Name, p)
		}
	}
	// NVML allows one 1g.10gb+me instance: its devices share a counter of 1.
	me, ok := g.Profile("1g.10gb+me")
	if !ok {
		t.Fatal("no 1g.10gb+me profile")
	}
	c, ok := cs.Counters[slices.ProfileCounter(me.GIProfileID)]
	if !ok || c.Value.Value() != int64(me.MaxInstances) {
		t.Fatalf("instance counter of 1g.10gb+me: %v %v", c, ok)
	}
}

func TestSharedDevice(t *testing.T) {
	node, plan := setup(t, "mock:dgxh200?gpus=1", "default: {gpus: [{mode: shared, shared: {reservedMemory: 1Gi, memoryStep: 512Mi, defaultComputeShare: 10}}]}")
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
	devs := allDevices(res)
	if len(devs) != 1 || devs[0].Name != devicename.Shared(0) || devs[0].AllowMultipleAllocations == nil || !*devs[0].AllowMultipleAllocations {
		t.Fatalf("devices %+v", devs)
	}
	mem := devs[0].Capacity["memory"]
	want := int64(node.GPUs[0].MemoryBytes) - 1<<30
	want -= want % (512 << 20)
	if mem.Value.Value() != want || mem.RequestPolicy.ValidRange.Step.Cmp(resource.MustParse("512Mi")) != 0 {
		t.Fatalf("memory capacity %+v, want %d in 512Mi steps", mem, want)
	}
	if c := devs[0].Capacity[contract.CapCompute]; c.Value.Value() != 100 || c.RequestPolicy.Default.Value() != 10 {
		t.Fatalf("compute capacity %+v", c)
	}
	if res.Counts.Shared != 1 {
		t.Fatalf("counts %+v", res.Counts)
	}
}

func TestDegradesWithoutFeatures(t *testing.T) {
	node, plan := setup(t, "mock:dgxb200?gpus=2", "default: {gpus: [{indices: [0], mode: dynamicMIG}, {indices: [1], mode: shared}]}")
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.Features{DeviceTaints: true}})
	if res.Counts != (slices.Counts{Whole: 2}) {
		t.Fatalf("counts %+v, want 2 whole GPUs", res.Counts)
	}
	if len(res.Degraded) != 2 || !strings.Contains(res.Degraded[0], "DRAPartitionableDevices") || !strings.Contains(res.Degraded[1], "DRAConsumableCapacity") {
		t.Fatalf("degraded %q", res.Degraded)
	}
	for _, s := range res.Pool.Slices {
		if len(s.SharedCounters) > 0 {
			t.Fatal("counters published without partitionable devices")
		}
	}
}

func TestTaints(t *testing.T) {
	node, plan := setup(t, "mock:dgxa100?gpus=2", "default: {gpus: [{indices: [0], mode: dynamicMIG}]}")
	now := time.Now()
	ev := []health.Event{
		{UUID: node.GPUs[0].UUID, Kind: health.KindXID, XID: 79, Time: now},
		{UUID: node.GPUs[1].UUID, Kind: health.KindLost, Time: now},
		{UUID: node.GPUs[1].UUID, Kind: health.KindECC, Time: now},
	}
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures, Unhealthy: ev})
	for _, d := range allDevices(res) {
		n, _ := devicename.Parse(d.Name)
		var got []string
		for _, tn := range d.Taints {
			got = append(got, tn.Key+"="+tn.Value+":"+string(tn.Effect))
		}
		want := "gpu.tessera.dev/xid=79:NoSchedule"
		if n.Minor == 1 {
			want = "gpu.tessera.dev/xid=ecc:NoSchedule,gpu.tessera.dev/gpu-lost=:NoExecute"
		}
		if strings.Join(got, ",") != want {
			t.Fatalf("device %s taints %v, want %s", d.Name, got, want)
		}
	}
	// Without the device-taints feature nothing is tainted.
	res = slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.Features{PartitionableDevices: true}, Unhealthy: ev})
	for _, d := range allDevices(res) {
		if len(d.Taints) > 0 {
			t.Fatalf("device %s tainted without the feature", d.Name)
		}
	}
}

func TestEmptyNodePublishesAnEmptyPool(t *testing.T) {
	res := slices.Build(slices.Input{Node: &discovery.Node{}, Features: slices.AllFeatures})
	if len(res.Pool.Slices) != 1 || len(res.Pool.Slices[0].Devices) != 0 {
		t.Fatalf("want one empty slice, got %+v", res.Pool.Slices)
	}
}

// A GPU in devicePlugin mode is served by the classic device plugin and must
// not appear in any slice: a GPU is offered through exactly one of the two.
func TestDevicePluginGPUsAreNotPublished(t *testing.T) {
	node, plan := setup(t, "mock:dgxh100?gpus=4", "default: {gpus: [{indices: [1, 3], mode: devicePlugin}, {indices: [2], mode: dynamicMIG}]}")
	if got := plan.DevicePluginGPUs(); fmt.Sprint(got) != "[1 3]" {
		t.Fatalf("device-plugin GPUs %v, want [1 3]", got)
	}
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
	for _, d := range allDevices(res) {
		n, err := devicename.Parse(d.Name)
		if err != nil {
			t.Fatal(err)
		}
		if n.Minor == node.GPUs[1].Minor || n.Minor == node.GPUs[3].Minor {
			t.Errorf("device %s of a devicePlugin GPU was published", d.Name)
		}
	}
	if res.Counts.Whole != 2 {
		t.Errorf("counts %+v, want 2 whole GPUs (0 and the dynamic-MIG 2)", res.Counts)
	}
}

// TestMIGDeviceAttributes: a dynamic MIG device carries at most MaxDynamicMIGAttributes
// (on a machine where every optional GPU attribute resolves, PCIe root included), without
// the placement start, size and parent slice count its counters already say, the same
// attributes as every device of its profile on its GPU, and is priced the same by its
// counters; a static MIG device, which consumes no counters, carries all three and is
// priced by them.
func TestMIGDeviceAttributes(t *testing.T) {
	node, plan := setup(t, "mock:dgxh100?gpus=1", "default: {gpus: [{mode: dynamicMIG}]}")
	g := &node.GPUs[0]
	if g.PCIBusID == "" {
		t.Fatal("the mock reports no PCI bus ID")
	}
	g.PCIeRoot = "pci0000:15" // as sysfs resolves it on a real machine
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
	var pool []*resourceapi.ResourceSlice
	for _, s := range res.Pool.Slices {
		pool = append(pool, &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
			Driver: contract.DriverName, Pool: resourceapi.ResourcePool{Name: "n"}, Devices: s.Devices, SharedCounters: s.SharedCounters,
		}})
	}
	costs := contract.Costs(pool)
	migs := 0
	byProfile := map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for _, d := range allDevices(res) {
		if contract.TypeOf(&d) != contract.TypeMIG {
			continue
		}
		migs++
		if len(d.Attributes) > slices.MaxDynamicMIGAttributes {
			t.Errorf("dynamic MIG device %s carries %d attributes, more than %d", d.Name, len(d.Attributes), slices.MaxDynamicMIGAttributes)
		}
		for _, a := range []resourceapi.QualifiedName{contract.AttrPlacementStart, contract.AttrPlacementSize, contract.AttrParentMemorySlices} {
			if _, ok := d.Attributes[a]; ok {
				t.Errorf("dynamic MIG device %s carries %s", d.Name, a)
			}
		}
		// The devices of one profile on one GPU carry equal attributes, so that a
		// watcher can share one map among them (informerset.SliceTransform).
		profile := *d.Attributes[contract.AttrProfile].StringValue
		if first, ok := byProfile[profile]; !ok {
			byProfile[profile] = d.Attributes
		} else if !reflect.DeepEqual(first, d.Attributes) {
			t.Errorf("dynamic MIG device %s: attributes %v differ from another %s device's %v", d.Name, d.Attributes, profile, first)
		}
		for _, a := range []resourceapi.QualifiedName{contract.AttrParentUUID, contract.AttrProfile, contract.AttrPCIeRoot} {
			if _, ok := d.Attributes[a]; !ok {
				t.Errorf("dynamic MIG device %s lacks %s", d.Name, a)
			}
		}
		target, err := node.Lookup(d.Name)
		if err != nil {
			t.Fatal(err)
		}
		want := float64(target.Placement.Size) / float64(g.MemorySlices)
		if got := costs[contract.DeviceRef{Driver: contract.DriverName, Pool: "n", Device: d.Name}].Units; got != want {
			t.Errorf("dynamic MIG device %s costs %v GPU, want %v", d.Name, got, want)
		}
	}
	if migs == 0 {
		t.Fatal("no dynamic MIG devices")
	}

	// Static MIG: a 3g.40gb at slices 4-7 and a 1g.10gb at slice 0.
	three, _ := g.Profile("3g.40gb")
	one, _ := g.Profile("1g.10gb")
	g.MigInstances = []discovery.MigInstance{
		{Profile: three.Name, GIProfileID: three.GIProfileID, Placement: discovery.Placement{Start: 4, Size: 4}, UUID: "MIG-a"},
		{Profile: one.Name, GIProfileID: one.GIProfileID, Placement: discovery.Placement{Start: 0, Size: 1}, UUID: "MIG-b"},
	}
	static := &partition.Plan{GPUs: []partition.GPUPlan{{Index: g.Index, UUID: g.UUID, Mode: partition.ModeStaticMIG}}}
	res = slices.Build(slices.Input{Node: node, Plan: static, Features: slices.AllFeatures})
	pool = pool[:0]
	for _, s := range res.Pool.Slices {
		pool = append(pool, &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: contract.DriverName, Pool: resourceapi.ResourcePool{Name: "n"}, Devices: s.Devices}})
	}
	costs = contract.Costs(pool)
	want := map[string]float64{"MIG-a": 0.5, "MIG-b": 0.125}
	wantSize := map[string]int64{"MIG-a": 4, "MIG-b": 1}
	wantStart := map[string]int64{"MIG-a": 4, "MIG-b": 0}
	devs := allDevices(res)
	if len(devs) != 2 {
		t.Fatalf("static MIG published %d devices, want 2", len(devs))
	}
	for _, d := range devs {
		uuid := contract.StringAttr(&d, contract.AttrUUID)
		if start, ok := contract.IntAttr(&d, contract.AttrPlacementStart); !ok || start != wantStart[uuid] {
			t.Errorf("static MIG device %s: placementStart %d %v", d.Name, start, ok)
		}
		if size, ok := contract.IntAttr(&d, contract.AttrPlacementSize); !ok || size != wantSize[uuid] {
			t.Errorf("static MIG device %s: placementSize %d %v", d.Name, size, ok)
		}
		if n, ok := contract.IntAttr(&d, contract.AttrParentMemorySlices); !ok || n != int64(g.MemorySlices) {
			t.Errorf("static MIG device %s: parentMemorySlices %d %v", d.Name, n, ok)
		}
		if got := costs[contract.DeviceRef{Driver: contract.DriverName, Pool: "n", Device: d.Name}].Units; got != want[uuid] {
			t.Errorf("static MIG device %s (%s) costs %v GPU, want %v", d.Name, uuid, got, want[uuid])
		}
	}
}
