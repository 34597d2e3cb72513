package bench

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/informerset"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
)

// agentMIGSlices are the ResourceSlices the node agent publishes for node: a DGX H100
// (the NVML mock, its serial the node's name, so that every node's GPUs have their own
// UUIDs as real nodes do) with every GPU in dynamic MIG, built by slices.Build exactly as
// tessera-node builds them. Unlike fixture.PartitionableSlices (4 attributes per MIG device,
// one memory and one compute counter per GPU), these carry every attribute the node agent
// publishes (13 on the mock's MIG devices, 14 where sysfs resolves pcieRoot) and a counter
// per memory slice: the size a real cluster's informer holds.
func agentMIGSlices(b testing.TB, node string) []*resourceapi.ResourceSlice {
	b.Helper()
	cfg, err := partition.Parse([]byte("default:\n  gpus:\n  - mode: dynamicMIG\n"))
	if err != nil {
		b.Fatal(err)
	}
	lib, err := nvmlbackend.Open(nvmlbackend.MockPrefix + "dgxh100?serial=" + node)
	if err != nil {
		b.Fatal(err)
	}
	n, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		b.Fatal(err)
	}
	plan, err := partition.Resolve(cfg, nil, n)
	if err != nil {
		b.Fatal(err)
	}
	res := slices.Build(slices.Input{Node: n, Plan: plan, Features: slices.AllFeatures})
	out := make([]*resourceapi.ResourceSlice, 0, len(res.Pool.Slices))
	for i, s := range res.Pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, i), UID: types.UID(fmt.Sprintf("slice-%s-%d", node, i))},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: contract.DriverName, NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(res.Pool.Slices))},
				Devices: s.Devices, SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

// agentCluster is cluster(nodes, true) with each node's slices those of agentMIGSlices, as
// the scheduler's informer holds them (decoded from protobuf, through its transform).
func agentCluster(b *testing.B, nodes int) snapshot.Input {
	in := cluster(nodes, true)
	tr := informerset.NewSliceTransform()
	in.Slices = nil
	for _, n := range in.Nodes {
		in.Slices = append(in.Slices, asInformerHolds(b, agentMIGSlices(b, n.Name), transformedSlices, tr)...)
	}
	return in
}
