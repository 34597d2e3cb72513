package bench

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// BenchmarkDecidePreemption is one policy cycle on 1,000 nodes × 8 GPUs, all held by 500
// running priority-0 gangs of 2 pods × 8 GPUs (queue q, quota 8,000), with 50 waiting
// priority-100 gangs of the same shape: every cycle has to simulate victims (priority
// preemption) before it evicts. Each iteration builds the cycle's snapshot (not timed, as the
// scheduler builds it before Decide) and times Decide with fresh memory, so that every
// iteration chooses victims. Reports p50/p99 per cycle and victim sets simulated per cycle.
func BenchmarkDecidePreemption(b *testing.B) {
	const nodes, running, waiting = 1000, 500, 50
	var raw snapshot.Input
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "q", UID: "q"}}
	q.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse("8000")), OverQuotaWeight: ptr.To[int32](1)}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var gangs []*decide.Gang
	newGang := func(name string, prio int32, created time.Time) *decide.Gang {
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID("pg-" + name), ResourceVersion: "1", Generation: 1,
			CreationTimestamp: metav1.NewTime(created)}, Spec: v1alpha1.PodGroupSpec{MinMember: 2, Queue: "q", Priority: prio}}
		return &decide.Gang{Key: "bench/" + name, PodGroup: pg, MappedReason: v1alpha1.ReasonManual}
	}
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		raw.Nodes = append(raw.Nodes, fixture.Node(name, map[string]string{"rack": fmt.Sprintf("rack-%02d", i/20)}))
		raw.Slices = append(raw.Slices, fixture.WholeGPUSlices(name, 8)...)
	}
	for g := range running {
		gg := newGang(fmt.Sprintf("run-%03d", g), 0, base.Add(time.Duration(g)*time.Second))
		for p := range 2 {
			node := fmt.Sprintf("node-%04d", 2*g+p)
			pod := fmt.Sprintf("run-%03d-%d", g, p)
			var devs []string
			for d := range 8 {
				devs = append(devs, fmt.Sprintf("gpu-%d", d))
			}
			c := fixture.AllocatedClaim("bench", pod, node, devs...)
			po := fixture.Pod("bench", pod, c.Name)
			c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: po.UID}}
			po.Spec.NodeName, po.Status.Phase, po.ResourceVersion = node, v1.PodRunning, "1"
			po.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: gg.PodGroup.Name}
			raw.Claims = append(raw.Claims, c)
			raw.Pods = append(raw.Pods, po)
			gg.Bound = append(gg.Bound, po)
			gg.Running++
		}
		gangs = append(gangs, gg)
	}
	for g := range waiting {
		gg := newGang(fmt.Sprintf("wait-%02d", g), 100, base.Add(time.Hour))
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
	snapCfg := snapshot.Config{Features: features}
	cfg := decide.Config{Solver: solver.New(solver.Config{TopologyKeys: []string{"rack"}, Filters: newFilters(b, nil)}), Snapshot: snapCfg}
	ctx := context.Background()
	var lat []time.Duration
	simulated := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		in := decide.Input{Now: base.Add(2 * time.Hour), Snapshot: snapshot.New(raw, snapCfg), Raw: raw, Queues: []*v1alpha1.Queue{q}, Gangs: gangs}
		b.StartTimer()
		start := time.Now()
		d := decide.Decide(ctx, cfg, in, decide.NewMemory())
		lat = append(lat, time.Since(start))
		if len(d.Evictions) != 2 {
			b.Fatalf("evicted %d pods, want the 2 of the youngest running gang", len(d.Evictions))
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
}
