package slices_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
)

// BenchmarkDiscoverAndBuildH100DynamicMIG measures what the agent does on
// every (re)publish of an 8-GPU H100 node with dynamic MIG on every GPU:
// discover through NVML (mock) and go-nvlib, resolve the plan, build the pool.
func BenchmarkDiscoverAndBuildH100DynamicMIG(b *testing.B) {
	lib, err := nvmlbackend.Open("mock:dgxh100")
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := partition.Parse([]byte("default:\n  gpus:\n  - mode: dynamicMIG\n"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	devices := 0
	b.ReportAllocs()
	for b.Loop() {
		node, err := discovery.Discover(ctx, lib)
		if err != nil {
			b.Fatal(err)
		}
		plan, err := partition.Resolve(cfg, nil, node)
		if err != nil {
			b.Fatal(err)
		}
		res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
		devices = res.Counts.Whole + res.Counts.MIG
	}
	b.ReportMetric(float64(devices), "devices")
}

// BenchmarkAttributeMap measures what one device's attribute map costs a watcher that
// decodes it and keeps it (retained-B/map, the heap after a GC over 10,000 maps): entries
// inserted one by one, as the protobuf decoder does, for the counts around
// MaxDynamicMIGAttributes. Run it with -benchtime 1x.
func BenchmarkAttributeMap(b *testing.B) {
	for _, n := range []int{8, 9, slices.MaxDynamicMIGAttributes, slices.MaxDynamicMIGAttributes + 1} {
		names := make([]resourceapi.QualifiedName, n)
		for i := range names {
			names[i] = resourceapi.QualifiedName(fmt.Sprintf("attribute-%d", i))
		}
		v := int64(1)
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			const maps = 10000
			for b.Loop() {
				kept := make([]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, maps)
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range kept {
					m := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
					for _, k := range names {
						m[k] = resourceapi.DeviceAttribute{IntValue: &v}
					}
					kept[i] = m
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/maps, "retained-B/map")
				runtime.KeepAlive(kept)
			}
		})
	}
}
