// Package bench holds the scheduler's benchmarks. Solve latency is measured on an in-memory
// snapshot of 1,000 simulated 8-GPU nodes; see docs/benchmarks.md.
package bench

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

var features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true, DeviceBindingAndStatus: true,
}

// cluster: nodes × 8 GPUs; every third node has 3 GPUs in use and every seventh is full, so
// the solver has to skip used capacity as it would in a busy cluster. Nodes carry a rack label
// (20 nodes per rack).
func cluster(nodes int, partitionable bool) snapshot.Input {
	var in snapshot.Input
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("node-%04d", i)
		in.Nodes = append(in.Nodes, fixture.Node(name, map[string]string{"rack": fmt.Sprintf("rack-%02d", i/20)}))
		if partitionable {
			in.Slices = append(in.Slices, fixture.PartitionableSlices(name, 8)...)
		} else {
			in.Slices = append(in.Slices, fixture.WholeGPUSlices(name, 8)...)
		}
		used := 0
		switch {
		case i%7 == 0:
			used = 8
		case i%3 == 0:
			used = 3
		}
		var devs []string
		for d := 0; d < used; d++ {
			devs = append(devs, fmt.Sprintf("gpu-%d", d))
		}
		if used > 0 {
			in.Claims = append(in.Claims, fixture.AllocatedClaim("busy", "c-"+name, name, devs...))
		}
	}
	in.Classes = fixture.DeviceClasses()
	return in
}

func gang(n int) *solver.Gang {
	g := &solver.Gang{Name: "bench/g"}
	for i := 0; i < n; i++ {
		c := fixture.GPUClaim("bench", fmt.Sprintf("c-%d", i), 1)
		g.Pods = append(g.Pods, solver.Pod{Pod: fixture.Pod("bench", fmt.Sprintf("p-%d", i), c.Name), Claims: []*resourceapi.ResourceClaim{c}})
	}
	return g
}

func benchSolve(b *testing.B, pods int, partitionable bool, topology []string) {
	in := cluster(1000, partitionable)
	snap := snapshot.New(in, snapshot.Config{Features: features})
	s := solver.New(solver.Config{TopologyKeys: topology})
	g := gang(pods)
	ctx := context.Background()
	var lat []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		res, err := s.Solve(ctx, snap, g)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatalf("Solve: %v", err)
		}
		if len(res.Placements) != pods {
			b.Fatalf("placed %d of %d", len(res.Placements), pods)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
}

func BenchmarkSolve(b *testing.B) {
	for _, pods := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("gang=%d/nodes=1000/whole", pods), func(b *testing.B) { benchSolve(b, pods, false, nil) })
	}
	for _, pods := range []int{8, 64} {
		b.Run(fmt.Sprintf("gang=%d/nodes=1000/whole/rack-topology", pods), func(b *testing.B) { benchSolve(b, pods, false, []string{"rack"}) })
		b.Run(fmt.Sprintf("gang=%d/nodes=1000/partitionable-mig", pods), func(b *testing.B) { benchSolve(b, pods, true, nil) })
	}
}

// BenchmarkSnapshot measures building the snapshot (done once per scheduling cycle).
func BenchmarkSnapshot(b *testing.B) {
	in := cluster(1000, false)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		snapshot.New(in, snapshot.Config{Features: features})
	}
}
