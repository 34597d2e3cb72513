package solver

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// TestPreselectionSameDecisions: the solver decides exactly the same with the snapshot's
// device pre-selection as with every device shown to the allocator (snapshot.Config
// AllDevices) — the same placements, devices, node evaluations and allocator steps, or the
// same unschedulable message — on random clusters and gangs, with the pre-selection fresh,
// reused within a snapshot (a second gang) and reused across snapshots through a Cache
// (the next cycle).
func TestPreselectionSameDecisions(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	rng := rand.New(rand.NewSource(15))
	s := newSolver(t, Config{})
	profiles := []string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	render := func(snap *snapshot.Snapshot, g *Gang) string {
		res, err := s.Solve(ctx, snap, g)
		if err != nil {
			return "error: " + err.Error()
		}
		out := fmt.Sprintf("tries=%d steps=%d:", res.Tries, res.Steps)
		for _, p := range res.Placements {
			out += " " + p.Pod.Name + "@" + p.Node
			for _, a := range p.Allocate {
				for _, r := range a.Allocation.Devices.Results {
					out += "/" + r.Device
				}
			}
		}
		return out
	}
	// withoutSteps drops the step count: the count check (snapshot.Config NoFitCheck) spares
	// allocator calls, so it takes fewer steps for the same decision.
	withoutSteps := func(out string) string {
		if i := strings.Index(out, ":"); i >= 0 && strings.HasPrefix(out, "tries=") {
			return out[i:]
		}
		return out
	}
	placed, failed := 0, 0
	var checkedSteps, baseSteps int64
	for iter := 0; iter < 80; iter++ {
		c := &cluster{}
		for n := 0; n < 1+rng.Intn(6); n++ {
			name := fmt.Sprintf("n%d", n)
			c.node(name, 1+rng.Intn(8), rng.Intn(3) > 0, nil)
			if rng.Intn(3) == 0 {
				c.use(name, 1+rng.Intn(2))
			}
		}
		c.in.Classes = fixture.DeviceClasses()
		gangs := make([]*Gang, 2)
		for gi := range gangs {
			g := &Gang{Name: fmt.Sprintf("ns/g%d-%d", iter, gi)}
			for p := 0; p < 1+rng.Intn(8); p++ {
				name := fmt.Sprintf("g%d-%d-p%d", iter, gi, p)
				var claim *resourceapi.ResourceClaim
				switch rng.Intn(4) {
				case 0:
					claim = fixture.GPUClaim("ns", name, int64(1+rng.Intn(2)))
				case 1, 2:
					claim = fixture.MIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
				default:
					claim = fixture.GPUOrMIGClaim("ns", name, profiles[rng.Intn(len(profiles))])
				}
				g.Pods = append(g.Pods, Pod{Pod: fixture.Pod("ns", name, claim.Name), Claims: []*resourceapi.ResourceClaim{claim}})
			}
			gangs[gi] = g
		}
		cache := snapshot.NewCache()
		all := snapshot.New(c.in, snapshot.Config{Features: allFeatures, AllDevices: true})
		fresh := snapshot.New(c.in, snapshot.Config{Features: allFeatures})
		cycle1 := snapshot.New(c.in, snapshot.Config{Features: allFeatures, Cache: cache})
		for _, g := range gangs {
			render(cycle1, g)
		}
		cycle2 := snapshot.New(c.in, snapshot.Config{Features: allFeatures, Cache: cache})
		base := snapshot.New(c.in, snapshot.Config{Features: allFeatures, AllDevices: true, NoFitCheck: true})
		for gi, g := range gangs {
			want := render(all, g)
			if b := render(base, g); withoutSteps(b) != withoutSteps(want) {
				t.Fatalf("iteration %d gang %d, count check:\n%s\nallocator alone:\n%s", iter, gi, want, b)
			}
			if r1, err := s.Solve(ctx, all, g); err == nil {
				r2, _ := s.Solve(ctx, base, g)
				checkedSteps += r1.Steps
				baseSteps += r2.Steps
			}
			for name, snap := range map[string]*snapshot.Snapshot{"fresh": fresh, "next cycle": cycle2} {
				if got := render(snap, g); got != want {
					t.Fatalf("iteration %d gang %d, pre-selection %s:\n%s\nall devices:\n%s", iter, gi, name, got, want)
				}
			}
			if len(want) > 6 && want[:6] == "error:" {
				failed++
			} else {
				placed++
			}
		}
	}
	t.Logf("%d gangs placed and %d unschedulable, the same with and without pre-selection and the count check; placed gangs took %d allocator steps with the check, %d without", placed, failed, checkedSteps, baseSteps)
	if placed < 30 || failed < 10 {
		t.Fatalf("the random cases should include both outcomes: %d placed, %d unschedulable", placed, failed)
	}
}
