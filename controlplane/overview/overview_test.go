package overview

import (
	"bytes"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
)

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func memCap(q string) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{contract.CapMemory: {Value: resource.MustParse(q)}}
}

// testSlice: GPU 0 whole, GPU 1 dynamic MIG with 8 memory slices (two 1g
// placements and a 4g one shown), GPU 2 shared with 80Gi.
func testSlice(node string) resourceapi.ResourceSlice {
	counters := map[string]resourceapi.Counter{}
	for i := range 8 {
		counters[contract.MemorySliceCounter(i)] = resourceapi.Counter{Value: resource.MustParse("1")}
	}
	uses := func(from, n int) []resourceapi.DeviceCounterConsumption {
		c := map[string]resourceapi.Counter{}
		for i := from; i < from+n; i++ {
			c[contract.MemorySliceCounter(i)] = resourceapi.Counter{Value: resource.MustParse("1")}
		}
		return []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-1-counters", Counters: c}}
	}
	attrs := func(typ contract.DeviceType) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{contract.AttrProductName: str("NVIDIA H100 80GB HBM3"), contract.AttrType: str(string(typ))}
	}
	product, mig := attrs(contract.TypeGPU), attrs(contract.TypeMIG)
	return resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-slice"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: Driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			SharedCounters: []resourceapi.CounterSet{{Name: "gpu-1-counters", Counters: counters}},
			Devices: []resourceapi.Device{
				{Name: devicename.GPU(0), Attributes: product, Capacity: memCap("80Gi")},
				{Name: devicename.GPU(1), Attributes: product, Capacity: memCap("80Gi"), ConsumesCounters: uses(0, 8)},
				{Name: devicename.MIG(1, "1g.10gb", 0), Attributes: mig, Capacity: memCap("10Gi"), ConsumesCounters: uses(0, 1)},
				{Name: devicename.MIG(1, "1g.10gb", 1), Attributes: mig, Capacity: memCap("10Gi"), ConsumesCounters: uses(1, 1)},
				{Name: devicename.MIG(1, "4g.40gb", 4), Attributes: mig, Capacity: memCap("40Gi"), ConsumesCounters: uses(4, 4)},
				{Name: devicename.Shared(2), Attributes: attrs(contract.TypeShared), Capacity: memCap("80Gi"), AllowMultipleAllocations: ptr.To(true),
					Taints: []resourceapi.DeviceTaint{{Key: contract.TaintKeyXID, Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
			},
		},
	}
}

func claim(ns, name string, results ...resourceapi.DeviceRequestAllocationResult) resourceapi.ResourceClaim {
	return resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

func result(pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: Driver, Pool: pool, Device: device}
}

func TestBuildCountsWholeMIGAndSharedUse(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	shared := result("n1", devicename.Shared(2))
	shared.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{contract.CapMemory: resource.MustParse("20Gi")}
	shared.ShareID = ptr.To(types.UID("share-1"))
	in := Input{
		Now:    now,
		Slices: []resourceapi.ResourceSlice{testSlice("n1"), testSlice("n2")},
		Claims: []resourceapi.ResourceClaim{
			claim("a", "whole", result("n1", "gpu-0")),
			claim("a", "mig-small", result("n1", devicename.MIG(1, "1g.10gb", 0))),
			claim("a", "mig-big", result("n1", devicename.MIG(1, "4g.40gb", 4))),
			claim("b", "frac", shared),
			{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "unallocated"}},
		},
		Queues: []v1alpha1.Queue{
			{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: v1alpha1.QueueSpec{Parent: "root", Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{
				Quota: ptr.To(resource.MustParse("8")), Limit: ptr.To(resource.MustParse("12")), OverQuotaWeight: ptr.To[int32](2)}}},
				Status: v1alpha1.QueueStatus{Allocated: map[string]resource.Quantity{"gpu": resource.MustParse("10")}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "root"}},
		},
		PodGroups: []v1alpha1.PodGroup{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "train", CreationTimestamp: metav1.NewTime(now.Add(-5 * time.Minute))},
				Spec: v1alpha1.PodGroupSpec{MinMember: 16, Queue: "team-a"}, Status: v1alpha1.PodGroupStatus{Phase: v1alpha1.PodGroupRunning, Members: 16, Scheduled: 16, Running: 16}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "done", CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
				Spec: v1alpha1.PodGroupSpec{MinMember: 8, Queue: "team-a"}, Status: v1alpha1.PodGroupStatus{Phase: v1alpha1.PodGroupFinished, Succeeded: 7, Failed: 1}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "wait", CreationTimestamp: metav1.NewTime(now.Add(-42 * time.Second))},
				Spec: v1alpha1.PodGroupSpec{MinMember: 8, Queue: "team-b"},
				Status: v1alpha1.PodGroupStatus{Phase: v1alpha1.PodGroupPending, Members: 8, Conditions: []metav1.Condition{
					{Type: "QueueResolved", Status: "True"},
					{Type: "Scheduled", Status: "False", Reason: "OverLimit", Message: "queue team-b would use 12 of limit 8 GPUs"},
				}}},
		},
	}
	c := Build(in)
	if len(c.Nodes) != 2 || c.Nodes[0].Name != "n1" || len(c.Nodes[0].GPUs) != 3 {
		t.Fatalf("nodes = %+v", c.Nodes)
	}
	g := c.Nodes[0].GPUs
	if g[0].Used != 1 || g[0].Detail != "whole" || g[0].Mode != "whole" {
		t.Errorf("GPU 0 = %+v, want whole and fully used", g[0])
	}
	if g[1].Mode != "mig" || g[1].Used != 5.0/8 || g[1].Detail != "5/8 slices: 1g.10gb×1 4g.40gb×1" {
		t.Errorf("GPU 1 = %+v, want 5 of 8 MIG slices", g[1])
	}
	if g[2].Mode != "shared" || g[2].Used != 0.25 || g[2].Detail != "20Gi of 80Gi" || !g[2].Tainted {
		t.Errorf("GPU 2 = %+v, want a tainted shared GPU with 20Gi of 80Gi in use", g[2])
	}
	if want := 1 + 5.0/8 + 0.25; c.Totals.GPUs != 6 || c.Totals.GPUsUsed != want {
		t.Errorf("totals = %+v, want 6 GPUs with %v used", c.Totals, want)
	}
	if len(c.Queues) != 2 || c.Queues[0].Name != "root" || c.Queues[1].Depth != 1 || *c.Queues[1].Limit != 12 || c.Queues[1].Weight != 2 {
		t.Errorf("queues = %+v", c.Queues)
	}
	if c.Gangs[0].Name != "wait" || c.Gangs[0].Reason != "queue team-b would use 12 of limit 8 GPUs" || c.Gangs[0].Waiting != 42*time.Second {
		t.Errorf("pending gang first with the scheduler's reason: %+v", c.Gangs[0])
	}
	if last := c.Gangs[len(c.Gangs)-1]; last.Name != "done" {
		t.Errorf("finished gangs are listed last, got %s last", last.Name)
	}
	if c.Totals.GangsPending != 1 || c.Totals.GangsRunning != 1 || c.Totals.GangsFinished != 1 || c.Totals.LongestWait != 42*time.Second {
		t.Errorf("gang totals = %+v", c.Totals)
	}

	var out bytes.Buffer
	Render(&out, c, Style{})
	text := out.String()
	for _, want := range []string{
		"GPUs 1.88 used of 6 (31%)",
		"n1   [" + glyphFull + glyphHigh + glyphTainted + "]",
		"n2   [" + glyphFree + glyphFree + glyphTainted + "]",
		"gpu-1 5/8 slices: 1g.10gb×1 4g.40gb×1",
		"  team-a ",
		"why: queue team-b would use 12 of limit 8 GPUs",
		"gangs: 1 running, 1 pending (longest wait 42s, mean 42s), 1 finished",
		"Finished  a/done  queue team-a  min 8  bound 0/0  running 0  done 7 (1 failed)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("render lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "\x1b[") {
		t.Errorf("plain render has ANSI codes")
	}
}

func TestBytesString(t *testing.T) {
	for in, want := range map[int64]string{
		20 << 30:      "20Gi",
		81408 << 20:   "79.5Gi", // an H100 80GB as NVML reports it
		512 << 20:     "512Mi",
		(3 << 30) / 2: "1.5Gi",
	} {
		if got := bytesString(in); got != want {
			t.Errorf("bytesString(%d) = %q, want %q", in, got, want)
		}
	}
}
