package bench

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// BenchmarkDecidePreemption is one policy cycle on 1,000 nodes × 8 GPUs with 500 running
// gangs and 50 waiting gangs of 2 pods × 8 GPUs, in three shapes where each eviction rule has
// to simulate victims before it evicts:
//
//   - preemption: the 500 running gangs (priority 0, queue q, quota 8,000) hold every GPU; the
//     waiting ones have priority 100: preemption simulates the youngest running gang's eviction.
//   - reclaim: the running gangs are queue qa's, the waiting ones qb's (two root queues,
//     quota 0, weight 1): qb is below its fair share and reclaims qa's newest gangs.
//   - consolidation: each running gang has 8 pods of 1 GPU, four on each of two nodes (minMember
//     1, owned by a ReplicaSet), so every node has 4 free GPUs: 4,000 free, none of them 8 on
//     one node. Preemption and reclaim find no victims; consolidation frees two nodes by
//     moving 8 pods and simulates that they run again elsewhere.
//
// The snapshot configuration is the scheduler's (CEL, PodInfo and pre-selection caches kept
// across cycles, so that the caches are as warm as in a running scheduler). Each iteration
// builds the cycle's snapshot (not timed, as the scheduler builds it before Decide: with
// the scheduler's snapshot.Cache) and times Decide with fresh memory, so that every
// iteration chooses victims. Reports p50/p99 per cycle, the process's CPU time per cycle
// and victim sets simulated per cycle (ns/op, B/op and allocs/op are Decide's alone), with the snapshot's count check (fit.go)
// on and off, and once with the cycle's snapshot built by snapshot.New (as the shadow
// builds it: the victim simulations then derive the cycle's state once, in Decide).
func BenchmarkDecidePreemption(b *testing.B) {
	for _, shape := range []string{"preemption", "reclaim", "consolidation"} {
		// fit-check=off: snapshot.Config NoFitCheck, the allocator runs on every node the
		// search reaches (the path before the count check, for comparison in one run).
		for _, check := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/fit-check=%s", shape, map[bool]string{true: "on", false: "off"}[check]), func(b *testing.B) { benchDecide(b, shape, !check, false) })
		}
		b.Run(shape+"/fit-check=on/cycle-snapshot=new", func(b *testing.B) { benchDecide(b, shape, false, true) })
	}
}

func benchDecide(b *testing.B, shape string, noFitCheck, newSnapshot bool) {
	const nodes, running, waiting = 1000, 500, 50
	var raw snapshot.Input
	newQueue := func(name, quota string) *v1alpha1.Queue {
		q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name)}}
		q.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse(quota)), OverQuotaWeight: ptr.To[int32](1)}
		return q
	}
	queues := []*v1alpha1.Queue{newQueue("q", "8000")}
	runQ, waitQ := "q", "q"
	var runPrio, waitPrio int32 = 0, 100
	if shape == "reclaim" {
		queues = []*v1alpha1.Queue{newQueue("qa", "0"), newQueue("qb", "0")}
		runQ, waitQ, waitPrio = "qa", "qb", 0
	}
	if shape == "consolidation" {
		waitPrio = 0
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var gangs []*decide.Gang
	newGang := func(name, queue string, prio int32, minMember int32, created time.Time) *decide.Gang {
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID("pg-" + name), ResourceVersion: "1", Generation: 1,
			CreationTimestamp: metav1.NewTime(created)}, Spec: v1alpha1.PodGroupSpec{MinMember: minMember, Queue: queue, Priority: prio}}
		return &decide.Gang{Key: "bench/" + name, PodGroup: pg, MappedReason: v1alpha1.ReasonManual}
	}
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		raw.Nodes = append(raw.Nodes, fixture.Node(name, map[string]string{"rack": fmt.Sprintf("rack-%02d", i/20)}))
		raw.Slices = append(raw.Slices, fixture.WholeGPUSlices(name, 8)...)
	}
	bound := func(gg *decide.Gang, pod, node string, devs []string) {
		c := fixture.AllocatedClaim("bench", pod, node, devs...)
		po := fixture.Pod("bench", pod, c.Name)
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: po.UID}}
		po.Spec.NodeName, po.Status.Phase, po.ResourceVersion = node, v1.PodRunning, "1"
		po.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: gg.PodGroup.Name}
		po.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: gg.PodGroup.Name, UID: types.UID("rs-" + gg.PodGroup.Name), Controller: ptr.To(true)}}
		raw.Claims = append(raw.Claims, c)
		raw.Pods = append(raw.Pods, po)
		gg.Bound = append(gg.Bound, po)
		gg.Running++
	}
	for g := range running {
		if shape == "consolidation" {
			gg := newGang(fmt.Sprintf("run-%03d", g), runQ, runPrio, 1, base.Add(time.Duration(g)*time.Second))
			for p := range 8 {
				node := fmt.Sprintf("node-%04d", 2*g+p/4)
				bound(gg, fmt.Sprintf("run-%03d-%d", g, p), node, []string{fmt.Sprintf("gpu-%d", p%4)})
			}
			gangs = append(gangs, gg)
			continue
		}
		gg := newGang(fmt.Sprintf("run-%03d", g), runQ, runPrio, 2, base.Add(time.Duration(g)*time.Second))
		for p := range 2 {
			var devs []string
			for d := range 8 {
				devs = append(devs, fmt.Sprintf("gpu-%d", d))
			}
			bound(gg, fmt.Sprintf("run-%03d-%d", g, p), fmt.Sprintf("node-%04d", 2*g+p), devs)
		}
		gangs = append(gangs, gg)
	}
	for g := range waiting {
		gg := newGang(fmt.Sprintf("wait-%02d", g), waitQ, waitPrio, 2, base.Add(time.Hour))
		for p := range 2 {
			pod := fmt.Sprintf("wait-%02d-%d", g, p)
			c := fixture.GPUClaim("bench", pod, 8)
			po := fixture.Pod("bench", pod, c.Name)
			po.ResourceVersion = "1"
			po.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: gg.PodGroup.Name}
			raw.Claims = append(raw.Claims, c)
			raw.Pods = append(raw.Pods, po)
			gg.Pending = append(gg.Pending, po)
		}
		gangs = append(gangs, gg)
	}
	raw.Classes = fixture.DeviceClasses()
	// As the scheduler configures its snapshots (controlplane/scheduler snapshotConfig).
	snapCfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), PodInfos: filters.NewPodInfoCache(), Cache: snapshot.NewCache(), NoFitCheck: noFitCheck}
	cfg := decide.Config{Solver: solver.New(solver.Config{TopologyKeys: []string{"rack"}, Filters: newFilters(b, nil)}), Snapshot: snapCfg}
	ctx := klog.NewContext(context.Background(), logr.Discard())
	want := map[string]int{"preemption": 2, "reclaim": 2, "consolidation": 8}[shape]
	var cpuTotal time.Duration
	cycle := func() (*decide.Decisions, time.Duration) {
		b.StopTimer()
		snap := snapCfg.Cache.Snapshot(raw, snapCfg)
		if newSnapshot {
			snap = snapshot.New(raw, snapCfg)
		}
		in := decide.Input{Now: base.Add(2 * time.Hour), Snapshot: snap, Raw: raw, Queues: queues, Gangs: gangs}
		b.StartTimer()
		cpu0 := processCPU()
		start := time.Now()
		d := decide.Decide(ctx, cfg, in, decide.NewMemory())
		took := time.Since(start)
		cpuTotal += processCPU() - cpu0
		return d, took
	}
	cycle() // warm the caches, as a running scheduler has them
	cpuTotal = 0
	var lat []time.Duration
	simulated := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, took := cycle()
		lat = append(lat, took)
		if len(d.Evictions) != want {
			b.Fatalf("%s: evicted %d pods, want %d", shape, len(d.Evictions), want)
		}
		simulated += d.VictimSetsSimulated
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(float64(simulated)/float64(b.N), "victim-sets/cycle")
	// CPU time of the process (user + system, GC included) during Decide: what the cycle
	// costs, which a loaded machine changes far less than the wall clock.
	b.ReportMetric(float64(cpuTotal.Microseconds())/1000/float64(b.N), "cpu-ms/cycle")
}

// processCPU is the user and system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecideSteady is one cycle of churn's steady state: 200 nodes × 8 GPUs, 800 bound
// lone one-GPU pods (each its own gang of one in queue q, as the mapper makes them for pods
// no workload definition knows) and one new lone pod waiting. Every cycle charges each bound
// pod to its queue and checks each gang's status before it places the new pod; that work per
// bound pod, repeated in every cycle, was most of tessera-scheduler's CPU under churn
// (docs/benchmarks.md, "Where tessera's CPU goes under churn"). The snapshot is built with the
// scheduler's cache and not timed; Memory is kept across cycles as the scheduler keeps it.
func BenchmarkDecideSteady(b *testing.B) {
	const nodes, bound = 200, 800
	var raw snapshot.Input
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "q", UID: "q"}}
	q.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse("2000")), OverQuotaWeight: ptr.To[int32](1)}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	newGang := func(name string, created time.Time) *decide.Gang {
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID("pg-" + name), ResourceVersion: "1", Generation: 1,
			CreationTimestamp: metav1.NewTime(created)}, Spec: v1alpha1.PodGroupSpec{MinMember: 1, Queue: "q"}}
		return &decide.Gang{Key: "bench/" + name, PodGroup: pg, MappedReason: v1alpha1.ReasonManual}
	}
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		raw.Nodes = append(raw.Nodes, fixture.Node(name, nil))
		raw.Slices = append(raw.Slices, fixture.WholeGPUSlices(name, 8)...)
	}
	var gangs []*decide.Gang
	for i := range bound {
		name := fmt.Sprintf("run-%04d", i)
		gg := newGang(name, base.Add(time.Duration(i)*time.Second))
		c := fixture.AllocatedClaim("bench", name, fmt.Sprintf("node-%04d", i/4), fmt.Sprintf("gpu-%d", i%4))
		po := fixture.Pod("bench", name, c.Name)
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: po.UID}}
		po.Spec.NodeName, po.Status.Phase, po.ResourceVersion = fmt.Sprintf("node-%04d", i/4), v1.PodRunning, "1"
		po.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: name}
		raw.Claims = append(raw.Claims, c)
		raw.Pods = append(raw.Pods, po)
		gg.Bound = append(gg.Bound, po)
		gg.Running++
		gangs = append(gangs, gg)
	}
	gg := newGang("new", base.Add(time.Hour))
	c := fixture.GPUClaim("bench", "new", 1)
	po := fixture.Pod("bench", "new", c.Name)
	po.ResourceVersion = "1"
	po.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: "new"}
	raw.Claims = append(raw.Claims, c)
	raw.Pods = append(raw.Pods, po)
	gg.Pending = append(gg.Pending, po)
	gangs = append(gangs, gg)
	raw.Classes = fixture.DeviceClasses()

	snapCfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), PodInfos: filters.NewPodInfoCache(), Cache: snapshot.NewCache()}
	cfg := decide.Config{Solver: solver.New(solver.Config{Filters: newFilters(b, nil)}), Snapshot: snapCfg}
	ctx := klog.NewContext(context.Background(), logr.Discard())
	mem := decide.NewMemory()
	var cpuTotal time.Duration
	cycle := func() *decide.Decisions {
		b.StopTimer()
		snap := snapCfg.Cache.Snapshot(raw, snapCfg)
		in := decide.Input{Now: base.Add(2 * time.Hour), Snapshot: snap, Raw: raw, Queues: []*v1alpha1.Queue{q}, Gangs: gangs}
		b.StartTimer()
		cpu0 := processCPU()
		d := decide.Decide(ctx, cfg, in, mem)
		cpuTotal += processCPU() - cpu0
		return d
	}
	check := func(d *decide.Decisions) {
		if len(d.Placements) != 1 {
			b.Fatalf("placed %d gangs, want the new pod's", len(d.Placements))
		}
		if u := d.Queues.Get("q").Allocated[v1alpha1.ResourceGPU]; u != bound+1 { // the bound pods and the one placed
			b.Fatalf("queue q is charged %v GPUs, want %d", u, bound+1)
		}
	}
	// The first cycle warms the caches, as a running scheduler has them, and writes the
	// gangs' statuses: in the steady state the PodGroups carry them (only the new pod's gang
	// changes).
	first := cycle()
	check(first)
	byPG := map[*v1alpha1.PodGroup]*decide.Gang{}
	for _, g := range gangs {
		byPG[g.PodGroup] = g
	}
	for _, st := range first.Statuses {
		if g := byPG[st.PodGroup]; g != nil && g.Bound != nil {
			pg := *g.PodGroup
			pg.Status = st.Status
			g.PodGroup = &pg
		}
	}
	if d := cycle(); len(d.Statuses) > 1 {
		b.Fatalf("%d status writes in the steady state, want the new gang's at most", len(d.Statuses))
	}
	cpuTotal = 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		check(cycle())
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTotal.Microseconds())/1000/float64(b.N), "cpu-ms/cycle")
}
