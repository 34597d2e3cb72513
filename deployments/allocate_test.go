package deployments_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"

	"github.com/tessera-gpu/tessera/contract"
)

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, dc := range c {
		out = append(out, dc)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if dc, ok := c[name]; ok {
		return dc, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// nodeSlices builds the ResourceSlices that tessera-node publishes for a
// simulated DGX machine whose partition config is the one the chart renders
// from values: GPUs 0-1 whole, 2-3 dynamic MIG, 4-7 shared.
func nodeSlices(t *testing.T, machine, nodeName string) []*resourceapi.ResourceSlice {
	t.Helper()
	r := render(t, testNamespace, `
node:
  partition:
    default:
      gpus:
        - {indices: [0, 1], mode: whole}
        - {indices: [2, 3], mode: dynamicMIG}
        - {indices: [4, 5, 6, 7], mode: shared, shared: {memoryStep: 256Mi}}
`)
	cm := typedConfigMap(t, r)
	cfg, err := partition.Parse([]byte(cm))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvmlbackend.Open(nvmlbackend.MockPrefix + machine)
	if err != nil {
		t.Fatal(err)
	}
	node, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := partition.Resolve(cfg, nil, node)
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
	if res.Counts.Whole == 0 || res.Counts.MIG == 0 || res.Counts.Shared == 0 {
		t.Fatalf("the simulated node publishes %+v; want whole, MIG and shared devices", res.Counts)
	}
	var out []*resourceapi.ResourceSlice
	for i, s := range res.Pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", nodeName, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         contract.DriverName,
				NodeName:       ptr.To(nodeName),
				Pool:           resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: int64(len(res.Pool.Slices))},
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

func typedConfigMap(t *testing.T, r *deployments.Rendered) string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	typed(t, r, "ConfigMap", "", cm)
	return cm.Data["partition.yaml"]
}

// TestExamplesAllocate: every example claim can be allocated, by the same
// structured allocator the schedulers use, on the devices that tessera-node
// really publishes, with the chart's DeviceClasses. A selector that names a
// wrong attribute, a profile that does not exist or a capacity the devices do
// not have fails here, not on a real cluster.
func TestExamplesAllocate(t *testing.T) {
	const nodeName = "gpu-node-1"
	dcs := classes{}
	data, err := os.ReadFile(filepath.Join(deployments.Dir(), "manifests", "tessera.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deployments.DecodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "DeviceClass" {
			dc := &resourceapi.DeviceClass{}
			fromUnstructured(t, o, dc)
			dcs[dc.Name] = dc
		}
	}
	if len(dcs) != 3 {
		t.Fatalf("found %d DeviceClasses in the manifests, want 3", len(dcs))
	}
	for _, m := range []struct{ machine, celAlternative string }{
		{"dgxh100", "gpu/hopper"},
		{"dgxa100", "gpu/ampere"},
	} {
		t.Run(m.machine, func(t *testing.T) {
			allocateExamples(t, dcs, nodeSlices(t, m.machine, nodeName), nodeName, m.celAlternative)
		})
	}
}

func allocateExamples(t *testing.T, dcs classes, nodeSlices []*resourceapi.ResourceSlice, nodeName, celAlternative string) {
	ctx := context.Background()
	features := structured.Features{AdminAccess: true, ConsumableCapacity: true, DeviceTaints: true, PartitionableDevices: true, PrioritizedList: true}
	alloc, err := structured.NewAllocator(ctx, features, structured.AllocatedState{}, dcs, nodeSlices,
		cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}

	tried := 0
	for file, objs := range exampleObjects(t) {
		for _, obj := range objs {
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: obj.GetName(), Namespace: "team", UID: types.UID("uid-" + obj.GetName())}}
			switch obj.GetKind() {
			case "ResourceClaim":
				c := &resourceapi.ResourceClaim{}
				fromUnstructured(t, obj, c)
				claim.Spec = c.Spec
			case "ResourceClaimTemplate":
				c := &resourceapi.ResourceClaimTemplate{}
				fromUnstructured(t, obj, c)
				claim.Spec = c.Spec.Spec
			default:
				continue
			}
			defaultClaim(&claim.Spec)
			tried++
			results, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				t.Errorf("%s: claim %s: %v", file, obj.GetName(), err)
				continue
			}
			if len(results) != 1 {
				t.Errorf("%s: claim %s fits no device that tessera-node publishes", file, obj.GetName())
				continue
			}
			for _, d := range results[0].Devices.Results {
				t.Logf("%s: %s gets %s (request %s)", file, obj.GetName(), d.Device, d.Request)
				if file == "05-cel-selector.yaml" && d.Request != celAlternative {
					t.Errorf("%s: got alternative %s, want %s", file, d.Request, celAlternative)
				}
			}
		}
	}
	if tried < 5 {
		t.Errorf("allocated %d example claims, want every one of the five examples' claims", tried)
	}
}

// defaultClaim applies the API server's defaults that the allocator relies
// on (a claim read back from the API server has them).
func defaultClaim(spec *resourceapi.ResourceClaimSpec) {
	def := func(mode *resourceapi.DeviceAllocationMode, count *int64) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			def(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			def(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}
