package solver

import (
	"context"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/controlplane/filters/filterstest"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// allFeatures is what a 1.37 cluster serves.
var allFeatures = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true, DeviceBindingAndStatus: true,
}

// newSolver returns a solver with the kube-scheduler's filters on an in-memory clientset.
func newSolver(t testing.TB, cfg Config) *Solver {
	t.Helper()
	if cfg.Filters == nil {
		cfg.Filters = filterstest.New(t)
	}
	return New(cfg)
}

type cluster struct {
	in snapshot.Input
}

func (c *cluster) node(name string, gpus int, partitionable bool, labels map[string]string) {
	c.in.Nodes = append(c.in.Nodes, fixture.Node(name, labels))
	if partitionable {
		c.in.Slices = append(c.in.Slices, fixture.PartitionableSlices(name, gpus)...)
	} else {
		c.in.Slices = append(c.in.Slices, fixture.WholeGPUSlices(name, gpus)...)
	}
}

// use allocates the first n GPUs of a node to a claim outside the gang.
func (c *cluster) use(node string, n int) {
	var devs []string
	for i := 0; i < n; i++ {
		devs = append(devs, fmt.Sprintf("gpu-%d", i))
	}
	c.in.Claims = append(c.in.Claims, fixture.AllocatedClaim("other", "used-"+node, node, devs...))
}

func (c *cluster) snapshot() *snapshot.Snapshot {
	c.in.Classes = fixture.DeviceClasses()
	return newSnapshot(c.in)
}

func newSnapshot(in snapshot.Input) *snapshot.Snapshot {
	return snapshot.New(in, snapshot.Config{Features: allFeatures})
}

func gpuGang(name string, n int) *Gang {
	g := &Gang{Name: "ns/" + name}
	for i := 0; i < n; i++ {
		claim := fixture.GPUClaim("ns", fmt.Sprintf("%s-%d-gpu", name, i), 1)
		g.Pods = append(g.Pods, Pod{Pod: fixture.Pod("ns", fmt.Sprintf("%s-%d", name, i), claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
	}
	return g
}

func nodesOf(res *Result) map[string]int {
	m := map[string]int{}
	for _, p := range res.Placements {
		m[p.Node]++
	}
	return m
}

// checkNoDoubleAllocation asserts the invariant that no device is handed out twice.
func checkNoDoubleAllocation(t *testing.T, snap *snapshot.Snapshot, res *Result) {
	t.Helper()
	seen := map[string]string{}
	for _, p := range res.Placements {
		for _, ca := range p.Allocate {
			for _, r := range ca.Allocation.Devices.Results {
				id := r.Pool + "/" + r.Device
				if prev, ok := seen[id]; ok {
					t.Fatalf("device %s allocated to %s and %s", id, prev, ca.Claim.Name)
				}
				seen[id] = ca.Claim.Name
				if p.Node != r.Pool {
					t.Fatalf("pod %s on node %s got device of pool %s", p.Pod.Name, p.Node, r.Pool)
				}
				if snap.Node(r.Pool).Allocated.AllocatedDevices.Has(structured.MakeDeviceID(r.Driver, r.Pool, r.Device)) {
					t.Fatalf("device %s was already allocated before the gang", id)
				}
			}
		}
	}
}

func TestGangFitsTwoNodes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 8, false, nil)
	c.node("n2", 8, false, nil)
	snap := c.snapshot()
	res, err := newSolver(t, Config{}).Solve(ctx, snap, gpuGang("g", 16))
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	if got := nodesOf(res); got["n1"] != 8 || got["n2"] != 8 {
		t.Fatalf("placements per node = %v, want 8 and 8", got)
	}
	if res.GPUUnits != 16 {
		t.Errorf("GPU units = %g, want 16", res.GPUUnits)
	}
	checkNoDoubleAllocation(t, snap, res)
}

func TestGangDoesNotFitSaysWhy(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 8, false, nil)
	c.node("n2", 8, false, nil)
	c.use("n1", 1)
	c.use("n2", 1)
	_, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), gpuGang("g", 16))
	if !IsUnschedulable(err) {
		t.Fatalf("Solve error = %v, want Unschedulable", err)
	}
	for _, want := range []string{"gang of 16 pods", "at most 14 placed", "14 free GPU units on 2 nodes", "insufficient devices"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

func TestBinPacking(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("empty", 8, false, nil)
	c.node("half", 8, false, nil)
	c.use("half", 4)
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), gpuGang("g", 4))
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(res); got["half"] != 4 {
		t.Fatalf("bin-packing placed %v, want all 4 on the half-used node", got)
	}
	res, err = newSolver(t, Config{Spread: true}).Solve(ctx, c.snapshot(), gpuGang("g", 4))
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(res); got["empty"] != 4 {
		t.Fatalf("spreading placed %v, want all 4 on the empty node", got)
	}
}

// TestJointReallocationBeatsFirstFit: one partitionable GPU. Pod a prefers a whole GPU but
// accepts a 3g.40gb MIG device; pod b needs a 3g.40gb device. Per-pod first fit gives a the
// whole GPU and b starves; the solver re-allocates both together and places the gang.
func TestJointReallocationBeatsFirstFit(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 1, true, nil)
	snap := c.snapshot()
	ca := fixture.GPUOrMIGClaim("ns", "a-acc", "3g.40gb")
	cb := fixture.MIGClaim("ns", "b-mig", "3g.40gb")
	gang := &Gang{Name: "ns/g", Pods: []Pod{
		{Pod: fixture.Pod("ns", "a", ca.Name), Claims: []*resourceapi.ResourceClaim{ca}},
		{Pod: fixture.Pod("ns", "b", cb.Name), Claims: []*resourceapi.ResourceClaim{cb}},
	}}

	// First fit, pod by pod, as the kube-scheduler does it.
	first, err := snap.AllocateOnNode(ctx, snap.Node("n1"), nil, []*resourceapi.ResourceClaim{ca})
	if err != nil || first == nil {
		t.Fatalf("first fit for a: %v %v", first, err)
	}
	if dev := first[0].Devices.Results[0].Device; dev != "gpu-0" {
		t.Fatalf("first fit gave a %s, want the whole gpu-0 (test premise)", dev)
	}
	second, err := snap.AllocateOnNode(ctx, snap.Node("n1"), first, []*resourceapi.ResourceClaim{cb})
	if err != nil || second != nil {
		t.Fatalf("first fit for b = %v, %v; want no fit (test premise)", second, err)
	}

	res, err := newSolver(t, Config{}).Solve(ctx, snap, gang)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	devs := map[string]string{}
	for _, p := range res.Placements {
		devs[p.Pod.Name] = p.Allocate[0].Allocation.Devices.Results[0].Device
	}
	if !strings.HasPrefix(devs["a"], "gpu-0-mig-3g-40gb-") || !strings.HasPrefix(devs["b"], "gpu-0-mig-3g-40gb-") || devs["a"] == devs["b"] {
		t.Fatalf("devices = %v, want two distinct 3g.40gb MIG devices", devs)
	}
	if res.GPUUnits != 1 {
		t.Errorf("GPU units = %g, want 1 (two halves of the GPU's memory slices)", res.GPUUnits)
	}
	checkNoDoubleAllocation(t, snap, res)
}

// TestBacktrackingAcrossPods: pod p1 fits anywhere, p2 only on node "a" which has one free
// GPU. Bin-packing puts p1 on "a" first; p2 then fits nowhere and the search moves p1.
func TestBacktrackingAcrossPods(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("a", 8, false, map[string]string{"pool": "a"})
	c.node("b", 8, false, nil)
	c.use("a", 7)
	g := gpuGang("g", 2)
	g.Pods[1].Pod.Spec.NodeSelector = map[string]string{"pool": "a"}
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), g)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	for _, p := range res.Placements {
		want := "b"
		if p.Pod.Name == "g-1" {
			want = "a"
		}
		if p.Node != want {
			t.Errorf("pod %s on %s, want %s", p.Pod.Name, p.Node, want)
		}
	}
	if res.Tries < 3 {
		t.Errorf("tries = %d; the solution needs a backtrack", res.Tries)
	}
}

func TestTopologyDomains(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	rack := func(r string) map[string]string { return map[string]string{"rack": r} }
	c.node("a1", 8, false, rack("a"))
	c.node("a2", 8, false, rack("a"))
	c.node("b1", 8, false, rack("b"))
	c.node("b2", 8, false, rack("b"))
	c.use("a1", 4)
	c.use("a2", 4)
	// Rack a has 8 free, rack b 16: a gang of 8 goes to a (best fit), not across racks.
	snap := c.snapshot()
	s := newSolver(t, Config{TopologyKeys: []string{"rack"}})
	res, err := s.Solve(ctx, snap, gpuGang("g8", 8))
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(res); got["a1"]+got["a2"] != 8 || res.Domain != "rack=a" {
		t.Fatalf("gang of 8 placed %v in %q, want rack a", got, res.Domain)
	}
	// A gang of 12 only fits inside rack b.
	res, err = s.Solve(ctx, snap, gpuGang("g12", 12))
	if err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(res); got["b1"]+got["b2"] != 12 {
		t.Fatalf("gang of 12 placed %v, want rack b", got)
	}
	// 20 fit in the cluster (24 free) but in no rack: Required refuses, Preferred spans.
	g := gpuGang("g20", 20)
	g.Topology = &Topology{Key: "rack", Required: true}
	_, err = s.Solve(ctx, snap, g)
	if !IsUnschedulable(err) || !strings.Contains(err.Error(), "largest topology domain rack=b has 16 free") {
		t.Fatalf("required topology: err = %v", err)
	}
	g.Topology.Required = false
	if _, err = s.Solve(ctx, snap, g); err != nil {
		t.Fatalf("preferred topology: %v", err)
	}
}

func TestNodeChecks(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("tainted", 8, false, nil)
	c.node("cordoned", 8, false, nil)
	c.node("small", 8, false, nil)
	c.in.Nodes[0].Spec.Taints = []v1.Taint{{Key: "gpu", Value: "broken", Effect: v1.TaintEffectNoSchedule}}
	c.in.Nodes[1].Spec.Unschedulable = true
	c.in.Nodes[2].Status.Allocatable[v1.ResourceCPU] = resource.MustParse("2")
	_, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), gpuGang("g", 3))
	if !IsUnschedulable(err) {
		t.Fatalf("err = %v, want Unschedulable", err)
	}
	for _, want := range []string{"had untolerated taint", "Insufficient cpu", "at most 2 placed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	g := gpuGang("g", 3)
	for _, p := range g.Pods {
		p.Pod.Spec.Tolerations = []v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpExists}}
	}
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), g)
	if err != nil {
		t.Fatalf("tolerating pods: %v", err)
	}
	if got := nodesOf(res); got["cordoned"] != 0 {
		t.Fatalf("placed on a cordoned node: %v", got)
	}
}

func TestBudgetBoundsSearch(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	for i := 0; i < 50; i++ {
		c.node(fmt.Sprintf("n%02d", i), 8, false, nil)
	}
	_, err := newSolver(t, Config{MaxTries: 2000}).Solve(ctx, c.snapshot(), gpuGang("g", 401))
	if !IsUnschedulable(err) || !strings.Contains(err.Error(), "budget of 2000 tries exhausted") {
		t.Fatalf("err = %v, want budget exhausted", err)
	}
}

func TestBadInputIsAnError(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 8, false, nil)
	g := gpuGang("g", 1)
	g.Pods[0].Claims[0].Spec.Devices.Requests[0].Exactly.DeviceClassName = "no-such-class"
	_, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), g)
	if err == nil || IsUnschedulable(err) || !strings.Contains(err.Error(), "no-such-class") {
		t.Fatalf("err = %v, want an input error naming the class", err)
	}
	_ = context.Background()
}

func TestSignature(t *testing.T) {
	s := newSolver(t, Config{})
	snap := (&cluster{}).snapshot()
	a, b := gpuGang("a", 4), gpuGang("b", 4)
	if s.Signature(snap, a) != s.Signature(snap, b) {
		t.Error("gangs of four identical one-GPU pods have different signatures")
	}
	b.Pods[0].Pod.Spec.NodeSelector = map[string]string{"x": "y"}
	if s.Signature(snap, a) == s.Signature(snap, b) {
		t.Error("a node selector does not change the signature")
	}
	// The API server gives every pod its own token volume: no difference for the search.
	a2 := gpuGang("a2", 4)
	for i, p := range a2.Pods {
		p.Pod.Spec.Volumes = []v1.Volume{{Name: fmt.Sprintf("kube-api-access-%d", i), VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{}}}}
	}
	if s.Signature(snap, a) != s.Signature(snap, a2) {
		t.Error("service-account token volumes change the signature")
	}
	a2.Pods[0].Pod.Spec.Volumes = append(a2.Pods[0].Pod.Spec.Volumes, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-0"}}})
	if s.Signature(snap, a) == s.Signature(snap, a2) {
		t.Error("a PVC does not change the signature")
	}
	c := gpuGang("c", 4)
	c.Topology = &Topology{Key: "rack", Required: true}
	if s.Signature(snap, a) == s.Signature(snap, c) {
		t.Error("a topology constraint does not change the signature")
	}
}

// Bin-packing prefers the fullest node, but a whole-GPU gang must not take the
// whole device of dynamic-MIG GPUs (stranding their MIG capacity) while plain
// GPUs are free elsewhere; a MIG gang still goes to the MIG node.
func TestWholeGPUGangPrefersPlainGPUsOverPartitionable(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("mig", 4, true, nil)
	c.node("plain", 8, false, nil)
	// The MIG node is the fuller one: a 1g device in use on its GPU 0.
	c.in.Claims = append(c.in.Claims, fixture.AllocatedClaim("other", "serving", "mig", fixture.MIGDeviceName(0, "1g.10gb", 0)))
	snap := c.snapshot()

	res, err := newSolver(t, Config{}).Solve(ctx, snap, gpuGang("train", 2))
	if err != nil {
		t.Fatalf("Solve whole-GPU gang: %v", err)
	}
	if got := nodesOf(res); got["plain"] != 2 {
		t.Errorf("whole-GPU gang placed %v, want both pods on the plain node", got)
	}
	checkNoDoubleAllocation(t, snap, res)

	mig := &Gang{Name: "ns/serve"}
	for i := range 2 {
		claim := fixture.MIGClaim("ns", fmt.Sprintf("serve-%d-mig", i), "1g.10gb")
		mig.Pods = append(mig.Pods, Pod{Pod: fixture.Pod("ns", fmt.Sprintf("serve-%d", i), claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
	}
	res, err = newSolver(t, Config{}).Solve(ctx, snap, mig)
	if err != nil {
		t.Fatalf("Solve MIG gang: %v", err)
	}
	if got := nodesOf(res); got["mig"] != 2 {
		t.Errorf("MIG gang placed %v, want both pods on the MIG node", got)
	}

	// Without plain GPUs anywhere the gang still places, on the MIG GPUs.
	c2 := &cluster{}
	c2.node("mig", 4, true, nil)
	snap2 := c2.snapshot()
	res, err = newSolver(t, Config{}).Solve(ctx, snap2, gpuGang("train", 2))
	if err != nil {
		t.Fatalf("Solve on partitionable GPUs only: %v", err)
	}
	if got := nodesOf(res); got["mig"] != 2 {
		t.Errorf("placed %v, want the MIG node", got)
	}
}

// The joint re-allocation is bounded by allocator steps, not time: with a budget too small
// to finish it, the gang that needs it does not fit and the message says why.
func TestJointReallocationIsBoundedBySteps(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 1, true, nil)
	ca := fixture.GPUOrMIGClaim("ns", "a-acc", "3g.40gb")
	cb := fixture.MIGClaim("ns", "b-mig", "3g.40gb")
	gang := &Gang{Name: "ns/g", Pods: []Pod{
		{Pod: fixture.Pod("ns", "a", ca.Name), Claims: []*resourceapi.ResourceClaim{ca}},
		{Pod: fixture.Pod("ns", "b", cb.Name), Claims: []*resourceapi.ResourceClaim{cb}},
	}}
	_, err := newSolver(t, Config{JointSteps: 2}).Solve(ctx, c.snapshot(), gang)
	if !IsUnschedulable(err) || !strings.Contains(err.Error(), "joint device searches stopped at 2 allocator steps") {
		t.Fatalf("err = %v, want the joint step budget named", err)
	}
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), gang)
	if err != nil {
		t.Fatalf("default budget: %v", err)
	}
	if res.Steps == 0 {
		t.Error("result reports no allocator steps")
	}
}
