package snapshot_test

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

var features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true, DeviceBindingAndStatus: true,
}

// world is a random cluster that changes the way informers see a cluster change: objects
// are replaced by new ones (never modified), added and removed, and listed in any order.
type world struct {
	r      *rand.Rand
	nodes  map[string]*v1.Node
	slices map[string][]*resourceapi.ResourceSlice // by node name, "net" for network-attached
	pods   map[string]*v1.Pod
	claims map[string]*resourceapi.ResourceClaim
	serial int
}

const worldNodes = 10

func newWorld(seed int64) *world {
	w := &world{r: rand.New(rand.NewSource(seed)), nodes: map[string]*v1.Node{}, slices: map[string][]*resourceapi.ResourceSlice{},
		pods: map[string]*v1.Pod{}, claims: map[string]*resourceapi.ResourceClaim{}}
	for i := 0; i < worldNodes; i++ {
		if w.r.Intn(5) > 0 {
			w.newNode(i)
		}
		if w.r.Intn(6) > 0 {
			w.newSlices(i)
		}
	}
	for i := 0; i < 30; i++ {
		w.newPod()
	}
	for i := 0; i < 15; i++ {
		w.newClaim()
	}
	return w
}

func nodeName(i int) string { return fmt.Sprintf("n%d", i) }

func (w *world) newNode(i int) {
	w.nodes[nodeName(i)] = fixture.Node(nodeName(i), map[string]string{"rack": fmt.Sprintf("r%d", w.r.Intn(3))})
}

// newSlices publishes a node's devices again: whole or partitionable GPUs, sometimes a
// second pool (that sometimes has the name of another node's pool), sometimes none; slices
// of nodes that do not exist stay (the allocator ignores them).
func (w *world) newSlices(i int) {
	name := nodeName(i)
	var sl []*resourceapi.ResourceSlice
	if w.r.Intn(2) == 0 {
		sl = fixture.PartitionableSlices(name, 1+w.r.Intn(3))
	} else {
		sl = fixture.WholeGPUSlices(name, 1+w.r.Intn(4))
	}
	if w.r.Intn(4) == 0 {
		second := fixture.WholeGPUSlices(name, 2)[0]
		pool := name + "-second"
		if w.r.Intn(3) == 0 {
			pool = "dup" // two nodes publish the same pool: the first by name has it
		}
		second.Name, second.Spec.Pool.Name = name+"-second", pool
		sl = append(sl, second)
	}
	w.slices[name] = sl
}

func (w *world) newNet() {
	if w.r.Intn(2) == 0 {
		delete(w.slices, "net")
		return
	}
	net := fixture.WholeGPUSlices("net", 1+w.r.Intn(3))[0]
	net.Spec.NodeName, net.Spec.AllNodes = nil, ptr.To(true)
	w.slices["net"] = []*resourceapi.ResourceSlice{net}
}

func (w *world) pick(n int) string { return nodeName(w.r.Intn(n)) }

// newPod adds or replaces a pod: bound to a node (that may not exist), pending or finished,
// with CPU, a host port, a PVC or pod anti-affinity.
func (w *world) newPod() {
	w.serial++
	name := fmt.Sprintf("p%d", w.r.Intn(40))
	p := fixture.Pod("ns", name)
	p.ResourceVersion = fmt.Sprint(w.serial)
	p.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = *resource.NewMilliQuantity(int64(100*(1+w.r.Intn(20))), resource.DecimalSI)
	if w.r.Intn(5) > 0 {
		p.Spec.NodeName = w.pick(worldNodes + 1)
	}
	switch w.r.Intn(8) {
	case 0:
		p.Status.Phase = v1.PodSucceeded
	case 1:
		p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: int32(8000 + w.r.Intn(2)), Protocol: v1.ProtocolTCP}}
	case 2:
		p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: fmt.Sprintf("pvc-%d", w.r.Intn(4))}}}}
	case 3:
		p.Labels = map[string]string{"app": "x"}
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}, TopologyKey: "kubernetes.io/hostname"}}}}
	default:
		p.Status.Phase = v1.PodRunning
	}
	w.pods[name] = p
}

// newClaim adds or replaces a claim: pending, or allocated devices of a node's pool (that
// may not exist, or may be gone since), of the network-attached pool, some with admin
// access.
func (w *world) newClaim() {
	w.serial++
	name := fmt.Sprintf("c%d", w.r.Intn(20))
	var c *resourceapi.ResourceClaim
	switch w.r.Intn(6) {
	case 0:
		c = fixture.GPUClaim("ns", name, 1)
	case 1:
		c = fixture.AllocatedClaim("ns", name, "net", "gpu-0")
	default:
		node := w.pick(worldNodes + 1)
		var devs []string
		if w.r.Intn(2) == 0 {
			devs = []string{fmt.Sprintf("gpu-%d", w.r.Intn(3))}
		} else {
			devs = []string{fixture.MIGDeviceName(w.r.Intn(2), "1g.10gb", w.r.Intn(7)), fixture.MIGDeviceName(0, "3g.40gb", 4*w.r.Intn(2))}
		}
		c = fixture.AllocatedClaim("ns", name, node, devs...)
		if w.r.Intn(4) == 0 {
			c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
		}
		if w.r.Intn(4) == 0 {
			c.Status.Allocation.Devices.Results[0].Pool = node + "-second"
		}
	}
	c.UID = types.UID("claim-" + name)
	c.ResourceVersion = fmt.Sprint(w.serial)
	w.claims[name] = c
}

// step makes a few random changes, as between two scheduling cycles.
func (w *world) step() {
	for n := w.r.Intn(4); n >= 0; n-- {
		switch w.r.Intn(11) {
		case 0:
			i := w.r.Intn(worldNodes)
			if _, ok := w.nodes[nodeName(i)]; ok && w.r.Intn(2) == 0 {
				delete(w.nodes, nodeName(i))
			} else {
				w.newNode(i) // added, or replaced by a new object
			}
		case 1:
			i := w.r.Intn(worldNodes)
			if w.r.Intn(4) == 0 {
				delete(w.slices, nodeName(i))
			} else {
				w.newSlices(i)
			}
		case 2:
			w.newNet()
		case 3, 4, 5:
			w.newPod()
		case 6:
			delete(w.pods, fmt.Sprintf("p%d", w.r.Intn(40)))
		case 7, 8:
			w.newClaim()
		case 9:
			delete(w.claims, fmt.Sprintf("c%d", w.r.Intn(20)))
		default:
			// Nothing changed this time.
		}
	}
}

// input lists the world in a random order, as an informer does.
func (w *world) input() snapshot.Input {
	in := snapshot.Input{Classes: fixture.DeviceClasses()}
	for _, n := range w.nodes {
		in.Nodes = append(in.Nodes, n)
	}
	for _, sl := range w.slices {
		in.Slices = append(in.Slices, sl...)
	}
	for _, p := range w.pods {
		in.Pods = append(in.Pods, p)
	}
	for _, c := range w.claims {
		in.Claims = append(in.Claims, c)
	}
	w.r.Shuffle(len(in.Nodes), func(i, j int) { in.Nodes[i], in.Nodes[j] = in.Nodes[j], in.Nodes[i] })
	w.r.Shuffle(len(in.Slices), func(i, j int) { in.Slices[i], in.Slices[j] = in.Slices[j], in.Slices[i] })
	w.r.Shuffle(len(in.Pods), func(i, j int) { in.Pods[i], in.Pods[j] = in.Pods[j], in.Pods[i] })
	w.r.Shuffle(len(in.Claims), func(i, j int) { in.Claims[i], in.Claims[j] = in.Claims[j], in.Claims[i] })
	return in
}

// allClaims are the claims of the input plus names that may have been deleted, for the
// lookups the fingerprint compares.
func allClaims(in snapshot.Input) []*resourceapi.ResourceClaim {
	out := append([]*resourceapi.ResourceClaim(nil), in.Claims...)
	for i := 0; i < 20; i++ {
		out = append(out, fixture.GPUClaim("ns", fmt.Sprintf("c%d", i), 1))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// TestIncrementalMatchesFull: over random sequences of cluster changes, the snapshot the
// Cache derives from what changed holds exactly what New builds from scratch from the same
// lists, every cycle; a snapshot stays as it was after later cycles and after Assume on
// the next cycle's snapshot; Assume on a cycle's snapshot leaves the next cycle's alone.
func TestIncrementalMatchesFull(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		w := newWorld(seed)
		cache := snapshot.NewCache()
		cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features)}
		var prev *snapshot.Snapshot
		var prevPrint string
		var prevClaims []*resourceapi.ResourceClaim
		for cycle := 0; cycle < 30; cycle++ {
			in := w.input()
			claims := allClaims(in)
			got := cache.Snapshot(in, cfg)
			want := snapshot.New(in, snapshot.Config{Features: features})
			if g, wa := snapshot.Fingerprint(got, claims), snapshot.Fingerprint(want, claims); g != wa {
				t.Fatalf("seed %d cycle %d: incremental snapshot differs from the one built from scratch:\n%s", seed, cycle, diff(g, wa))
			}
			// The cycle places a pod with a device on some node; what it assumes is the
			// cycle's own.
			if len(got.Nodes) > 0 {
				ni := got.Nodes[w.r.Intn(len(got.Nodes))]
				p := fixture.Pod("ns", fmt.Sprintf("assumed-%d", cycle))
				var allocs []*resourceapi.AllocationResult
				if len(ni.Slices) > 0 {
					sl := ni.Slices[0]
					if len(sl.Spec.Devices) > 0 {
						allocs = append(allocs, &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
							Request: "gpu", Driver: sl.Spec.Driver, Pool: sl.Spec.Pool.Name, Device: sl.Spec.Devices[0].Name}}}})
					}
				}
				got.Assume(ni.Name(), p, allocs)
				want.Assume(ni.Name(), p, allocs)
				if g, wa := snapshot.Fingerprint(got, claims), snapshot.Fingerprint(want, claims); g != wa {
					t.Fatalf("seed %d cycle %d: after Assume, the incremental snapshot differs:\n%s", seed, cycle, diff(g, wa))
				}
			}
			// The previous cycle's snapshot (with what it assumed) is as it was, after this
			// cycle's update and Assume.
			if prev != nil {
				if p := snapshot.Fingerprint(prev, prevClaims); p != prevPrint {
					t.Fatalf("seed %d cycle %d: the previous cycle's snapshot changed:\n%s", seed, cycle, diff(p, prevPrint))
				}
			}
			prev, prevPrint, prevClaims = got, snapshot.Fingerprint(got, claims), claims
			w.step()
		}
	}
}

// TestIncrementalSameDecisions: the solver places random gangs on the incremental snapshot
// exactly as on the one built from scratch — the same pods on the same nodes with the same
// devices, the same search (tries, steps) and the same messages when they do not fit —
// across random cluster changes, with the kube-scheduler's filters reading the pods.
func TestIncrementalSameDecisions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	inf := informers.NewSharedInformerFactory(fake.NewClientset(), 0)
	defer func() { cancel(); inf.Shutdown() }()
	f, err := filters.New(ctx, filters.Config{Informers: inf, Volumes: true})
	if err != nil {
		t.Fatal(err)
	}
	inf.Start(ctx.Done())
	inf.WaitForCacheSync(ctx.Done())
	s := solver.New(solver.Config{Filters: f})
	var placed, unschedulable int
	for seed := int64(1); seed <= 15; seed++ {
		w := newWorld(100 + seed)
		cache := snapshot.NewCache()
		cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features), Cache: cache}
		for cycle := 0; cycle < 15; cycle++ {
			in := w.input()
			snaps := []*snapshot.Snapshot{cache.Snapshot(in, cfg), snapshot.New(in, snapshot.Config{Features: features})}
			var out [2][]string
			for g := 0; g < 3; g++ {
				gang := randomGang(w.r, fmt.Sprintf("g%d-%d", cycle, g))
				var fit bool
				for i, snap := range snaps {
					res, err := s.Solve(ctx, snap, gang)
					out[i] = append(out[i], describe(res, err))
					fit = err == nil
					if err == nil {
						for _, pl := range res.Placements {
							var allocs []*resourceapi.AllocationResult
							for _, a := range pl.Allocate {
								allocs = append(allocs, a.Allocation)
							}
							snap.Assume(pl.Node, pl.Pod, allocs)
						}
					}
				}
				if fit {
					placed++
				} else {
					unschedulable++
				}
			}
			if !reflect.DeepEqual(out[0], out[1]) {
				t.Fatalf("seed %d cycle %d: incremental\n%v\nfrom scratch\n%v", seed, cycle, out[0], out[1])
			}
			w.step()
		}
	}
	if placed == 0 || unschedulable == 0 {
		t.Fatalf("the random gangs should both fit and not fit: %d placed, %d not", placed, unschedulable)
	}
}

func randomGang(r *rand.Rand, name string) *solver.Gang {
	g := &solver.Gang{Name: "ns/" + name}
	// Up to 12 pods of up to 2 GPUs: some gangs fit the ~25 GPUs of the world, some not.
	for i := 0; i < 1+r.Intn(12); i++ {
		var c *resourceapi.ResourceClaim
		if r.Intn(2) == 0 {
			c = fixture.GPUClaim("ns", fmt.Sprintf("%s-c%d", name, i), int64(1+r.Intn(2)))
		} else {
			c = fixture.MIGClaim("ns", fmt.Sprintf("%s-c%d", name, i), "1g.10gb")
		}
		p := fixture.Pod("ns", fmt.Sprintf("%s-p%d", name, i), c.Name)
		p.ResourceVersion = "1"
		p.Spec.Containers[0].Resources.Requests[v1.ResourceCPU] = *resource.NewMilliQuantity(int64(500*(1+r.Intn(4))), resource.DecimalSI)
		if r.Intn(4) == 0 {
			p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 80, HostPort: 8000, Protocol: v1.ProtocolTCP}}
		}
		g.Pods = append(g.Pods, solver.Pod{Pod: p, Claims: []*resourceapi.ResourceClaim{c}})
	}
	return g
}

func describe(res *solver.Result, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	out := fmt.Sprintf("units=%v tries=%d steps=%d domain=%q", res.GPUUnits, res.Tries, res.Steps, res.Domain)
	for _, pl := range res.Placements {
		out += fmt.Sprintf(" %s@%s", pl.Pod.Name, pl.Node)
		for _, a := range pl.Allocate {
			out += fmt.Sprintf("%+v", a.Allocation.Devices.Results)
		}
	}
	return out
}

// diff lists the lines of got and want that differ (got first), with the node each is of.
func diff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var out []string
	node := ""
	for i := 0; i < max(len(g), len(w)); i++ {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if strings.HasPrefix(b, "node ") {
			node = b
		}
		if a != b {
			out = append(out, "in "+node, "  got:  "+a, "  want: "+b)
		}
		if len(out) > 30 {
			break
		}
	}
	return strings.Join(out, "\n")
}

// TestIncrementalKeepsUsage: what a Cache snapshot keeps of unchanged pods and claims for the
// policy's queue charges (RequestedCPUMemory, ClaimUnits) is what a snapshot built from
// scratch computes, across random changes — nodes republishing their slices with other
// devices (a MIG device a claim holds gone, its GPU whole again), pools moving between
// nodes, claims and pods replaced — and a snapshot of an earlier cycle keeps answering
// with its own devices after later updates.
func TestIncrementalKeepsUsage(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		w := newWorld(seed)
		cache := snapshot.NewCache()
		cfg := snapshot.Config{Features: features, CELCache: snapshot.NewCELCache(features)}
		var prev *snapshot.Snapshot
		var prevUnits map[*resourceapi.ResourceClaim]float64
		changed := 0
		for cycle := 0; cycle < 30; cycle++ {
			in := w.input()
			got := cache.Snapshot(in, cfg)
			want := snapshot.New(in, snapshot.Config{Features: features})
			units := map[*resourceapi.ResourceClaim]float64{}
			for _, c := range in.Claims {
				wantUnits := want.AllocationUnits(c.Status.Allocation)
				// Twice: the first may compute and keep it, the second reads what was kept.
				for range 2 {
					if u := got.ClaimUnits(c); u != wantUnits {
						t.Fatalf("seed %d cycle %d: ClaimUnits(%s) = %v, built from scratch %v", seed, cycle, c.Name, u, wantUnits)
					}
				}
				if old, ok := prevUnits[c]; ok && old != wantUnits {
					changed++
				}
				units[c] = wantUnits
			}
			for _, p := range in.Pods {
				wc, wm := want.RequestedCPUMemory(p)
				req := snapshot.PodRequests(p)
				if wc != req.Cpu().AsApproximateFloat64() || wm != req.Memory().AsApproximateFloat64() {
					t.Fatalf("seed %d cycle %d: RequestedCPUMemory(%s) of a new snapshot = %v, %v; requests %v", seed, cycle, p.Name, wc, wm, req)
				}
				if c, m := got.RequestedCPUMemory(p); c != wc || m != wm {
					t.Fatalf("seed %d cycle %d: RequestedCPUMemory(%s) = %v, %v, built from scratch %v, %v", seed, cycle, p.Name, c, m, wc, wm)
				}
			}
			if prev != nil {
				for c, u := range prevUnits {
					if g := prev.ClaimUnits(c); g != u {
						t.Fatalf("seed %d cycle %d: the previous cycle's snapshot says ClaimUnits(%s) = %v after an update, it said %v", seed, cycle, c.Name, g, u)
					}
				}
			}
			prev, prevUnits = got, units
			w.step()
		}
		if seed == 1 && changed == 0 {
			t.Fatalf("seed %d: no claim's units changed while the claim stayed the same object; the test does not reach the invalidation", seed)
		}
	}
}
