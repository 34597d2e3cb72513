package solver

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/filters/filterstest"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

func labelled(g *Gang, labels map[string]string) *Gang {
	for _, p := range g.Pods {
		p.Pod.Labels = labels
	}
	return g
}

// Required pod anti-affinity between the workers of one gang: with 4 nodes of 8 GPUs,
// bin-packing alone would put all 4 on one node; the gang's earlier (tentative) pods must
// push each later pod to another node.
func TestAntiAffinityWithinGang(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	for i := range 4 {
		c.node(fmt.Sprintf("n%d", i), 8, false, nil)
	}
	g := labelled(gpuGang("g", 4), map[string]string{"job": "train"})
	for _, p := range g.Pods {
		p.Pod.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"job": "train"}}, TopologyKey: v1.LabelHostname,
		}}}}
	}
	for _, n := range c.in.Nodes {
		n.Labels = map[string]string{v1.LabelHostname: n.Name}
	}
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), g)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	if got := nodesOf(res); len(got) != 4 {
		t.Fatalf("placed %v, want one pod on each of 4 nodes", got)
	}
	// A fifth pod has nowhere to go.
	g5 := labelled(gpuGang("g", 5), map[string]string{"job": "train"})
	for _, p := range g5.Pods {
		p.Pod.Spec.Affinity = g.Pods[0].Pod.Spec.Affinity
	}
	_, err = newSolver(t, Config{}).Solve(ctx, c.snapshot(), g5)
	if !IsUnschedulable(err) || !strings.Contains(err.Error(), "anti-affinity") {
		t.Fatalf("gang of 5 with anti-affinity on 4 nodes: err = %v", err)
	}
}

// maxSkew 1 across 2 racks: a gang of 4 goes 2+2, although bin-packing prefers the fuller
// rack.
func TestTopologySpreadWithinGang(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("a1", 8, false, map[string]string{"rack": "a"})
	c.node("b1", 8, false, map[string]string{"rack": "b"})
	c.use("a1", 2) // rack a is fuller: bin-packing would put all four there
	g := labelled(gpuGang("g", 4), map[string]string{"job": "train"})
	for _, p := range g.Pods {
		p.Pod.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "rack", WhenUnsatisfiable: v1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"job": "train"}},
		}}
	}
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), g)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	if got := nodesOf(res); got["a1"] != 2 || got["b1"] != 2 {
		t.Fatalf("placed %v, want 2 per rack", got)
	}
}

// Two pods of a gang asking the same host port never share a node.
func TestHostPortsWithinGang(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 8, false, nil)
	c.node("n2", 8, false, nil)
	g := gpuGang("g", 2)
	for _, p := range g.Pods {
		p.Pod.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 29500, HostPort: 29500, Protocol: v1.ProtocolTCP}}
	}
	res, err := newSolver(t, Config{}).Solve(ctx, c.snapshot(), g)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	if got := nodesOf(res); got["n1"] != 1 || got["n2"] != 1 {
		t.Fatalf("placed %v, want one pod per node (host port 29500)", got)
	}
}

// networkSlice publishes n network-attached devices reachable from every node.
func networkSlice(n int) (*resourceapi.ResourceSlice, *resourceapi.DeviceClass) {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "fabric", UID: "slice-fabric"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "fabric.example.com", AllNodes: ptr.To(true),
			Pool: resourceapi.ResourcePool{Name: "fabric", Generation: 1, ResourceSliceCount: 1},
		},
	}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("link-%d", i)})
	}
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "fabric"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "fabric.example.com"`,
		}}}},
	}
	return s, class
}

func fabricClaim(name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("claim-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "link", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "fabric", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

// A network-attached device chosen for one gang pod is taken for the gang's pods on every
// node, not only on the same node. Before, two pods on different nodes could get the same
// device.
func TestNetworkAttachedDevicesAcrossNodes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, links := range []int{1, 2} {
		c := &cluster{}
		c.node("n1", 0, false, nil)
		c.node("n2", 0, false, nil)
		for _, n := range c.in.Nodes {
			n.Status.Allocatable[v1.ResourcePods] = resource.MustParse("1") // one pod per node
		}
		slice, class := networkSlice(links)
		c.in.Slices = append(c.in.Slices, slice)
		snap := c.snapshotWith(class)
		g := &Gang{Name: "ns/g"}
		for i := range 2 {
			claim := fabricClaim(fmt.Sprintf("p%d-link", i))
			g.Pods = append(g.Pods, Pod{Pod: fixture.Pod("ns", fmt.Sprintf("p%d", i), claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
		}
		res, err := newSolver(t, Config{}).Solve(ctx, snap, g)
		if links == 1 {
			if !IsUnschedulable(err) {
				var devs []string
				if res != nil {
					for _, p := range res.Placements {
						devs = append(devs, p.Node+":"+p.Allocate[0].Allocation.Devices.Results[0].Device)
					}
				}
				t.Fatalf("one link for two pods on two nodes: err = %v, placements %v", err, devs)
			}
			continue
		}
		if err != nil {
			t.Fatalf("two links: %v", err)
		}
		a, b := res.Placements[0].Allocate[0].Allocation.Devices.Results[0].Device, res.Placements[1].Allocate[0].Allocation.Devices.Results[0].Device
		if a == b || res.Placements[0].Node == res.Placements[1].Node {
			t.Fatalf("placements %s:%s and %s:%s, want different nodes and links", res.Placements[0].Node, a, res.Placements[1].Node, b)
		}
	}
}

// snapshotWith is snapshot with extra DeviceClasses.
// Across gangs of one cycle: a network-attached device assumed for the first gang is taken
// for the second on every node.
func TestNetworkAttachedDevicesAcrossGangs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 0, false, nil)
	c.node("n2", 0, false, nil)
	slice, class := networkSlice(1)
	c.in.Slices = append(c.in.Slices, slice)
	snap := c.snapshotWith(class)
	s := newSolver(t, Config{})
	gang := func(name string) *Gang {
		claim := fabricClaim(name + "-link")
		return &Gang{Name: "ns/" + name, Pods: []Pod{{Pod: fixture.Pod("ns", name, claim.Name), Claims: []*resourceapi.ResourceClaim{claim}}}}
	}
	res, err := s.Solve(ctx, snap, gang("first"))
	if err != nil {
		t.Fatalf("first gang: %v", err)
	}
	p := res.Placements[0]
	snap.Assume(p.Node, p.Pod, []*resourceapi.AllocationResult{p.Allocate[0].Allocation})
	if _, err := s.Solve(ctx, snap, gang("second")); !IsUnschedulable(err) {
		t.Fatalf("second gang got the link the first holds: err = %v", err)
	}
}

func (c *cluster) snapshotWith(classes ...*resourceapi.DeviceClass) *snapshot.Snapshot {
	c.in.Classes = append(fixture.DeviceClasses(), classes...)
	return newSnapshot(c.in)
}

// Four gang pods with a WaitForFirstConsumer PVC each and one local PV per node: the pods
// land where their volumes can be, never two on the node of one PV, and each placement
// carries the volume binder's decision for the committer.
func TestVolumesWithinGang(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	objs := []runtime.Object{&storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}}
	c := &cluster{}
	for i := range 5 {
		name := fmt.Sprintf("n%d", i)
		c.node(name, 8, false, map[string]string{v1.LabelHostname: name})
		if i < 4 {
			objs = append(objs, localPV("pv-"+name, name))
		}
	}
	g := gpuGang("g", 4)
	for i, p := range g.Pods {
		claim := fmt.Sprintf("data-%d", i)
		objs = append(objs, pendingPVC(claim))
		p.Pod.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	s := newSolver(t, Config{Filters: filterstest.New(t, objs...)})
	res, err := s.Solve(ctx, c.snapshot(), g)
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	got := nodesOf(res)
	if len(got) != 4 || got["n4"] != 0 {
		t.Fatalf("placed %v, want one pod on each node with a PV (n0..n3)", got)
	}
	for _, p := range res.Placements {
		if !p.Volumes.Any() {
			t.Errorf("pod %s on %s carries no volume decision", p.Pod.Name, p.Node)
		}
	}
	// The search left nothing assumed: the same gang solves again to the same placement.
	res2, err := s.Solve(ctx, c.snapshot(), g)
	if err != nil || fmt.Sprint(nodesOf(res2)) != fmt.Sprint(got) {
		t.Fatalf("second solve: %v %v, want %v", nodesOf(res2), err, got)
	}
}

func localPV(name, node string) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName:       "local",
			PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/" + name}},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeAvailable},
	}
}

func pendingPVC(name string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, StorageClassName: ptr.To("local"),
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("5Gi")}},
		},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimPending},
	}
}

// A pod asking an extended resource that a DeviceClass maps gets a claim for it on nodes
// that do not advertise the resource (KEP-5004), with the kube-scheduler's request names.
func TestDRAExtendedResource(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := &cluster{}
	c.node("n1", 2, false, nil)
	classes := fixture.DeviceClasses()
	classes[0].Spec.ExtendedResourceName = ptr.To("example.com/gpu")
	c.in.Classes = classes
	snap := newSnapshot(c.in)
	p := fixture.Pod("ns", "p")
	p.Spec.Containers[0].Resources.Requests["example.com/gpu"] = resource.MustParse("2")
	p.Spec.Containers[0].Resources.Limits = v1.ResourceList{"example.com/gpu": resource.MustParse("2")}
	res, err := newSolver(t, Config{}).Solve(ctx, snap, &Gang{Name: "ns/g", Pods: []Pod{{Pod: p}}})
	if err != nil {
		t.Fatalf("Solve: %v", err)
	}
	ext := res.Placements[0].Extended
	if ext == nil || len(ext.Allocation.Devices.Results) != 2 {
		t.Fatalf("extended claim = %+v, want 2 devices", ext)
	}
	if r := ext.Claim.Spec.Devices.Requests[0]; r.Name != "container-0-request-1" || r.Exactly.DeviceClassName != fixture.GPUClass {
		t.Errorf("request = %s for %s, want container-0-request-1 (cpu, example.com/gpu, memory) for %s", r.Name, r.Exactly.DeviceClassName, fixture.GPUClass)
	}
	if m := ext.Mappings; len(m) != 1 || m[0].ContainerName != "main" || m[0].ResourceName != "example.com/gpu" {
		t.Errorf("mappings = %+v", m)
	}
	if res.GPUUnits != 2 {
		t.Errorf("GPU units = %g, want 2", res.GPUUnits)
	}
	// Three do not fit on two GPUs.
	p.Spec.Containers[0].Resources.Requests["example.com/gpu"] = resource.MustParse("3")
	if _, err := newSolver(t, Config{}).Solve(ctx, newSnapshot(c.in), &Gang{Name: "ns/g", Pods: []Pod{{Pod: p}}}); !IsUnschedulable(err) {
		t.Fatalf("3 on 2 GPUs: err = %v", err)
	}
}
