package snapshot

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

var allFeatures = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true, DeviceBindingAndStatus: true,
}

// randomClaim is one of the shapes a GPU cluster sees: whole GPUs (1–3, or all), a MIG
// profile, a whole GPU or else a MIG device (firstAvailable), a selector that fails at run
// time on devices without the attribute, admin access.
func randomClaim(r *rand.Rand, i int) *resourceapi.ResourceClaim {
	name := fmt.Sprintf("c%d", i)
	profiles := []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}
	var c *resourceapi.ResourceClaim
	switch r.Intn(12) {
	case 0, 1, 2:
		c = fixture.GPUClaim("ns", name, int64(1+r.Intn(2)))
	case 3, 4, 5, 6:
		c = fixture.MIGClaim("ns", name, profiles[r.Intn(len(profiles))])
	case 7, 8:
		c = fixture.GPUOrMIGClaim("ns", name, profiles[r.Intn(len(profiles))])
	case 9:
		// No class selector restricts to MIG devices here: "profile" is missing on whole
		// GPUs, so the expression fails there at run time.
		c = fixture.GPUClaim("ns", name, 1)
		c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "any"
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes[%q].profile == "1g.10gb"`, fixture.Driver)}}}
	default:
		c = fixture.GPUClaim("ns", name, 1)
		if r.Intn(2) == 0 {
			c.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
			c.Spec.Devices.Requests[0].Exactly.Count = 0
		} else {
			c.Spec.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true)
		}
	}
	c.UID = types.UID(name)
	return c
}

func classesWithAny() []*resourceapi.DeviceClass {
	return append(fixture.DeviceClasses(), &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "any"}})
}

// TestPreselectionSameAllocation: the allocator given the pre-selected devices returns what
// it returns given all of them — the same result or error, in the same number of steps — on
// random nodes (whole and partitionable GPUs, devices in use, devices the gang holds
// tentatively, binding conditions, network-attached GPUs beside them) and random claims.
func TestPreselectionSameAllocation(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewSource(1))
	var fits, noFit, failed, restricted, networked, rejected, elided, elidedFits int
	for round := 0; round < 300; round++ {
		node := fmt.Sprintf("n%d", round)
		in := Input{Nodes: []*v1.Node{fixture.Node(node, nil)}, Classes: classesWithAny()}
		partitionable := r.Intn(3) > 0
		if partitionable {
			in.Slices = fixture.PartitionableSlices(node, 1+r.Intn(8))
		} else {
			in.Slices = fixture.WholeGPUSlices(node, 1+r.Intn(8))
		}
		if r.Intn(4) == 0 {
			// A device with binding conditions puts its pool after the others; the
			// second pool makes that order matter.
			last := in.Slices[len(in.Slices)-1]
			d := &last.Spec.Devices[len(last.Spec.Devices)-1]
			d.BindingConditions = []string{"ready"}
			d.BindingFailureConditions = []string{"failed"}
			second := fixture.WholeGPUSlices(node, 2)[0]
			second.Name, second.Spec.Pool.Name = node+"-second", node+"-second"
			in.Slices = append(in.Slices, second)
		}
		// Devices in use: a random subset of the node's devices.
		var allocated, extraDevs []string
		for _, sl := range in.Slices {
			for _, d := range sl.Spec.Devices {
				switch r.Intn(16) {
				case 0:
					allocated = append(allocated, d.Name)
				case 1:
					extraDevs = append(extraDevs, d.Name)
				}
			}
		}
		if len(allocated) > 0 {
			in.Claims = append(in.Claims, fixture.AllocatedClaim("busy", "busy", node, allocated...))
		}
		var extra []resourceapi.AllocationResult
		for _, d := range extraDevs {
			extra = append(extra, resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: fixture.Driver, Pool: node, Device: d}}}})
		}
		if r.Intn(4) == 0 {
			// Network-attached GPUs (no nodeName): given to the allocator apart from the
			// node's devices, their allocated ones in the state are no device of the node.
			net := fixture.WholeGPUSlices("net", 2)[0]
			net.Spec.NodeName, net.Spec.AllNodes = nil, ptr.To(true)
			in.Slices = append(in.Slices, net)
			if r.Intn(2) == 0 {
				in.Claims = append(in.Claims, fixture.AllocatedClaim("busy", "net-busy", "net", "gpu-0"))
			}
			networked++
		}
		var claims []*resourceapi.ResourceClaim
		same := r.Intn(2) == 0 // the pods of a gang on one node: claims of one shape
		for i := 0; i < 1+r.Intn(3); i++ {
			c := randomClaim(r, i)
			if same && i > 0 {
				c = claims[0].DeepCopy()
				c.Name, c.UID = fmt.Sprintf("c%d", i), types.UID(fmt.Sprintf("c%d", i))
			}
			claims = append(claims, c)
		}
		on := New(in, Config{Features: allFeatures})
		// kept: pre-selection without selector elision (elide.go).
		kept := New(in, Config{Features: allFeatures, NoElision: true})
		off := New(in, Config{Features: allFeatures, AllDevices: true})
		// base: neither pre-selection nor the count check (fit.go), the allocator alone.
		base := New(in, Config{Features: allFeatures, AllDevices: true, NoFitCheck: true})
		for try := 0; try < 2; try++ { // the second call reuses the pre-selection
			want, wa, werr := off.AllocateBounded(ctx, off.Node(node), extra, claims, 0)
			got, ga, gerr := on.AllocateBounded(ctx, on.Node(node), extra, claims, 0)
			bres, ba, berr := base.AllocateBounded(ctx, base.Node(node), extra, claims, 0)
			kres, ka, kerr := kept.AllocateBounded(ctx, kept.Node(node), extra, claims, 0)
			if fmt.Sprint(kerr) != fmt.Sprint(gerr) || !reflect.DeepEqual(kres, got) || ka != ga {
				t.Fatalf("round %d: with selector elision %+v, %+v, %v; without %+v, %+v, %v", round, got, ga, gerr, kres, ka, kerr)
			}
			if fmt.Sprint(berr) != fmt.Sprint(gerr) || !reflect.DeepEqual(bres, got) {
				t.Fatalf("round %d: with the count check %+v, %v; the allocator alone %+v, %v", round, got, gerr, bres, berr)
			}
			if ga.Rejected {
				if try == 0 {
					rejected++
				}
				if ba.Exhausted || ba.Rejected || bres != nil || berr != nil {
					t.Fatalf("round %d: rejected where the allocator alone gives %+v, %+v, %v", round, ba, bres, berr)
				}
			}
			if fmt.Sprint(werr) != fmt.Sprint(gerr) {
				t.Fatalf("round %d: error %v with pre-selection, %v without", round, gerr, werr)
			}
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("round %d: allocation with pre-selection\n%+v\nwithout\n%+v", round, got, want)
			}
			if wa != ga {
				t.Fatalf("round %d: %+v with pre-selection, %+v without", round, ga, wa)
			}
			if try == 0 {
				switch {
				case gerr != nil:
					failed++
				case got == nil:
					noFit++
				default:
					fits++
				}
				state := cloneAllocated(on.Node(node).Allocated)
				for i := range extra {
					for j := range extra[i].Devices.Results {
						addResult(&state, &extra[i].Devices.Results[j], allFeatures.ConsumableCapacity)
					}
				}
				shown, answered := on.restrictedSlices(ctx, on.Node(node), &state, extra, claims)
				if devices(shown) < devices(in.Slices) {
					restricted++
				}
				if answered && !on.HasSharedSlices() {
					elided++
					if gerr == nil && got != nil {
						elidedFits++
					}
				}
			}
		}
	}
	// The cases must all occur, or the comparison proves little.
	t.Logf("%d fit, %d do not (%d of them rejected by the count check), %d errors; %d with fewer devices shown, %d with network-attached GPUs; %d with selectors elided (%d of them fit)", fits, noFit, rejected, failed, restricted, networked, elided, elidedFits)
	if fits < 30 || noFit < 30 || failed < 5 || restricted < 100 || networked < 30 || rejected < 10 || rejected == noFit || elided < 50 || elidedFits < 10 {
		t.Errorf("too few cases of some kind: %d fit, %d do not, %d errors, %d restricted, %d elided (%d fit)", fits, noFit, failed, restricted, elided, elidedFits)
	}
}

func devices(slices []*resourceapi.ResourceSlice) int {
	n := 0
	for _, s := range slices {
		n += len(s.Spec.Devices)
	}
	return n
}

// TestPreselectionLeavesInvalidPools: a pool the allocator rejects (two devices of the same
// name) stays rejected; leaving the duplicate out because it does not match would have made
// the pool valid.
func TestPreselectionLeavesInvalidPools(t *testing.T) {
	ctx := context.Background()
	slices := fixture.PartitionableSlices("n", 1)
	dup := slices[1].Spec.Devices[1] // a MIG device: no whole-GPU request matches it
	dup.Name = slices[1].Spec.Devices[0].Name
	slices[1].Spec.Devices = append(slices[1].Spec.Devices, dup)
	in := Input{Nodes: []*v1.Node{fixture.Node("n", nil)}, Slices: slices, Classes: fixture.DeviceClasses()}
	claims := []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", 1)}
	for _, preselect := range []bool{false, true} {
		s := New(in, Config{Features: allFeatures, AllDevices: !preselect})
		res, _, err := s.AllocateBounded(ctx, s.Node("n"), nil, claims, 0)
		if err == nil || res != nil {
			t.Errorf("pre-selection %v: %v, %v; want the invalid pool's error", preselect, res, err)
		}
	}
}

// TestPreselectionAcrossCycles: with a Cache, a node whose slices did not change keeps its
// pre-selection in the next snapshot; a changed slice gets a new one.
func TestPreselectionAcrossCycles(t *testing.T) {
	ctx := context.Background()
	cache := NewCache()
	in := Input{Nodes: []*v1.Node{fixture.Node("n", nil)}, Slices: fixture.PartitionableSlices("n", 2), Classes: fixture.DeviceClasses()}
	claims := []*resourceapi.ResourceClaim{fixture.MIGClaim("ns", "c", "3g.40gb")}
	first := New(in, Config{Features: allFeatures, Cache: cache})
	if _, _, err := first.AllocateBounded(ctx, first.Node("n"), nil, claims, 0); err != nil {
		t.Fatal(err)
	}
	second := New(in, Config{Features: allFeatures, Cache: cache})
	if second.devicesFor(second.Node("n")) != first.devicesFor(first.Node("n")) {
		t.Error("unchanged slices: pre-selection not reused")
	}
	changed := in
	changed.Slices = append([]*resourceapi.ResourceSlice(nil), in.Slices...)
	cp := *changed.Slices[1]
	changed.Slices[1] = &cp
	third := New(changed, Config{Features: allFeatures, Cache: cache})
	if third.devicesFor(third.Node("n")) == first.devicesFor(first.Node("n")) {
		t.Error("a replaced slice: stale pre-selection reused")
	}
}

// TestPreselectionCacheForgetsDeletedNodes: a node gone from the cluster leaves the Cache
// with the next snapshot, so the cache holds no more nodes than the cluster has.
func TestPreselectionCacheForgetsDeletedNodes(t *testing.T) {
	ctx := context.Background()
	cache := NewCache()
	in := Input{
		Nodes:   []*v1.Node{fixture.Node("a", nil), fixture.Node("b", nil)},
		Slices:  append(fixture.PartitionableSlices("a", 1), fixture.PartitionableSlices("b", 1)...),
		Classes: fixture.DeviceClasses(),
	}
	claims := []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", 1)}
	first := New(in, Config{Features: allFeatures, Cache: cache})
	for _, n := range []string{"a", "b"} {
		if _, _, err := first.AllocateBounded(ctx, first.Node(n), nil, claims, 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(cache.nodes) != 2 {
		t.Fatalf("cache holds %d nodes, want 2", len(cache.nodes))
	}
	in.Nodes = in.Nodes[:1]
	New(in, Config{Features: allFeatures, Cache: cache})
	if _, ok := cache.nodes["b"]; ok || len(cache.nodes) != 1 {
		t.Errorf("after node b's deletion the cache holds %d nodes (b: %v)", len(cache.nodes), ok)
	}
}

// TestPreselectionFollowsClassChanges: a DeviceClass whose selector changes between cycles
// (the node's slices unchanged, so its Cache entry is reused) selects by the new selector, as
// the allocator given all devices does.
func TestPreselectionFollowsClassChanges(t *testing.T) {
	ctx := context.Background()
	cache := NewCache()
	in := Input{Nodes: []*v1.Node{fixture.Node("n", nil)}, Slices: fixture.PartitionableSlices("n", 1), Classes: fixture.DeviceClasses()}
	claims := []*resourceapi.ResourceClaim{fixture.GPUClaim("ns", "c", 1)}
	first := New(in, Config{Features: allFeatures, Cache: cache})
	res, _, err := first.AllocateBounded(ctx, first.Node("n"), nil, claims, 0)
	if err != nil || len(res) != 1 || res[0].Devices.Results[0].Device != "gpu-0" {
		t.Fatalf("first cycle: %+v, %v; want the whole GPU gpu-0", res, err)
	}
	// The gpu class now selects MIG devices (a new object, as from the informer).
	classes := fixture.DeviceClasses()
	gpu := classes[0].DeepCopy()
	gpu.Spec.Selectors[0].CEL.Expression = fmt.Sprintf(`device.driver == %q && device.attributes[%q].type == "mig"`, fixture.Driver, fixture.Driver)
	changed := in
	changed.Classes = []*resourceapi.DeviceClass{gpu, classes[1]}
	second := New(changed, Config{Features: allFeatures, Cache: cache})
	if second.devicesFor(second.Node("n")) != first.devicesFor(first.Node("n")) {
		t.Fatal("unchanged slices: the node's entry should be reused")
	}
	got, _, gerr := second.AllocateBounded(ctx, second.Node("n"), nil, claims, 0)
	all := New(changed, Config{Features: allFeatures, AllDevices: true})
	want, _, werr := all.AllocateBounded(ctx, all.Node("n"), nil, claims, 0)
	if gerr != nil || werr != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after the class change: %+v (%v) with pre-selection, %+v (%v) with all devices", got, gerr, want, werr)
	}
	if len(got) != 1 || got[0].Devices.Results[0].Device == "gpu-0" {
		t.Errorf("after the class change the claim got %+v; want a MIG device", got)
	}
}

// TestElisionLeavesUnmatchedDevicesOut: a device kept in the view only for its binding
// conditions, that does not match the claims and is free, makes the allocator need the
// selectors: elided, the MIG claim below would get that whole GPU once the MIG devices are
// blocked by their GPUs being taken.
func TestElisionLeavesUnmatchedDevicesOut(t *testing.T) {
	ctx := context.Background()
	node := "n0"
	slices := fixture.PartitionableSlices(node, 2)
	second := fixture.WholeGPUSlices(node, 1)[0]
	second.Name, second.Spec.Pool.Name = node+"-second", node+"-second"
	second.Spec.Devices[0].BindingConditions = []string{"ready"}
	second.Spec.Devices[0].BindingFailureConditions = []string{"failed"}
	in := Input{
		Nodes:   []*v1.Node{fixture.Node(node, nil)},
		Classes: fixture.DeviceClasses(),
		Slices:  append(slices, second),
		// Both partitionable GPUs taken whole: every MIG device matches but is blocked by
		// its GPU's counters, which the count check does not know.
		Claims: []*resourceapi.ResourceClaim{fixture.AllocatedClaim("busy", "busy", node, "gpu-0", "gpu-1")},
	}
	claims := []*resourceapi.ResourceClaim{fixture.MIGClaim("ns", "c0", "1g.10gb")}
	on := New(in, Config{Features: allFeatures})
	ni := on.Node(node)
	got, a, err := on.AllocateBounded(ctx, ni, nil, claims, 0)
	if err != nil || got != nil || a.Rejected {
		t.Fatalf("MIG claim on a node without a free MIG device: %+v, %+v, %v; want no fit from the allocator", got, a, err)
	}
	if _, answered := on.restrictedSlices(ctx, ni, &ni.Allocated, nil, claims); answered {
		t.Fatal("selectors answered with a free device in the view that does not match")
	}

	// The same device in use: it is skipped before selectors, so they are answered.
	in.Claims = append(in.Claims, fixture.AllocatedClaim("busy", "busy2", node, "gpu-0"))
	in.Claims[1].Status.Allocation.Devices.Results[0].Pool = node + "-second"
	on = New(in, Config{Features: allFeatures})
	ni = on.Node(node)
	if _, answered := on.restrictedSlices(ctx, ni, &ni.Allocated, nil, claims); !answered {
		t.Fatal("selectors not answered although the only unmatched device is in use")
	}
}
