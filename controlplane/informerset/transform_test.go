package informerset_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/informerset"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
)

// agentSlices are the slices tessera-node publishes for a mock DGX H100 with the partition
// config given, for node (its pool), as the API server returns them (decoded from protobuf,
// with the managedFields of the node agent's writes).
func agentSlices(t testing.TB, node, config string) []*resourceapi.ResourceSlice {
	t.Helper()
	cfg, err := partition.Parse([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvmlbackend.Open(nvmlbackend.MockPrefix + "dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	n, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := partition.Resolve(cfg, nil, n)
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(slices.Input{Node: n, Plan: plan, Features: slices.AllFeatures})
	var out []*resourceapi.ResourceSlice
	for i, s := range res.Pool.Slices {
		sl := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("%s-%d", node, i), UID: "uid", ResourceVersion: "7",
				ManagedFields: []metav1.ManagedFieldsEntry{{
					Manager: "tessera-node", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "resource.k8s.io/v1",
					FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:devices":{},"f:driver":{},"f:nodeName":{},"f:pool":{"f:generation":{},"f:name":{},"f:resourceSliceCount":{}},"f:sharedCounters":{}}}`),
				}},
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: contract.DriverName, NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(res.Pool.Slices))},
				Devices: s.Devices, SharedCounters: s.SharedCounters,
			},
		}
		out = append(out, decoded(t, sl))
	}
	return out
}

// decoded is s after a protobuf round trip: every string and value allocated on its own, as
// an informer receives it.
func decoded(t testing.TB, s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	t.Helper()
	data, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out := &resourceapi.ResourceSlice{}
	if err := out.Unmarshal(data); err != nil {
		t.Fatal(err)
	}
	return out
}

const (
	dynamicMIG = "default:\n  gpus:\n  - mode: dynamicMIG\n"
	mixed      = "default:\n  gpus:\n  - {indices: [0, 1], mode: whole}\n  - {indices: [2, 3], mode: dynamicMIG}\n  - {indices: [4, 5, 6, 7], mode: shared, shared: {memoryStep: 256Mi}}\n"
)

// odd is a slice with every kind of value the transform touches, including those it must
// keep apart: nil and empty maps and lists, request policies, bools, lists, taints.
func odd() *resourceapi.ResourceSlice {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "odd", Labels: map[string]string{"a": "b"}},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "d.example.com", Pool: resourceapi.ResourcePool{Name: "p", ResourceSliceCount: 1}, AllNodes: ptr.To(true),
			SharedCounters: []resourceapi.CounterSet{
				{Name: "a", Counters: map[string]resourceapi.Counter{"x": {Value: *q("1")}}},
				{Name: "b", Counters: map[string]resourceapi.Counter{"x": {Value: *q("1000m")}}},
			},
			Devices: []resourceapi.Device{
				{Name: "d0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"s": {StringValue: ptr.To("1")}, "v": {VersionValue: ptr.To("1.0.0")}, "i": {IntValue: ptr.To(int64(1))},
					"b": {BoolValue: ptr.To(true)}, "f": {BoolValue: ptr.To(false)}, "l": {IntValues: []int64{1, 2}, StringValues: []string{"a"}},
				}, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"m": {Value: *q("1Gi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: q("1Mi"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("1Mi"), Step: q("1Mi")}}},
				}, ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "a", Counters: map[string]resourceapi.Counter{"x": {Value: *q("1")}}}},
					AllowMultipleAllocations: ptr.To(true)},
				{Name: "d1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{},
					Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
						"m": {Value: *q("1Gi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: q("1Mi"), ValidValues: []resource.Quantity{*q("1Mi"), *q("2Mi")}}},
					}, ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "b", Counters: map[string]resourceapi.Counter{"x": {Value: *q("1")}}}},
					Taints: []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}}, BindingConditions: []string{"c"}},
				{Name: "d2", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"m": {Value: *q("1Gi")}}, ConsumesCounters: []resourceapi.DeviceCounterConsumption{}},
				{Name: "d3", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}, ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "a"}}},
				{Name: "d4", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"m": {Value: *q("1G")}}, ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "a", Counters: map[string]resourceapi.Counter{}}}},
				// Attribute maps: d5 equals d0's; d6-d9 differ from it, and from each other,
				// only in a value's kind, a list's presence or a list's length.
				{Name: "d5", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"s": {StringValue: ptr.To("1")}, "v": {VersionValue: ptr.To("1.0.0")}, "i": {IntValue: ptr.To(int64(1))},
					"b": {BoolValue: ptr.To(true)}, "f": {BoolValue: ptr.To(false)}, "l": {IntValues: []int64{1, 2}, StringValues: []string{"a"}},
				}},
				{Name: "d6", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"s": {StringValue: ptr.To("1")}, "v": {VersionValue: ptr.To("1.0.0")}, "i": {IntValue: ptr.To(int64(1))},
					"b": {BoolValue: ptr.To(true)}, "f": {BoolValue: ptr.To(false)}, "l": {IntValues: []int64{1, 2}, StringValues: []string{"a"}, BoolValues: []bool{}},
				}},
				{Name: "d7", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"s": {VersionValue: ptr.To("1")}}},
				{Name: "d8", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"s": {StringValue: ptr.To("1")}}},
				{Name: "d9", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"s": {StringValues: []string{"1"}}}},
			},
		},
	}
}

// TestSliceTransformKeepsEverything: a transformed slice equals the one decoded, field by
// field (reflect.DeepEqual, nil and empty kept apart, and its JSON byte for byte), but for
// managedFields; a second transform changes nothing (idempotent); values are shared across
// slices and nodes.
func TestSliceTransformKeepsEverything(t *testing.T) {
	var in []*resourceapi.ResourceSlice
	for _, node := range []string{"n1", "n2"} {
		in = append(in, agentSlices(t, node, dynamicMIG)...)
		in = append(in, agentSlices(t, node+"-mixed", mixed)...)
		for _, s := range fixture.PartitionableSlices(node+"-fixture", 8) {
			in = append(in, decoded(t, s))
		}
	}
	in = append(in, decoded(t, odd()), odd())
	tr := informerset.NewSliceTransform()
	fn := tr.Func()
	for i, s := range in {
		// The last slice was built in memory, not decoded: its quantities are kept by value
		// (1000m shares 1's counters: the same value, serialized the same), not by their
		// internal representation, which a decoded slice has in canonical form.
		same := reflect.DeepEqual
		if i == len(in)-1 {
			same = apiequality.Semantic.DeepEqual
		}
		want := s.DeepCopy()
		want.ManagedFields = nil
		wantJSON, _ := json.Marshal(want)
		obj, err := fn(s)
		if err != nil || obj != any(s) {
			t.Fatalf("transform: %v, %p != %p", err, obj, s)
		}
		if !same(s, want) {
			t.Fatalf("slice %s changed by the transform", s.Name)
		}
		if got, _ := json.Marshal(s); string(got) != string(wantJSON) {
			t.Fatalf("slice %s serializes differently after the transform:\n%s\n%s", s.Name, got, wantJSON)
		}
		tr.Slice(s)
		if !same(s, want) {
			t.Fatalf("slice %s changed by a second transform", s.Name)
		}
	}
	if _, err := fn("not a slice"); err != nil {
		t.Fatal(err)
	}

	// Sharing: the same MIG device of two nodes shares its name, capacity map, consumed
	// counters and the string values of its attributes; the parent UUID (per GPU) differs.
	find := func(node string) *resourceapi.Device {
		for _, s := range in {
			if s.Spec.Pool.Name != node {
				continue
			}
			for i := range s.Spec.Devices {
				if d := &s.Spec.Devices[i]; d.Attributes[contract.AttrType].StringValue != nil && *d.Attributes[contract.AttrType].StringValue == string(contract.TypeMIG) {
					return d
				}
			}
		}
		t.Fatalf("no MIG device on %s", node)
		return nil
	}
	a, b := find("n1"), find("n2")
	if a.Name != b.Name || unsafe.StringData(a.Name) != unsafe.StringData(b.Name) {
		t.Errorf("device name %q not shared", a.Name)
	}
	if reflect.ValueOf(a.Capacity).Pointer() != reflect.ValueOf(b.Capacity).Pointer() {
		t.Error("capacity map not shared")
	}
	if &a.ConsumesCounters[0] != &b.ConsumesCounters[0] {
		t.Error("consumed counters not shared")
	}
	if a.Attributes[contract.AttrProfile].StringValue != b.Attributes[contract.AttrProfile].StringValue {
		t.Error("profile attribute value not shared")
	}
	// The dynamic MIG devices of one profile on one GPU share one attribute map: 7 maps
	// for the 25 devices of each H100; devices of different profiles or GPUs do not.
	maps := map[string]map[uintptr]bool{} // parent UUID/profile -> distinct maps
	all := map[uintptr]string{}
	for _, s := range in {
		if s.Spec.Pool.Name != "n1" {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if contract.TypeOf(d) != contract.TypeMIG {
				continue
			}
			group := contract.StringAttr(d, contract.AttrParentUUID) + "/" + contract.StringAttr(d, contract.AttrProfile)
			p := reflect.ValueOf(d.Attributes).Pointer()
			if other, ok := all[p]; ok && other != group {
				t.Errorf("devices of %s and %s share an attribute map", group, other)
			}
			all[p] = group
			if maps[group] == nil {
				maps[group] = map[uintptr]bool{}
			}
			maps[group][p] = true
		}
	}
	if len(maps) != 8*7 || len(all) != len(maps) {
		t.Errorf("n1's dynamic MIG devices hold %d attribute maps in %d (GPU, profile) groups, want one for each of 56", len(all), len(maps))
	}
	// Values that differ are not shared.
	if c := odd(); true {
		tr.Slice(c)
		d := c.Spec.Devices
		if reflect.ValueOf(d[0].Capacity).Pointer() == reflect.ValueOf(d[1].Capacity).Pointer() {
			t.Error("capacity maps with different request policies shared")
		}
		if reflect.ValueOf(d[2].Capacity).Pointer() == reflect.ValueOf(d[4].Capacity).Pointer() {
			t.Error("1Gi and 1G shared")
		}
		if reflect.ValueOf(d[0].Attributes).Pointer() != reflect.ValueOf(d[5].Attributes).Pointer() {
			t.Error("equal attribute maps not shared")
		}
		seen := map[uintptr]string{}
		for _, dev := range append([]resourceapi.Device{d[0], d[1]}, d[6:]...) {
			p := reflect.ValueOf(dev.Attributes).Pointer()
			if other, ok := seen[p]; ok {
				t.Errorf("the different attribute maps of %s and %s shared", dev.Name, other)
			}
			seen[p] = dev.Name
		}
		x0, x1 := c.Spec.SharedCounters[0].Counters["x"].Value, c.Spec.SharedCounters[1].Counters["x"].Value
		if x0.String() != "1" || x1.String() != "1" {
			t.Errorf("counters: %v", c.Spec.SharedCounters)
		}
	}
}

// TestSliceTransformBoundedTables: with more distinct values than a table holds (it is
// emptied and starts again), every slice is still kept as it was.
func TestSliceTransformBoundedTables(t *testing.T) {
	tr := informerset.NewSliceTransform()
	for i := 0; i < 70000; i += 14000 {
		s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: resourceapi.ResourceSliceSpec{Driver: "d", Pool: resourceapi.ResourcePool{Name: "p"}}}
		for j := i; j < i+14000; j++ {
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
				Name:       fmt.Sprintf("d%d", j),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"i": {IntValue: ptr.To(int64(j))}, "s": {StringValue: ptr.To(fmt.Sprint(j))}},
				Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"c": {Value: *resource.NewQuantity(int64(j), resource.DecimalSI)}},
			})
		}
		want := s.DeepCopy()
		tr.Slice(s)
		if !reflect.DeepEqual(s, want) {
			t.Fatalf("slice %d changed", i)
		}
	}
}

// TestSliceTransformSameDecisions: the solver (with the kube-scheduler's filters and the
// structured allocator) makes the same decisions on transformed slices as on the slices as
// decoded: the same placements, devices, steps and unschedulable messages, for gangs of whole
// GPUs, MIG profiles and firstAvailable requests, solved one after another (each assumed) on
// nodes of dynamic MIG, mixed and fixture pools.
func TestSliceTransformSameDecisions(t *testing.T) {
	var nodes []string
	var raw []*resourceapi.ResourceSlice
	for i := 0; i < 4; i++ {
		for _, kind := range []string{"mig", "mixed"} {
			n := fmt.Sprintf("%s-%d", kind, i)
			nodes = append(nodes, n)
			cfg := dynamicMIG
			if kind == "mixed" {
				cfg = mixed
			}
			raw = append(raw, agentSlices(t, n, cfg)...)
		}
	}
	tr := informerset.NewSliceTransform()
	var transformed []*resourceapi.ResourceSlice
	for _, s := range raw {
		c := s.DeepCopy()
		tr.Slice(c)
		transformed = append(transformed, c)
	}
	gangs := func() []*solver.Gang {
		var out []*solver.Gang
		mk := func(name string, n int, claim func(ns, name string) *resourceapi.ResourceClaim) {
			g := &solver.Gang{Name: "t/" + name}
			for i := 0; i < n; i++ {
				c := claim("t", fmt.Sprintf("%s-c%d", name, i))
				p := fixture.Pod("t", fmt.Sprintf("%s-p%d", name, i), c.Name)
				p.ResourceVersion = "1"
				g.Pods = append(g.Pods, solver.Pod{Pod: p, Claims: []*resourceapi.ResourceClaim{c}})
			}
			out = append(out, g)
		}
		mk("whole", 6, func(ns, n string) *resourceapi.ResourceClaim { return fixture.GPUClaim(ns, n, 2) })
		mk("mig1g", 20, func(ns, n string) *resourceapi.ResourceClaim { return fixture.MIGClaim(ns, n, "1g.10gb") })
		mk("mig3g", 9, func(ns, n string) *resourceapi.ResourceClaim { return fixture.MIGClaim(ns, n, "3g.40gb") })
		mk("either", 12, func(ns, n string) *resourceapi.ResourceClaim { return fixture.GPUOrMIGClaim(ns, n, "2g.20gb") })
		mk("toobig", 40, func(ns, n string) *resourceapi.ResourceClaim { return fixture.GPUClaim(ns, n, 8) })
		return out
	}
	run := func(sl []*resourceapi.ResourceSlice) []string {
		in := snapshot.Input{Slices: sl, Classes: fixture.DeviceClasses()}
		for _, n := range nodes {
			in.Nodes = append(in.Nodes, fixture.Node(n, nil))
		}
		snap := snapshot.New(in, snapshot.Config{Features: features})
		s := solver.New(solver.Config{Filters: newFilters(t)})
		var out []string
		for _, g := range gangs() {
			res, err := s.Solve(context.Background(), snap, g)
			if err != nil {
				if !solver.IsUnschedulable(err) {
					t.Fatal(err)
				}
				out = append(out, g.Name+": "+err.Error())
				continue
			}
			data, _ := json.Marshal(res.Placements)
			out = append(out, fmt.Sprintf("%s: steps %d %s", g.Name, res.Steps, data))
			for _, p := range res.Placements {
				var allocs []*resourceapi.AllocationResult
				for _, a := range p.Allocate {
					allocs = append(allocs, a.Allocation)
				}
				snap.Assume(p.Node, p.Pod, allocs)
			}
		}
		return out
	}
	want, got := run(raw), run(transformed)
	placed := 0
	for i := range want {
		if want[i] != got[i] {
			t.Errorf("decision %d differs:\nas decoded:  %.400s\ntransformed: %.400s", i, want[i], got[i])
		}
		if !strings.Contains(want[i], "does not fit") && strings.Contains(want[i], "steps") {
			placed++
		}
	}
	if placed < 3 || len(want) != 5 {
		t.Fatalf("the test should place most gangs and reject one: %v", want)
	}
}

var features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true, DeviceBindingAndStatus: true,
}

func newFilters(t *testing.T) *filters.Filters {
	ctx, cancel := context.WithCancel(context.Background())
	inf := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	f, err := filters.New(ctx, filters.Config{Informers: inf, Volumes: true})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	inf.Start(ctx.Done())
	inf.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { cancel(); inf.Shutdown() })
	return f
}
