package slices_test

import (
	"context"
	"testing"

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
