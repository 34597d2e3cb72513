package draplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
)

type crash struct{ point string }

// mixedClaim asks for a MIG device, an MPS share and a time-sliced whole
// GPU, so that one prepare goes through every kind of side effect.
func (e *env) mixedClaim(name string) *resourceapi.ResourceClaim {
	return e.claim(name, []request{
		{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "2g.20gb" && device.attributes["gpu.tessera.dev"].index == 0`},
		{name: "share", class: "shared", memory: "4Gi", compute: "10"},
		{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`},
	}, claimConfig{requests: []string{"gpu"}, json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Medium"}}}`})
}

// claimStatus is what is left of a claim on the node.
type nodeState struct {
	migs     []string
	specs    []string
	daemons  []string
	recorded []string
}

func (e *env) state(_ *Plugin) nodeState {
	e.t.Helper()
	daemons := faketools.AliveDaemons(e.mpsDir)
	cp, err := checkpoint.Read(filepath.Join(e.pluginDir, "checkpoint.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var recorded []string
	if cp != nil {
		for uid, c := range cp.Data.Claims {
			recorded = append(recorded, fmt.Sprintf("%s:%s", uid, c.State))
		}
	}
	return nodeState{migs: e.migInstances(), specs: e.specFiles(), daemons: daemons, recorded: recorded}
}

// TestCrashSafety kills the plugin (a panic out of the prepare) right after
// each side effect, restarts it on the same directories and mock GPUs, and
// checks that the node is consistent: the claim is either prepared exactly
// once or nothing of it is left; the kubelet's retry then prepares it once
// and unprepare leaves nothing.
func TestCrashSafety(t *testing.T) {
	points := []string{"checkpoint-started", "mig-created", "mps-started", "timeslice-set", "cdi-written", "checkpoint-completed"}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			e := newEnv(t)
			c := e.mixedClaim("mixed")
			crashed := false
			p1 := e.start(func(o *Options) {
				o.crash = func(p string) {
					if p == point && !crashed {
						crashed = true
						panic(crash{p})
					}
				}
			})
			func() {
				defer func() {
					r := recover()
					if _, ok := r.(crash); !ok {
						t.Fatalf("prepare did not reach crash point %s (recovered %v)", point, r)
					}
				}()
				_, _ = p1.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c})
			}()
			p1.Stop() // the process is gone: its sockets close

			p2 := e.start()
			st := e.state(p2)
			if point == "checkpoint-completed" {
				if len(st.migs) != 1 || len(st.specs) != 1 || len(st.daemons) != 1 || !reflect.DeepEqual(st.recorded, []string{string(c.UID) + ":PrepareCompleted"}) {
					t.Fatalf("after restart the completed claim is not intact: %+v", st)
				}
			} else if len(st.migs)+len(st.specs)+len(st.daemons)+len(st.recorded) != 0 {
				t.Fatalf("after restart something of the half-done prepare is left: %+v", st)
			}

			// The kubelet retries over the sockets.
			k := e.kubelet()
			resp := k.prepare(t, e.ctx, c)[string(c.UID)]
			if resp.Error != "" || len(resp.Devices) != 3 {
				t.Fatalf("retry: %+v", resp)
			}
			st = e.state(p2)
			if len(st.migs) != 1 || len(st.specs) != 1 || len(st.daemons) != 1 {
				t.Fatalf("claim not prepared exactly once: %+v", st)
			}
			e.tools.Reset()
			if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
				t.Fatal(r.Error)
			}
			st = e.state(p2)
			if len(st.migs)+len(st.specs)+len(st.daemons)+len(st.recorded) != 0 {
				t.Fatalf("unprepare left: %+v", st)
			}
			// The claim's daemon quit once, the time slice was reset once.
			if got := e.tools.CallsMatching("stdin=quit"); len(got) != 1 || !strings.Contains(got[0], e.pipeDir(c.UID)) {
				t.Errorf("quit at unprepare: %q", got)
			}
			if got, want := e.tools.CallsMatching("nvidia-smi"), []string{"nvidia-smi compute-policy -i " + gpuUUID(e, 3) + " --set-timeslice 0"}; !reflect.DeepEqual(got, want) {
				t.Errorf("nvidia-smi at unprepare = %q, want %q", got, want)
			}
			e.waitNoDaemonPods()
		})
	}
}

func gpuUUID(e *env, minor int) string {
	g, _ := e.node.GPUByMinor(minor)
	return g.UUID
}

// TestCrashSafetyWithoutIntent covers claims that are not recorded before
// their side effects (a whole GPU, an MPS share): a crash after the MPS
// daemon started or the CDI spec was written leaves nothing after restart.
func TestCrashSafetyWithoutIntent(t *testing.T) {
	for _, point := range []string{"mps-started", "cdi-written", "checkpoint-completed"} {
		t.Run(point, func(t *testing.T) {
			e := newEnv(t)
			c := e.claim("plain", []request{
				{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`},
				{name: "share", class: "shared", memory: "2Gi"},
			})
			p1 := e.start(func(o *Options) {
				o.crash = func(p string) {
					if p == "checkpoint-started" {
						t.Errorf("claim without MIG or time-slicing recorded before its side effects")
					}
					if p == point {
						panic(crash{p})
					}
				}
			})
			func() {
				defer func() {
					if _, ok := recover().(crash); !ok {
						t.Fatalf("prepare did not reach %s", point)
					}
				}()
				_, _ = p1.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c})
			}()
			p1.Stop()
			p2 := e.start()
			st := e.state(p2)
			if point == "checkpoint-completed" {
				if len(st.specs) != 1 || len(st.daemons) != 1 || len(st.recorded) != 1 {
					t.Fatalf("completed claim not intact: %+v", st)
				}
			} else if len(st.specs)+len(st.daemons)+len(st.recorded) != 0 {
				t.Fatalf("left after restart: %+v", st)
			}
		})
	}
}

// TestCorruptCheckpoint: a checkpoint that fails its checksum is moved
// aside; the plugin rebuilds from the CDI specs and NVML, keeps the claim
// that is intact and destroys a MIG instance no claim owns.
func TestCorruptCheckpoint(t *testing.T) {
	e := newEnv(t)
	c := e.claim("keep", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "1g.10gb" && device.attributes["gpu.tessera.dev"].index == 0`}})
	p1 := e.start()
	if res, err := p1.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	p1.Stop()
	path := filepath.Join(e.pluginDir, "checkpoint.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x20 // one flipped bit: checksum no longer matches
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// A MIG instance on GPU 1 that no claim owns and tessera did not create
	// (an administrator's): kept.
	e.createStaticMIG(1, "3g.40gb", 4)

	p2 := e.start()
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("corrupt checkpoint not moved aside: %v", aside)
	}
	if got := p2.PreparedClaims(); !reflect.DeepEqual(got, []types.UID{c.UID}) {
		t.Fatalf("prepared claims after rebuild = %v, want %v", got, c.UID)
	}
	if got := e.migInstances(); len(got) != 2 || !strings.HasPrefix(got[0], "gpu0:") || got[1] != "gpu1:3g.40gb@4" {
		t.Errorf("MIG instances = %v, want the claim's on GPU 0 and the administrator's on GPU 1", got)
	}
	if _, err := checkpoint.Read(path); err != nil {
		t.Errorf("rebuilt checkpoint unreadable: %v", err)
	}
	res, err := p2.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
	if err != nil || res[c.UID] != nil {
		t.Fatal(err, res)
	}
	if got := e.migInstances(); !reflect.DeepEqual(got, []string{"gpu1:3g.40gb@4"}) {
		t.Errorf("MIG instances after unprepare = %v, want the administrator's", got)
	}
}

// TestForeignBootCheckpoint: after a reboot the checkpoint is discarded
// with its CDI specs, and nothing is destroyed: the previous boot's
// instances died with it, and an instance that now sits at the recorded
// placement (same GPU instance ID) is someone else's.
func TestForeignBootCheckpoint(t *testing.T) {
	e := newEnv(t)
	c := e.claim("old", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 1`}})
	p1 := e.start()
	if res, err := p1.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	p1.Stop()
	before := e.lib.GPUs()[1].Instances()
	if len(before) != 1 || len(e.specFiles()) != 1 {
		t.Fatalf("setup: %v %v", before, e.specFiles())
	}
	// The reboot: MIG instances are gone (MIG mode stays), then an
	// administrator creates an instance of the same profile at the same
	// placement, which gets the recorded GPU instance ID.
	for _, g := range e.lib.GPUs() {
		if ret := e.lib.ResetGPU(g.UUID); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	admin, err := e.lib.GPUs()[1].CreateInstance(before[0].Profile, before[0].Start)
	if err != nil || admin.GIID != before[0].GIID {
		t.Fatalf("the administrator's instance %+v (%v), want GPU instance %d", admin, err, before[0].GIID)
	}
	e.bootID = "boot-2"
	p2 := e.start()
	st := e.state(p2)
	if len(st.specs)+len(st.recorded) != 0 {
		t.Fatalf("foreign-boot state survived: %+v", st)
	}
	if got := e.lib.GPUs()[1].Instances(); len(got) != 1 || got[0].UUID != admin.UUID {
		t.Fatalf("instances after the restart %v, want the administrator's %v", got, admin)
	}
	cp, err := checkpoint.Read(filepath.Join(e.pluginDir, "checkpoint.json"))
	if err != nil || cp.BootID != "boot-2" {
		t.Fatalf("checkpoint = %+v, %v", cp, err)
	}
}

// TestStaticMIGKept: an administrator's MIG instance survives the
// plugin's start, can be prepared and is not destroyed at unprepare. The
// node agent publishes the GPU's placements as dynamic devices (which carry no
// placement attribute), so the claim is pinned to the instance's placement.
func TestStaticMIGKept(t *testing.T) {
	e := newEnv(t)
	e.createStaticMIG(1, "1g.10gb", 6)
	p := e.start()
	c := e.claim("static", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 1 && device.attributes["gpu.tessera.dev"].profile == "1g.10gb"`, device: "gpu-1-mig-1g-10gb-6"}})
	res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	if _, err := p.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
		t.Fatal(err)
	}
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("static instance destroyed: %v", got)
	}
}

// TestUnprepareCrashSafety kills the plugin (a panic out of the unprepare)
// after each undo step, for a claim with every kind of side effect and for
// a plain whole GPU, whose unprepare only removes its CDI spec. The claim
// must still be recorded after the restart (the checkpoint is written last),
// so that the kubelet's retry undoes it again; every step must then cope
// with what is already undone (a destroyed MIG instance, a daemon that is
// gone), and the restart must not launch the daemon again. Nothing is left.
func TestUnprepareCrashSafety(t *testing.T) {
	mixed := []string{"undo-cdi-removed", "undo-mps-stopped", "undo-timeslice-reset", "undo-mig-destroyed", "unprepare-undone"}
	for _, tc := range []struct {
		kind   string
		points []string
	}{{"mixed", mixed}, {"whole-gpu", []string{"undo-cdi-removed", "unprepare-undone"}}} {
		for _, point := range tc.points {
			t.Run(tc.kind+"/"+point, func(t *testing.T) {
				e := newEnv(t)
				var c *resourceapi.ResourceClaim
				if tc.kind == "mixed" {
					c = e.mixedClaim("mixed")
				} else {
					c = e.claim("plain", []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
				}
				armed := false
				p1 := e.start(func(o *Options) {
					o.crash = func(p string) {
						if armed && p == point {
							armed = false
							panic(crash{p})
						}
					}
				})
				if res, err := p1.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
					t.Fatal(err, res)
				}
				prepared := e.state(p1)
				if len(prepared.specs) != 1 {
					t.Fatalf("prepared: %+v", prepared)
				}
				e.tools.Reset()
				armed = true
				func() {
					defer func() {
						if _, ok := recover().(crash); !ok {
							t.Fatalf("unprepare did not reach %s", point)
						}
					}()
					_, _ = p1.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}})
				}()
				p1.Stop()

				p2 := e.start()
				if st := e.state(p2); !reflect.DeepEqual(st.recorded, []string{string(c.UID) + ":PrepareCompleted"}) {
					t.Fatalf("after the restart the claim is not recorded as prepared, so nothing would finish its unprepare: %+v", st)
				}
				if tc.kind == "mixed" && point != "undo-cdi-removed" {
					// The daemon was stopped before the crash; the restart must not launch it
					// again for a claim on its way out (it raced the retried unprepare and
					// outlived it).
					e.waitNoDaemonPods()
				}
				k := e.kubelet()
				if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
					t.Fatalf("retried unprepare: %s", r.Error)
				}
				if st := e.state(p2); len(st.migs)+len(st.specs)+len(st.daemons)+len(st.recorded) != 0 {
					t.Fatalf("retried unprepare left: %+v", st)
				}
				if tc.kind == "mixed" {
					if mode, slice := e.tools.GPU(gpuUUID(e, 3)); slice != 0 {
						t.Errorf("GPU 3 left with time slice %d (compute mode %s), want the default", slice, mode)
					}
					if got := e.tools.CallsMatching("stdin=quit"); len(got) == 0 {
						t.Errorf("the claim's MPS daemon was never told to quit")
					}
				} else if got := e.tools.Calls(); len(got) != 0 {
					t.Errorf("a plain whole GPU's unprepare ran tools: %q", got)
				}
				e.waitNoDaemonPods()
			})
		}
	}
}
