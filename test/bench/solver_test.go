// Package bench holds the scheduler's benchmarks. Solve latency is measured on an in-memory
// snapshot of 1,000 simulated 8-GPU nodes; see docs/benchmarks.md.
package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/informerset"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

var features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true, DeviceBindingAndStatus: true,
}

// cluster: nodes × 8 GPUs; every third node has 3 GPUs in use and every seventh is full, so
// the solver has to skip used capacity as it would in a busy cluster. Each GPU in use belongs
// to a bound pod (one GPU, one CPU, 1 GiB each), so the filters see the pods a busy cluster
// has. Nodes carry a rack label (20 nodes per rack).
func cluster(nodes int, partitionable bool) snapshot.Input {
	return clusterWith(nodes, partitionable, 0)
}

// clusterWith is cluster with each node's bound pods made up to podsPerNode by pods that
// use no GPU (one CPU, 1 GiB each).
func clusterWith(nodes int, partitionable bool, podsPerNode int) snapshot.Input {
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
		for d := 0; d < used; d++ {
			p := fixture.Pod("busy", fmt.Sprintf("p-%s-%d", name, d), "c-"+name)
			p.Spec.NodeName = name
			p.ResourceVersion = "1"
			p.Status.Phase = v1.PodRunning
			in.Pods = append(in.Pods, p)
		}
		for d := used; d < podsPerNode; d++ {
			p := fixture.Pod("cpu", fmt.Sprintf("p-%s-%d", name, d))
			p.Spec.NodeName = name
			p.ResourceVersion = "1"
			p.Status.Phase = v1.PodRunning
			in.Pods = append(in.Pods, p)
		}
	}
	in.Classes = fixture.DeviceClasses()
	return in
}

func gang(n int) *solver.Gang {
	g := &solver.Gang{Name: "bench/g"}
	for i := 0; i < n; i++ {
		c := fixture.GPUClaim("bench", fmt.Sprintf("c-%d", i), 1)
		p := fixture.Pod("bench", fmt.Sprintf("p-%d", i), c.Name)
		p.ResourceVersion = "1" // as every pod from the API server has
		g.Pods = append(g.Pods, solver.Pod{Pod: p, Claims: []*resourceapi.ResourceClaim{c}})
	}
	return g
}

// newFilters returns the kube-scheduler's filter plugins on an in-memory clientset; plugins
// nil is all of them, an empty list none (the solver then checks devices only).
func newFilters(b testing.TB, plugins []string) *filters.Filters {
	ctx, cancel := context.WithCancel(context.Background())
	inf := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	f, err := filters.New(ctx, filters.Config{Informers: inf, Volumes: true, Plugins: plugins})
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	inf.Start(ctx.Done())
	inf.WaitForCacheSync(ctx.Done())
	b.Cleanup(func() { cancel(); inf.Shutdown() })
	return f
}

// devices says how the allocator is shown a node's devices in a solve benchmark.
type devices int

const (
	// preselected: the scheduler's path; the node's pre-selection is computed by the first
	// solve and reused by the next ones (as the scheduler's Cache keeps it across cycles
	// while a node's slices do not change).
	preselected devices = iota
	// preselectedCold: a new snapshot without a Cache for every solve (built off the
	// clock): every node evaluated computes its pre-selection — the first cycle after a
	// start, or every node's slices changed.
	preselectedCold
	// all: every device, as before pre-selection (snapshot.Config.AllDevices).
	all
	// preselectedNoElision: preselected, but the allocator still evaluates the selectors
	// that pre-selection answered (snapshot.Config.NoElision), as before elide.go.
	preselectedNoElision
)

func (d devices) String() string {
	return [...]string{"preselected", "preselected-cold", "all", "preselected-no-elision"}[d]
}

// noRunAhead turns the solver's run-ahead allocation off (a benchSolve option).
func noRunAhead(c *solver.Config) { c.NoRunAhead = true }

func benchSolve(b *testing.B, nodes, pods int, partitionable bool, topology []string, plugins []string, dev devices, opts ...func(*solver.Config)) {
	benchSolveOn(b, cluster(nodes, partitionable), pods, topology, plugins, dev, opts...)
}

// benchSolveOn is benchSolve on the cluster in.
func benchSolveOn(b *testing.B, in snapshot.Input, pods int, topology []string, plugins []string, dev devices, opts ...func(*solver.Config)) {
	cfg := snapshot.Config{Features: features, AllDevices: dev == all, NoElision: dev == preselectedNoElision}
	snap := snapshot.New(in, cfg)
	scfg := solver.Config{TopologyKeys: topology, Filters: newFilters(b, plugins)}
	for _, o := range opts {
		o(&scfg)
	}
	s := solver.New(scfg)
	g := gang(pods)
	ctx := context.Background()
	var lat []time.Duration
	calls := 0
	// The setup's garbage (the cluster built above) is collected before the clock starts:
	// otherwise the first tens of solves run during the mark phase it triggers, which is the
	// benchmark's cost, not the solver's. Collections the solves' own garbage triggers are
	// measured.
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if dev == preselectedCold {
			b.StopTimer()
			snap = snapshot.New(in, cfg)
			b.StartTimer()
		}
		start := time.Now()
		res, err := s.Solve(ctx, snap, g)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatalf("Solve: %v", err)
		}
		if len(res.Placements) != pods {
			b.Fatalf("placed %d of %d", len(res.Placements), pods)
		}
		calls += res.AllocatorCalls
	}
	b.StopTimer()
	b.ReportMetric(float64(calls)/float64(b.N), "allocator-calls/op")
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
}

// BenchmarkSolve runs every case twice in the same run: with the kube-scheduler's filter
// plugins (filters=upstream, what tessera-scheduler runs) and without them (filters=none,
// devices only), so that their cost is measured under the same machine load. The
// partitionable cases run three ways (devices=preselected, preselected-cold, all) so that
// the pre-selection's gain is measured in the same run.
func BenchmarkSolve(b *testing.B) {
	variants := []struct {
		name    string
		plugins []string
	}{{"upstream", nil}, {"none", []string{}}}
	for _, v := range variants {
		for _, pods := range []int{8, 64, 512} {
			b.Run(fmt.Sprintf("gang=%d/nodes=1000/whole/filters=%s", pods, v.name), func(b *testing.B) { benchSolve(b, 1000, pods, false, nil, v.plugins, preselected) })
		}
		// Whole GPUs: pre-selection keeps every device (all match), so this is its overhead.
		b.Run(fmt.Sprintf("gang=64/nodes=1000/whole-all-devices/filters=%s", v.name), func(b *testing.B) { benchSolve(b, 1000, 64, false, nil, v.plugins, all) })
		for _, pods := range []int{8, 64} {
			b.Run(fmt.Sprintf("gang=%d/nodes=1000/whole/rack-topology/filters=%s", pods, v.name), func(b *testing.B) { benchSolve(b, 1000, pods, false, []string{"rack"}, v.plugins, preselected) })
			for _, dev := range []devices{preselected, preselectedCold, all, preselectedNoElision} {
				b.Run(fmt.Sprintf("gang=%d/nodes=1000/partitionable-mig/filters=%s/devices=%s", pods, v.name, dev), func(b *testing.B) { benchSolve(b, 1000, pods, true, nil, v.plugins, dev) })
			}
			// The same without run-ahead allocation (one allocator call per pod), in the same run.
			b.Run(fmt.Sprintf("gang=%d/nodes=1000/partitionable-mig/filters=%s/devices=preselected-runahead-off", pods, v.name), func(b *testing.B) {
				benchSolve(b, 1000, pods, true, nil, v.plugins, preselected, noRunAhead)
			})
		}
		// MIG as tessera-node publishes it (agentMIGSlices: every attribute, a counter per
		// memory slice), held as the scheduler's informer holds it (decoded, transformed).
		for _, dev := range []devices{preselected, preselectedNoElision} {
			b.Run(fmt.Sprintf("gang=64/nodes=1000/agent-mig/filters=%s/devices=%s", v.name, dev), func(b *testing.B) {
				benchSolveOn(b, agentCluster(b, 1000), 64, nil, v.plugins, dev)
			})
		}
		// 5,000 nodes: the whole-GPU goal, and MIG beside it.
		b.Run(fmt.Sprintf("gang=64/nodes=5000/whole/filters=%s", v.name), func(b *testing.B) { benchSolve(b, 5000, 64, false, nil, v.plugins, preselected) })
		b.Run(fmt.Sprintf("gang=64/nodes=5000/partitionable-mig/filters=%s/devices=preselected", v.name), func(b *testing.B) { benchSolve(b, 5000, 64, true, nil, v.plugins, preselected) })
	}
}

// BenchmarkSnapshot measures building the snapshot (done once per scheduling cycle),
// including the kube-scheduler's view of the bound pods: from scratch (snapshot.New, with
// and without the PodInfo cache the scheduler keeps across cycles), and incrementally
// (snapshot.Cache.Snapshot, what the scheduler's cycle does) with a few changes per cycle.
func BenchmarkSnapshot(b *testing.B) {
	for _, nodes := range []int{1000, 5000} {
		for _, partitionable := range []bool{false, true} {
			kind := "whole"
			if partitionable {
				kind = "partitionable-mig"
			}
			// Built by the first case that runs (a 5,000-node MIG cluster takes seconds), so
			// that -bench selects what is built.
			var built *snapshot.Input
			input := func() snapshot.Input {
				if built == nil {
					in := cluster(nodes, partitionable)
					built = &in
				}
				return *built
			}
			b.Run(fmt.Sprintf("nodes=%d/%s/full/podinfo-cache", nodes, kind), func(b *testing.B) {
				in := input()
				cache := filters.NewPodInfoCache()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					snapshot.New(in, snapshot.Config{Features: features, PodInfos: cache})
				}
			})
			b.Run(fmt.Sprintf("nodes=%d/%s/full/no-cache", nodes, kind), func(b *testing.B) {
				in := input()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					snapshot.New(in, snapshot.Config{Features: features})
				}
			})
			for _, changes := range []int{0, 4} {
				b.Run(fmt.Sprintf("nodes=%d/%s/incremental/changes=%d", nodes, kind, changes), func(b *testing.B) {
					benchIncremental(b, input(), changes)
				})
			}
		}
	}
}

// BenchmarkSchedulerMemory reports what the scheduler's state of a 5,000-node cluster with
// 40,000 bound pods (8 per node; 8-GPU nodes, GPUs in use as in cluster) costs in memory:
// the objects (as the informers hold them), two cycles' incremental snapshots, and a
// 64-pod gang solved on the second. It reports the Go heap in use after a GC (heap-MiB) and
// the process's peak resident set (VmHWM, rss-peak-MiB; the test binary's, which includes
// the benchmark harness and the building of the state, and of every variant run before in
// the process), and its resident set once free memory is returned to the OS (rss-held-MiB:
// the state's, with no GC headroom). The objects are built in-process, so an informer's indexes are not
// counted; the decoded variants hold the slices as an informer does (decoded from protobuf,
// with managedFields), without and with the scheduler's informer transform. The
// partitionable-mig variants publish fixture.PartitionableSlices (4 attributes per MIG
// device, two counters per GPU: smaller than real); the agent-mig variants publish what
// tessera-node publishes for a DGX H100 with every GPU in dynamic MIG (agentMIGSlices).
func BenchmarkSchedulerMemory(b *testing.B) {
	for _, v := range []struct {
		name          string
		partitionable bool
		slices        sliceForm
		// agent: each node's slices as the node agent builds them (agentMIGSlices)
		// rather than fixture.PartitionableSlices.
		agent bool
	}{
		{"whole", false, inProcess, false},
		{"partitionable-mig", true, inProcess, false},
		{"partitionable-mig/decoded", true, decodedSlices, false},
		{"partitionable-mig/decoded/transform", true, transformedSlices, false},
		{"agent-mig/decoded", true, decodedSlices, true},
		{"agent-mig/decoded/transform", true, transformedSlices, true},
	} {
		b.Run(fmt.Sprintf("nodes=5000/pods=40000/%s", v.name), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				in := clusterWith(5000, v.partitionable, 8)
				tr := informerset.NewSliceTransform()
				if v.agent {
					// Node by node, so that only one node's in-process slices are
					// alive beside the informer's copies.
					in.Slices = nil
					for _, n := range in.Nodes {
						in.Slices = append(in.Slices, asInformerHolds(b, agentMIGSlices(b, n.Name), v.slices, tr)...)
					}
				} else {
					in.Slices = asInformerHolds(b, in.Slices, v.slices, tr)
				}
				runtime.GC()
				cache := snapshot.NewCache()
				cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), Cache: cache, PodInfos: filters.NewPodInfoCache()}
				cache.Snapshot(in, cfg)
				snap := cache.Snapshot(in, cfg)
				s := solver.New(solver.Config{Filters: newFilters(b, nil)})
				res, err := s.Solve(context.Background(), snap, gang(64))
				if err != nil || len(res.Placements) != 64 {
					b.Fatalf("Solve: %v", err)
				}
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
				b.ReportMetric(float64(len(in.Pods)), "pods")
				if hwm, ok := procStatus("VmHWM"); ok {
					b.ReportMetric(float64(hwm)/(1<<20), "rss-peak-MiB")
				}
				// What the process keeps resident for the state once the garbage of
				// building it is returned to the OS (as the runtime's scavenger does
				// on an idle scheduler): the RSS of the held state, without the GC's
				// headroom for allocation during work (GOGC).
				debug.FreeOSMemory()
				if rss, ok := procStatus("VmRSS"); ok {
					b.ReportMetric(float64(rss)/(1<<20), "rss-held-MiB")
				}
				if path := os.Getenv("BENCH_HEAP_PROFILE"); path != "" {
					// What holds the heap while the state is alive (-memprofile is written
					// after it is gone).
					writeHeapProfile(b, path)
				}
				runtime.KeepAlive(snap)
				runtime.KeepAlive(in)
			}
		})
	}
}

// sliceForm is how a memory benchmark holds the cluster's ResourceSlices.
type sliceForm int

const (
	// inProcess: as the fixture builds them (strings and values shared where Go shares them).
	inProcess sliceForm = iota
	// decodedSlices: as an informer without a transform holds them: each slice decoded from
	// protobuf (every string and value allocated on its own), with the managedFields entry of
	// the node agent's writes.
	decodedSlices
	// transformedSlices: decoded, then through the scheduler's informer transform
	// (informerset.SliceTransform).
	transformedSlices
)

// asInformerHolds returns in as form says an informer holds it; tr is the informer's
// transform (one for all of a cluster's slices, as the scheduler has one).
func asInformerHolds(b *testing.B, in []*resourceapi.ResourceSlice, form sliceForm, tr *informerset.SliceTransform) []*resourceapi.ResourceSlice {
	if form == inProcess {
		return in
	}
	out := make([]*resourceapi.ResourceSlice, len(in))
	for i, s := range in {
		s.ManagedFields = []metav1.ManagedFieldsEntry{{
			Manager: "tessera-node", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "resource.k8s.io/v1",
			Time: &metav1.Time{Time: time.Unix(1764547200, 0)}, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:devices":{},"f:driver":{},"f:nodeName":{},"f:pool":{"f:generation":{},"f:name":{},"f:resourceSliceCount":{}},"f:sharedCounters":{}}}`),
		}}
		data, err := s.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		d := &resourceapi.ResourceSlice{}
		if err := d.Unmarshal(data); err != nil {
			b.Fatal(err)
		}
		if form == transformedSlices {
			tr.Slice(d)
		}
		out[i] = d
		in[i] = nil // the in-process copy is garbage from here
	}
	return out
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// procStatus reads a size field of /proc/self/status in bytes: VmHWM, the peak resident
// set; VmRSS, the resident set now.
func procStatus(field string) (int64, bool) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// benchIncremental measures Cache.Snapshot after changes objects changed since the last
// cycle, as between two cycles of a busy cluster: of each change, a pod bound (a new pod
// object, its claim allocated: a new claim object) or, every other time, a pod finished
// (the informer's new object with phase Succeeded). The changes are made off the clock.
func benchIncremental(b *testing.B, base snapshot.Input, changes int) {
	in := base
	in.Pods = append([]*v1.Pod(nil), base.Pods...)
	in.Claims = append([]*resourceapi.ResourceClaim(nil), base.Claims...)
	cache := snapshot.NewCache()
	cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), Cache: cache}
	cache.Snapshot(in, cfg)
	serial := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for c := 0; c < changes; c++ {
			serial++
			node := in.Nodes[(serial*37)%len(in.Nodes)].Name
			if serial%2 == 0 && len(in.Pods) > 0 {
				j := (serial * 13) % len(in.Pods)
				p := in.Pods[j].DeepCopy()
				p.ResourceVersion = fmt.Sprint(serial)
				p.Status.Phase = v1.PodSucceeded
				in.Pods[j] = p
				continue
			}
			name := fmt.Sprintf("new-%d", serial)
			claim := fixture.AllocatedClaim("bench", name, node, "gpu-7")
			p := fixture.Pod("bench", name, name)
			p.Spec.NodeName = node
			p.ResourceVersion = "1"
			p.Status.Phase = v1.PodRunning
			in.Pods = append(in.Pods, p)
			in.Claims = append(in.Claims, claim)
		}
		b.StartTimer()
		cache.Snapshot(in, cfg)
	}
}
