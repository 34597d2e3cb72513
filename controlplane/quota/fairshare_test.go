package quota

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Fair shares level by level: quota first (as far as wanted), the rest by weight among the
// siblings that want more, each up to its demand; limits cap; past usage lowers the
// over-quota weight; each resource on its own.
func TestFairShare(t *testing.T) {
	type q struct {
		name, parent, quota, limit string
		weight                     int32
		allocated, demand          float64 // GPU units held and wanted on top
		usage                      float64 // past usage (fraction of the cluster)
	}
	for _, tc := range []struct {
		name     string
		capacity float64
		k        float64
		queues   []q
		want     map[string]float64
	}{
		{name: "equal weights, one wants less", capacity: 32, queues: []q{
			{name: "a", weight: 1, allocated: 32}, {name: "b", weight: 1, demand: 16}, {name: "idle", weight: 1},
		}, want: map[string]float64{"a": 16, "b": 16, "idle": 0}},
		{name: "quota then weight 1:3", capacity: 16, queues: []q{
			{name: "a", quota: "4", weight: 1, demand: 12}, {name: "b", quota: "4", weight: 3, demand: 12},
		}, want: map[string]float64{"a": 6, "b": 10}},
		{name: "demand below the weighted share is passed on", capacity: 30, queues: []q{
			{name: "a", weight: 1, demand: 2}, {name: "b", weight: 1, demand: 30}, {name: "c", weight: 1, demand: 30},
		}, want: map[string]float64{"a": 2, "b": 14, "c": 14}},
		{name: "limit caps", capacity: 32, queues: []q{
			{name: "a", limit: "8", weight: 1, demand: 32}, {name: "b", weight: 1, demand: 32},
		}, want: map[string]float64{"a": 8, "b": 24}},
		{name: "quotas promise more than there is", capacity: 12, queues: []q{
			{name: "a", quota: "8", weight: 1, demand: 8}, {name: "b", quota: "8", weight: 1, demand: 8},
		}, want: map[string]float64{"a": 6, "b": 6}},
		{name: "weight 0 borrows nothing while others want", capacity: 16, queues: []q{
			{name: "a", quota: "4", weight: 0, demand: 16}, {name: "b", weight: 1, demand: 16},
		}, want: map[string]float64{"a": 4, "b": 12}},
		{name: "hierarchy: the parent's share is divided among its children", capacity: 32, queues: []q{
			{name: "p", weight: 1}, {name: "x", parent: "p", weight: 1, allocated: 32}, {name: "y", parent: "p", weight: 1, demand: 16},
			{name: "other", weight: 1, demand: 8},
		}, want: map[string]float64{"p": 24, "x": 12, "y": 12, "other": 8}},
		{name: "past usage: a queue that held the cluster yields its over-quota share", capacity: 16, k: 2, queues: []q{
			{name: "a", weight: 1, allocated: 16, usage: 0.8}, {name: "b", weight: 1, demand: 16, usage: 0.05},
		}, want: map[string]float64{"a": 0, "b": 16}},
		{name: "past usage: balanced history splits evenly", capacity: 16, k: 2, queues: []q{
			{name: "a", weight: 1, allocated: 16, usage: 0.5}, {name: "b", weight: 1, demand: 16, usage: 0.5},
		}, want: map[string]float64{"a": 8, "b": 8}},
		{name: "past usage never holds capacity back", capacity: 16, k: 2, queues: []q{
			{name: "a", weight: 1, allocated: 4, demand: 12, usage: 0.9}, {name: "b", weight: 1, demand: 4},
		}, want: map[string]float64{"a": 12, "b": 4}},
		{name: "past usage does not touch quota", capacity: 16, k: 2, queues: []q{
			{name: "a", quota: "6", weight: 1, allocated: 16, usage: 1}, {name: "b", weight: 1, demand: 16},
		}, want: map[string]float64{"a": 6, "b": 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var qs []*v1alpha1.Queue
			for _, x := range tc.queues {
				qs = append(qs, queue(x.name, x.parent, x.quota, x.limit, x.weight))
			}
			tree := Build(qs)
			usage := map[string]Usage{}
			for _, x := range tc.queues {
				tree.Charge(x.name, gpus(x.allocated))
				tree.Demand(x.name, gpus(x.demand))
				usage[x.name] = gpus(x.usage)
			}
			tree.ComputeFairShare(FairShareConfig{Capacity: gpus(tc.capacity), Usage: usage, K: tc.k})
			for name, want := range tc.want {
				if got := tree.Get(name).FairShare[v1alpha1.ResourceGPU]; math.Abs(got-want) > 1e-6 {
					t.Errorf("fair share of %s = %g, want %g", name, got, want)
				}
			}
		})
	}
}

// CPU and memory are divided on their own: a queue that wants no GPUs still gets its CPU
// share, and its GPU share is zero.
func TestFairSharePerResource(t *testing.T) {
	cpuQueue := queue("cpu", "", "", "", 1)
	cpuQueue.Spec.Resources.CPU = &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse("10")), OverQuotaWeight: ptr.To[int32](1)}
	tree := Build([]*v1alpha1.Queue{cpuQueue, queue("gpu", "", "", "", 1)})
	tree.Charge("gpu", Usage{v1alpha1.ResourceGPU: 8, v1alpha1.ResourceCPU: 30})
	tree.Demand("cpu", Usage{v1alpha1.ResourceCPU: 40})
	tree.ComputeFairShare(FairShareConfig{Capacity: Usage{v1alpha1.ResourceGPU: 8, v1alpha1.ResourceCPU: 64}})
	if got := tree.Get("cpu").FairShare; got[v1alpha1.ResourceCPU] != 10+27 || got[v1alpha1.ResourceGPU] != 0 {
		t.Errorf("cpu queue's fair share = %v, want cpu 37 (10 quota + half of the other 54), gpu 0", got)
	}
	if got := tree.Get("gpu").FairShare; got[v1alpha1.ResourceCPU] != 27 || got[v1alpha1.ResourceGPU] != 8 {
		t.Errorf("gpu queue's fair share = %v, want cpu 27, gpu 8", got)
	}
	if s := tree.Get("gpu").Saturation([]string{v1alpha1.ResourceGPU, v1alpha1.ResourceCPU}); math.Abs(s-30.0/27) > 1e-9 {
		t.Errorf("saturation on the dominant resource = %g, want 30/27", s)
	}
}

// Borrowers are ordered by over-quota usage per effective weight: past usage sends a queue
// back.
func TestRankFollowsEffectiveWeight(t *testing.T) {
	tree := Build([]*v1alpha1.Queue{queue("a", "", "", "", 1), queue("b", "", "", "", 1)})
	tree.Charge("a", gpus(2))
	tree.Charge("b", gpus(4))
	tree.Demand("a", gpus(8))
	tree.Demand("b", gpus(8))
	if !tree.RankOf("a", gpus(1)).Less(tree.RankOf("b", gpus(1))) {
		t.Fatal("without history the queue holding less should go first")
	}
	tree.ComputeFairShare(FairShareConfig{Capacity: gpus(16), K: 2, Usage: map[string]Usage{"a": gpus(0.7)}})
	if !tree.RankOf("b", gpus(1)).Less(tree.RankOf("a", gpus(1))) {
		t.Fatalf("with a's long past usage b should go first (effective weights a %g, b %g)", tree.Get("a").EffectiveWeight("gpu"), tree.Get("b").EffectiveWeight("gpu"))
	}
}

// A non-preemptible gang runs only within quota, on every queue of its path.
func TestAdmitWithinQuota(t *testing.T) {
	tree := Build([]*v1alpha1.Queue{queue("org", "", "8", "", 1), queue("team", "org", "6", "", 1), queue("free", "", "", "", 1)})
	tree.Charge("team", gpus(4))
	if ok, why := tree.AdmitWithinQuota("team", gpus(2)); !ok {
		t.Errorf("within quota refused: %s", why)
	}
	if ok, why := tree.AdmitWithinQuota("team", gpus(3)); ok || why == "" {
		t.Errorf("beyond team's quota admitted")
	}
	if ok, _ := tree.AdmitWithinQuota("free", gpus(1)); ok {
		t.Errorf("a queue without GPU quota ran a non-preemptible GPU gang")
	}
}
