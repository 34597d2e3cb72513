package deviceplugin

import (
	"fmt"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
)

// BenchmarkPreferredWholeGPUs measures one NVLink-aware pick on an 8-GPU
// node (go-gpuallocator's best-effort policy over the topology of
// setTopology), the work the kubelet waits for at pod admission.
func BenchmarkPreferredWholeGPUs(b *testing.B) {
	m := newMock(b, 8)
	setTopology(b, m)
	_, ctx := ktesting.NewTestContext(b)
	node, err := discovery.Discover(ctx, m)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{GPUs: FromDiscovery(ctx, node.GPUs), NVML: m})
	if err != nil {
		b.Fatal(err)
	}
	r := p.resources[0]
	all := ids(r.devices)
	for _, size := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got, unknown := p.preferred(r, all, nil, size); len(unknown) > 0 || len(got) != size {
					b.Fatalf("%v %v", got, unknown)
				}
			}
		})
	}
}

// BenchmarkPreferredWholeGPUs16 measures picks on a 16-GPU node, where
// more than maxExactGPUs GPUs are available and the greedy pick runs.
func BenchmarkPreferredWholeGPUs16(b *testing.B) {
	m := newMock(b, 16)
	setLinks(m, func(i int) int { return i % 4 }, func(i, j int) int {
		if i%4 == j%4 {
			return 2
		}
		return 0
	})
	_, ctx := ktesting.NewTestContext(b)
	node, err := discovery.Discover(ctx, m)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{GPUs: FromDiscovery(ctx, node.GPUs), NVML: m})
	if err != nil {
		b.Fatal(err)
	}
	r := p.resources[0]
	all := ids(r.devices)
	for _, tc := range []struct{ available, size int }{{16, 2}, {16, 4}, {16, 8}, {12, 4}, {12, 5}} {
		b.Run(fmt.Sprintf("available=%d/size=%d", tc.available, tc.size), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got, unknown := p.preferred(r, all[:tc.available], nil, tc.size); len(unknown) > 0 || len(got) != tc.size {
					b.Fatalf("%v %v", got, unknown)
				}
			}
		})
	}
}

// BenchmarkPreferredReplicas measures a pick of 8 replicas from an 8-GPU
// node with 16 replicas per GPU.
func BenchmarkPreferredReplicas(b *testing.B) {
	m := newMock(b, 8)
	_, ctx := ktesting.NewTestContext(b)
	node, err := discovery.Discover(ctx, m)
	if err != nil {
		b.Fatal(err)
	}
	for _, policy := range []ReplicaPolicy{ReplicaPolicySpread, ReplicaPolicyPack} {
		p, err := New(Options{GPUs: FromDiscovery(ctx, node.GPUs), Config: Config{TimeSlicing: &TimeSlicing{Replicas: 16, Policy: policy}}})
		if err != nil {
			b.Fatal(err)
		}
		r := p.resources[0]
		all := ids(r.devices)
		b.Run(string(policy), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got, unknown := p.preferred(r, all, nil, 8); len(unknown) > 0 || len(got) != 8 {
					b.Fatalf("%v %v", got, unknown)
				}
			}
		})
	}
}
