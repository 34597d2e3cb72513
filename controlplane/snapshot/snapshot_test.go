package snapshot

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

func TestGPUUnits(t *testing.T) {
	in := Input{Nodes: []*v1.Node{fixture.Node("n", nil)}, Slices: fixture.PartitionableSlices("n", 2)}
	// A node agent style GPU: one counter of 1 per memory slice.
	perSlice := fixture.WholeGPUSlices("m", 1)[0]
	perSlice.Spec.Pool.ResourceSliceCount = 2
	counters := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: fixture.Driver, NodeName: ptr.To("m"),
		Pool: perSlice.Spec.Pool, SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0-counters", Counters: map[string]resourceapi.Counter{}}}}}
	mig := resourceapi.Device{Name: "gpu-0-mig-2g-20gb-2",
		Attributes:       map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("mig")}},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters", Counters: map[string]resourceapi.Counter{}}}}
	one := resourceapi.Counter{Value: resource.MustParse("1")}
	for i := 0; i < 8; i++ {
		counters.Spec.SharedCounters[0].Counters[fmt.Sprintf("memory-slice-%d", i)] = one
	}
	counters.Spec.SharedCounters[0].Counters["profile-14"] = resourceapi.Counter{Value: resource.MustParse("3")}
	mig.ConsumesCounters[0].Counters["memory-slice-2"] = one
	mig.ConsumesCounters[0].Counters["memory-slice-3"] = one
	mig.ConsumesCounters[0].Counters["profile-14"] = one
	perSlice.Spec.Devices = append(perSlice.Spec.Devices, mig)
	in.Nodes = append(in.Nodes, fixture.Node("m", nil))
	in.Slices = append(in.Slices, counters, perSlice)
	s := New(in, Config{})

	for _, tc := range []struct {
		pool, device string
		want         float64
	}{
		{"n", "gpu-0", 1},
		{"n", fixture.MIGDeviceName(1, "3g.40gb", 4), 0.5},
		{"n", fixture.MIGDeviceName(0, "1g.10gb", 6), 0.125},
		{"n", fixture.MIGDeviceName(0, "7g.80gb", 0), 1},
		{"m", "gpu-0-mig-2g-20gb-2", 0.25},
		{"m", "gpu-0", 1},
	} {
		r := &resourceapi.DeviceRequestAllocationResult{Driver: fixture.Driver, Pool: tc.pool, Device: tc.device}
		if got := s.ResultUnits(r); got != tc.want {
			t.Errorf("%s/%s: %g GPU units, want %g", tc.pool, tc.device, got, tc.want)
		}
	}
	if n := s.Node("n"); n.GPUTotal != 2 {
		t.Errorf("node n: %g GPUs, want 2", n.GPUTotal)
	}
	// A fraction of a shared device: its memory over the device's.
	shared := &resourceapi.DeviceRequestAllocationResult{Driver: fixture.Driver, Pool: "n", Device: "gpu-1", ShareID: ptr.To[types.UID]("x"),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("20Gi")}}
	if got := s.ResultUnits(shared); got != 0.25 {
		t.Errorf("20Gi share of an 80Gi GPU: %g GPU units, want 0.25", got)
	}
}
