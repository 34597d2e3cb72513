package snapshot_test

import (
	"fmt"
	"reflect"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// reserve returns the input with each allocated claim replaced by a copy reserved for one
// or two random pods of the world (or, sometimes, for a pod that does not exist or for
// none), as claims of running pods are.
func (w *world) reserve(in snapshot.Input) snapshot.Input {
	out := in
	out.Claims = nil
	for _, c := range in.Claims {
		if c.Status.Allocation != nil && len(in.Pods) > 0 && w.r.Intn(5) > 0 {
			c = c.DeepCopy()
			for n := 1 + w.r.Intn(2); n > 0; n-- {
				uid := in.Pods[w.r.Intn(len(in.Pods))].UID
				if w.r.Intn(8) == 0 {
					uid = "gone"
				}
				c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: string(uid), UID: uid})
			}
		}
		out.Claims = append(out.Claims, c)
	}
	return out
}

// victims picks a random set of the input's pods (and sometimes a UID no pod has).
func (w *world) victims(in snapshot.Input) map[types.UID]bool {
	out := map[types.UID]bool{}
	for n := w.r.Intn(6); n >= 0 && len(in.Pods) > 0; n-- {
		out[in.Pods[w.r.Intn(len(in.Pods))].UID] = true
	}
	if w.r.Intn(6) == 0 {
		out["gone"] = true
	}
	return out
}

// TestWhatIfMatchesFull: over random clusters and random victim sets, the what-if snapshot
// ("the cycle's cluster without these pods, their claims released") holds exactly what New
// builds from scratch from the filtered input (snapshot.Without) — in every field the
// solver, the allocator and the filters read (Fingerprint) and in the released claims —
// whether it is derived from the cycle's incremental state or (for a cycle snapshot New
// built, or a cycle whose cache has moved on) built with New; Assume on a what-if leaves the cycle's
// snapshot and the next what-if alone, and Assume on the cycle's snapshot leaves the
// what-ifs alone.
func TestWhatIfMatchesFull(t *testing.T) {
	sets, released, pvcs := 0, 0, 0
	for seed := int64(1); seed <= 30; seed++ {
		w := newWorld(500 + seed)
		cache := snapshot.NewCache()
		cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), Cache: cache}
		var old *snapshot.WhatIf
		var oldIn snapshot.Input
		for cycle := 0; cycle < 12; cycle++ {
			in := w.reserve(w.input())
			cycleSnap := cache.Snapshot(in, cfg)
			whatIfs := map[string]*snapshot.WhatIf{
				"incremental": snapshot.NewWhatIf(cycleSnap, in, cfg),
				"from New":    snapshot.NewWhatIf(snapshot.New(in, cfg), in, cfg),
			}
			cycleClaims := allClaims(in)
			before := snapshot.Fingerprint(cycleSnap, cycleClaims)
			check := func(kind string, wi *snapshot.WhatIf, in snapshot.Input) {
				t.Helper()
				victims := w.victims(in)
				ref := snapshot.Without(in, victims)
				want := snapshot.New(ref, snapshot.Config{Features: features})
				got := wi.Without(victims)
				// Released claims are each what-if's own copies: compared by content.
				rel := map[string]bool{}
				for i, c := range ref.Claims {
					if o := in.Claims[i]; o != c {
						rel[c.Name] = true
						released++
						g := got.Claim(c.Namespace, c.Name)
						if g == o || !reflect.DeepEqual(g, c) {
							t.Fatalf("seed %d cycle %d %s: released claim %s: got %+v, want %+v", seed, cycle, kind, c.Name, g.Status, c.Status)
						}
					}
				}
				var claims []*resourceapi.ResourceClaim
				for _, c := range allClaims(ref) {
					if !rel[c.Name] {
						claims = append(claims, c)
					}
				}
				for uid := range victims {
					for _, p := range in.Pods {
						if p.UID == uid && len(p.Spec.Volumes) > 0 {
							pvcs++
						}
					}
				}
				wantPrint := snapshot.Fingerprint(want, claims)
				if g := snapshot.Fingerprint(got, claims); g != wantPrint {
					t.Fatalf("seed %d cycle %d %s: what-if without %v differs from the snapshot built from scratch:\n%s", seed, cycle, kind, victims, diff(g, wantPrint))
				}
				sets++
				// Assume on the what-if (as consolidation does) changes neither the cycle's
				// snapshot nor the next what-if of the same set.
				if len(got.Nodes) > 0 {
					ni := got.Nodes[w.r.Intn(len(got.Nodes))]
					got.Assume(ni.Name(), fixture.Pod("ns", fmt.Sprintf("moved-%d", sets)), nil)
				}
				if g := snapshot.Fingerprint(wi.Without(victims), claims); g != wantPrint {
					t.Fatalf("seed %d cycle %d %s: a what-if changed after Assume on an earlier one:\n%s", seed, cycle, kind, diff(g, wantPrint))
				}
			}
			for _, kind := range []string{"incremental", "from New"} { // in order: the same draws each run
				for range 3 {
					check(kind, whatIfs[kind], in)
				}
			}
			if c, o := snapshot.WhatIfSources(whatIfs["incremental"]); c != 6 || o != 0 {
				t.Fatalf("seed %d cycle %d: the what-ifs of the cycle's snapshot were derived %d times from its state and built %d times with New, want 6 and 0", seed, cycle, c, o)
			}
			if c, o := snapshot.WhatIfSources(whatIfs["from New"]); c != 0 || o != 6 {
				t.Fatalf("seed %d cycle %d: the what-ifs of a snapshot New built were derived %d times from a cycle's state and built %d times with New, want 0 and 6", seed, cycle, c, o)
			}
			if g := snapshot.Fingerprint(cycleSnap, cycleClaims); g != before {
				t.Fatalf("seed %d cycle %d: what-ifs changed the cycle's snapshot:\n%s", seed, cycle, diff(g, before))
			}
			// The cycle places a pod (as Decide does before it simulates victims).
			if len(cycleSnap.Nodes) > 0 {
				cycleSnap.Assume(cycleSnap.Nodes[0].Name(), fixture.Pod("ns", fmt.Sprintf("placed-%d", cycle)), nil)
				check("after Assume on the cycle", whatIfs["incremental"], in)
			}
			// The previous cycle's what-ifs, now that the cache has moved on.
			if old != nil {
				_, o := snapshot.WhatIfSources(old)
				check("previous cycle", old, oldIn)
				if _, o2 := snapshot.WhatIfSources(old); o2 != o+2 {
					t.Fatalf("seed %d cycle %d: the previous cycle's what-ifs were not built with New once the cache moved on", seed, cycle)
				}
			}
			old, oldIn = whatIfs["incremental"], in
			w.step()
		}
	}
	t.Logf("%d victim sets, %d claims released, %d PVC pods evicted", sets, released, pvcs)
	if released == 0 || pvcs == 0 {
		t.Fatalf("the random victim sets should release claims and free PVCs: %d claims released, %d PVC pods in %d sets", released, pvcs, sets)
	}
}

// TestWhatIfConcurrent: what-ifs of one cycle derived in parallel, while the cache moves on
// to the next cycle, are each the snapshot built from scratch (run with -race).
func TestWhatIfConcurrent(t *testing.T) {
	w := newWorld(900)
	cache := snapshot.NewCache()
	cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), Cache: cache}
	in := w.reserve(w.input())
	wi := snapshot.NewWhatIf(cache.Snapshot(in, cfg), in, cfg)
	var sets []map[types.UID]bool
	var want []string
	for range 8 {
		v := w.victims(in)
		ref := snapshot.Without(in, v)
		var claims []*resourceapi.ResourceClaim
		for i, c := range ref.Claims {
			if c == in.Claims[i] {
				claims = append(claims, c)
			}
		}
		sets = append(sets, v)
		want = append(want, snapshot.Fingerprint(snapshot.New(ref, snapshot.Config{Features: features}), claims))
	}
	w.step()
	next := w.reserve(w.input())
	got := make([]*snapshot.Snapshot, len(sets))
	var wg sync.WaitGroup
	for i := range sets {
		wg.Go(func() { got[i] = wi.Without(sets[i]) })
	}
	cache.Snapshot(next, cfg)
	wg.Wait()
	// Fingerprinted afterwards: Quantity.String caches its result (not safe in parallel).
	for i := range sets {
		var claims []*resourceapi.ResourceClaim
		for j, c := range snapshot.Without(in, sets[i]).Claims {
			if c == in.Claims[j] {
				claims = append(claims, c)
			}
		}
		if g := snapshot.Fingerprint(got[i], claims); g != want[i] {
			t.Fatalf("what-if %d differs from the snapshot built from scratch:\n%s", i, diff(g, want[i]))
		}
	}
}

// TestRequestsMatchPodRequests: Snapshot.Requests, which reuses the sums the incremental
// state keeps for bound pods, is PodRequests for every pod of random clusters across
// cycles, on Cache snapshots (also an older cycle's) and on New's.
func TestRequestsMatchPodRequests(t *testing.T) {
	reused := 0
	for seed := int64(1); seed <= 10; seed++ {
		w := newWorld(700 + seed)
		cache := snapshot.NewCache()
		cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), Cache: cache}
		var prev *snapshot.Snapshot
		var prevIn snapshot.Input
		for cycle := 0; cycle < 10; cycle++ {
			in := w.input()
			snaps := map[string]*snapshot.Snapshot{"cache": cache.Snapshot(in, cfg), "new": snapshot.New(in, cfg)}
			for kind, s := range snaps {
				for _, p := range in.Pods {
					if got, want := s.Requests(p), snapshot.PodRequests(p); !equalLists(got, want) {
						t.Fatalf("seed %d cycle %d %s: pod %s requests %v, want %v", seed, cycle, kind, p.Name, got, want)
					}
					// The kept sum is the same map each time; PodRequests makes a new one.
					if kind == "cache" && p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded {
						first, second := s.Requests(p), s.Requests(p)
						if reflect.ValueOf(first).Pointer() != reflect.ValueOf(second).Pointer() {
							t.Fatalf("seed %d cycle %d: the requests of bound pod %s were summed again", seed, cycle, p.Name)
						}
						reused++
					}
				}
			}
			if prev != nil {
				for _, p := range prevIn.Pods {
					if got, want := prev.Requests(p), snapshot.PodRequests(p); !equalLists(got, want) {
						t.Fatalf("seed %d cycle %d previous cycle: pod %s requests %v, want %v", seed, cycle, p.Name, got, want)
					}
				}
			}
			prev, prevIn = snaps["cache"], in
			w.step()
		}
	}
	if reused == 0 {
		t.Fatal("no bound pods")
	}
}

func equalLists(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for name, q := range a {
		if o, ok := b[name]; !ok || q.Cmp(o) != 0 {
			return false
		}
	}
	return true
}
