package draplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools/state"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
)

// share is a request for a share of the env's shared GPU (GPU 2).
func share(memory, compute string) []request {
	return []request{{name: "s", class: "shared", memory: memory, compute: compute}}
}

func (e *env) mustPrepare(p *Plugin, claims ...*resourceapi.ResourceClaim) {
	e.t.Helper()
	res, err := p.PrepareResourceClaims(e.ctx, claims)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range claims {
		if res[c.UID].Err != nil {
			e.t.Fatalf("prepare %s: %v", c.Name, res[c.UID].Err)
		}
	}
}

func (e *env) mustUnprepare(p *Plugin, claims ...*resourceapi.ResourceClaim) {
	e.t.Helper()
	var objs []kubeletplugin.NamespacedObject
	for _, c := range claims {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: c.UID})
	}
	res, err := p.UnprepareResourceClaims(e.ctx, objs)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range claims {
		if res[c.UID] != nil {
			e.t.Fatalf("unprepare %s: %v", c.Name, res[c.UID])
		}
	}
}

// container is what the runtime gives a container that references the
// claim's devices: the OCI spec built from the CDI specs by a fresh CDI
// cache, as a runtime's.
func (e *env) container(ids ...string) *oci.Spec {
	e.t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatalf("inject %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return spec
}

// claimIDs are the CDI IDs of every device of a prepared claim.
func (e *env) claimIDs(p *Plugin, c *resourceapi.ResourceClaim) []string {
	e.t.Helper()
	res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}) // idempotent
	if err != nil || res[c.UID].Err != nil {
		e.t.Fatal(err, res[c.UID].Err)
	}
	var ids []string
	for _, d := range res[c.UID].Devices {
		for _, id := range d.CDIDeviceIDs {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// tenant is the container as a CUDA process in it sees it, with the
// environment changed by the tenant.
func tenant(spec *oci.Spec, uid int, change func(env []string) []string) faketools.Container {
	c := faketools.Container{Env: change(slices.Clone(spec.Process.Env)), Mounts: map[string]string{}, UID: uid}
	for _, m := range spec.Mounts {
		c.Mounts[m.Destination] = m.Source
	}
	return c
}

func withoutMPSVariables(env []string) []string {
	return slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "CUDA_MPS_") })
}

// daemon is the fake state of a claim's daemon; it fails the test when
// none ever ran there.
func (e *env) daemon(uid types.UID) *faketoolsDaemon {
	e.t.Helper()
	st, err := faketools.Daemon(e.pipeDir(uid))
	if err != nil || st == nil {
		e.t.Fatalf("no daemon for claim %s: %v", uid, err)
	}
	return &faketoolsDaemon{st, st.Reachable(e.pipeDir(uid))}
}

type faketoolsDaemon struct {
	*state.Daemon
	alive bool
}

// checkpointV2 wraps data as a v2 checkpoint file.
func checkpointV2(t *testing.T, bootID, data string) []byte {
	t.Helper()
	sum := crc32.Checksum([]byte(data), crc32.MakeTable(crc32.Castagnoli))
	return []byte(fmt.Sprintf(`{"version":%q,"bootID":%q,"checksum":"crc32c:%08x","data":%s}`, checkpoint.VersionV2, bootID, sum, data))
}

// TestRestartAndRollingUpgrade: 8 MPS claims are prepared; tessera-node is
// restarted (as a crash or an OOM kill does: the old process is just gone),
// then upgraded with an old and a new plugin side by side on the same
// directories. Every daemon keeps running through it (one start each, the
// same process), is adopted (limits read back) by each new plugin, and
// unprepare afterwards stops each one exactly once.
func TestRestartAndRollingUpgrade(t *testing.T) {
	e := newEnv(t)
	p1 := e.start()
	var claims []*resourceapi.ResourceClaim
	for i := 0; i < 8; i++ {
		claims = append(claims, e.claim(fmt.Sprintf("c%d", i), share(fmt.Sprintf("%dGi", i+1), "10")))
	}
	e.mustPrepare(p1, claims...)
	pids := map[types.UID]int{}
	for _, c := range claims {
		d := e.daemon(c.UID)
		if !d.alive || d.Starts != 1 {
			t.Fatalf("claim %s: daemon %+v", c.Name, d)
		}
		pids[c.UID] = d.PID
	}
	if got := len(e.daemonPods()); got != 8 {
		t.Fatalf("%d daemon pods, want 8", got)
	}
	checkSurvived := func(when string, p *Plugin) {
		t.Helper()
		for _, c := range claims {
			d := e.daemon(c.UID)
			if !d.alive || d.Starts != 1 || d.PID != pids[c.UID] {
				t.Errorf("%s: claim %s's daemon did not survive: %+v", when, c.Name, d)
			}
		}
		if got := e.tools.CallsMatching("mps-control -d"); len(got) != 0 {
			t.Errorf("%s: daemons started again: %q", when, got)
		}
		if got, err := testutil.GetCounterMetricValue(p.metrics.recoveredActions.WithLabelValues("mps_adopted")); err != nil || got != 8 {
			t.Errorf("%s: mps_adopted = %v, %v; want 8", when, got, err)
		}
		if got := len(p.PreparedClaims()); got != 8 {
			t.Errorf("%s: %d prepared claims", when, got)
		}
	}

	// Restart: the process goes (its sockets close), a new one starts.
	p1.Stop()
	e.tools.Reset()
	p2 := e.start()
	checkSurvived("after a restart", p2)

	// Rolling upgrade: the new pod starts while the old one still serves,
	// then the old one goes.
	p2.Stop()
	old := e.start(func(o *Options) { o.RollingUpdateUID = "pod-old" })
	e.tools.Reset()
	updated := e.start(func(o *Options) { o.RollingUpdateUID = "pod-new" })
	checkSurvived("after the new plugin of a rolling update started", updated)
	old.Stop()

	e.tools.Reset()
	e.mustUnprepare(updated, claims...)
	quits := e.tools.CallsMatching("stdin=quit")
	if len(quits) != 8 {
		t.Errorf("%d quits at unprepare, want one per daemon: %q", len(quits), quits)
	}
	for _, c := range claims {
		if n := len(slices.DeleteFunc(slices.Clone(quits), func(q string) bool { return !strings.Contains(q, e.pipeDir(c.UID)) })); n != 1 {
			t.Errorf("claim %s's daemon was told to quit %d times", c.Name, n)
		}
		if faketools.Alive(e.pipeDir(c.UID)) {
			t.Errorf("claim %s's daemon alive after unprepare", c.Name)
		}
	}
	e.waitNoDaemonPods()
}

// TestDaemonKilledUnderClaim kills a prepared claim's daemon (SIGKILL, the
// OOM killer: its pipe stays behind). The next prepare on the GPU gets a
// fresh daemon at once, unprepare of the orphaned claim succeeds, and a
// restart of the plugin with a dead daemon on the node does not fail. With
// daemons started as tessera-node's children (the process launcher, which
// nothing restarts) the dead daemon stays dead until then; in a pod, its
// container restarts it with the same limits.
func TestDaemonKilledUnderClaim(t *testing.T) {
	t.Run("process", func(t *testing.T) {
		e := newEnv(t)
		process := func(o *Options) { o.MPSLauncher = sharing.ProcessLauncher{Exec: executor.OS{}} }
		p := e.start(process)
		a := e.claim("a", share("4Gi", "20"))
		e.mustPrepare(p, a)
		if err := faketools.KillDaemon(e.pipeDir(a.UID)); err != nil {
			t.Fatal(err)
		}
		b := e.claim("b", share("4Gi", "20"))
		e.mustPrepare(p, b)
		if d := e.daemon(b.UID); !d.alive {
			t.Fatal("the next claim on the GPU got no running daemon")
		}
		if _, err := os.Stat(filepath.Join(e.pipeDir(a.UID), "control")); err != nil {
			t.Fatalf("setup: the killed daemon's stale pipe is gone: %v", err)
		}
		e.mustUnprepare(p, a)
		if _, err := os.Stat(filepath.Dir(e.pipeDir(a.UID))); !os.IsNotExist(err) {
			t.Errorf("the orphaned claim's directory is left: %v", err)
		}
		// A dead daemon under a prepared claim at start: no failure; the
		// daemon is launched again with the claim's limits.
		if err := faketools.KillDaemon(e.pipeDir(b.UID)); err != nil {
			t.Fatal(err)
		}
		p.Stop()
		p = e.start(process)
		d := e.daemon(b.UID)
		if !d.alive || d.Starts != 2 || d.PinnedMemLimit[0] != "4096M" || d.ActiveThreadPercentage != 20 {
			t.Errorf("claim b's daemon after the restart: %+v", d)
		}
		if ev := e.claimEvents(b, "MPSDaemonRestarted"); len(ev) == 0 {
			t.Error("no MPSDaemonRestarted event on the claim")
		}
		e.mustUnprepare(p, b)
	})
	t.Run("pod", func(t *testing.T) {
		e := newEnv(t)
		p := e.start()
		a := e.claim("a", share("4Gi", "20"))
		e.mustPrepare(p, a)
		if err := faketools.KillDaemon(e.pipeDir(a.UID)); err != nil {
			t.Fatal(err)
		}
		b := e.claim("b", share("4Gi", "20"))
		e.mustPrepare(p, b)
		// The pod's container notices and the kubelet restarts it: a daemon
		// with the same limits on the same pipe.
		err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			d, err := faketools.Daemon(e.pipeDir(a.UID))
			return err == nil && d.Starts == 2 && d.Reachable(e.pipeDir(a.UID)), nil
		})
		if err != nil {
			t.Fatalf("the daemon pod did not start a new daemon: %+v", e.daemon(a.UID))
		}
		if d := e.daemon(a.UID); d.PinnedMemLimit[0] != "4096M" || d.ActiveThreadPercentage != 20 {
			t.Errorf("restarted daemon's limits %+v", d)
		}
		if n := e.runner.Restarts(sharing.PodName(string(a.UID))); n < 1 {
			t.Errorf("container restarts = %d", n)
		}
		e.mustUnprepare(p, a, b)
		e.waitNoDaemonPods()
	})
}

// TestTenantsNeverShareADaemon: claims of two namespaces on one shared GPU
// get a daemon each (their own pipe directory, pod and server), so two
// users' processes run at once, each under its own claim's limits; with one
// daemon per GPU MPS would serve one user at a time.
func TestTenantsNeverShareADaemon(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	a := e.claim("a", share("8Gi", "30"))
	b := e.claimIn(e.namespace(), "b", share("16Gi", "50"))
	e.mustPrepare(p, a, b)
	if e.pipeDir(a.UID) == e.pipeDir(b.UID) || len(e.daemonPods()) != 2 {
		t.Fatalf("two tenants, pipe dirs %s and %s, pods %v", e.pipeDir(a.UID), e.pipeDir(b.UID), e.daemonPods())
	}
	ca, err := faketools.Connect(tenant(e.container(e.claimIDs(p, a)...), 1000, withoutMPSVariables))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := faketools.Connect(tenant(e.container(e.claimIDs(p, b)...), 2000, withoutMPSVariables))
	if err != nil {
		t.Fatalf("the second tenant's process (another user) could not start while the first runs: %v", err)
	}
	if ca.PipeDir == cb.PipeDir || ca.PinnedMemLimitMiB[0] != 8192 || cb.PinnedMemLimitMiB[0] != 16384 || ca.ActiveThreadPercentage != 30 || cb.ActiveThreadPercentage != 50 {
		t.Errorf("tenant a %+v, tenant b %+v", ca, cb)
	}
	if !reflect.DeepEqual(ca.Devices, cb.Devices) || len(ca.Devices) != 1 || ca.Devices[0] != gpuUUID(e, 2) {
		t.Errorf("both on GPU 2: %v, %v", ca.Devices, cb.Devices)
	}
	e.mustUnprepare(p, a, b)
}

// TestTenantCannotLiftLimits: a process that drops every MPS variable the
// container got and sets its own, higher limits still runs under the
// claim's: the limits are the daemon's, and the pipe directory is where
// MPS looks by default. (Asserted on the server the fake daemon started.)
func TestTenantCannotLiftLimits(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	c := e.claim("c", share("10Gi", "25"))
	e.mustPrepare(p, c)
	spec := e.container(e.claimIDs(p, c)...)
	for _, kv := range spec.Process.Env {
		if strings.HasPrefix(kv, "CUDA_MPS_PINNED") || strings.HasPrefix(kv, "CUDA_MPS_ACTIVE") {
			t.Errorf("the container's environment carries a limit: %s", kv)
		}
	}
	cl, err := faketools.Connect(tenant(spec, 0, func(env []string) []string {
		return append(withoutMPSVariables(env), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100")
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !cl.MPS || cl.PinnedMemLimitMiB[0] != 10240 || cl.ActiveThreadPercentage != 25 {
		t.Fatalf("the tenant's process runs with %+v, want MPS with 10240 MiB and 25%%", cl)
	}
	d := e.daemon(c.UID)
	if len(d.Servers) != 1 || d.Servers[0].PinnedMemLimit[0] != "10240M" || d.Servers[0].ActiveThreadPercentage != 25 {
		t.Errorf("daemon's server %+v", d.Servers)
	}
	e.mustUnprepare(p, c)
}

// TestTwoGPUsOneClaim: a claim with shares of two GPUs has one daemon and
// one pipe directory, with both GPUs' limits, one ordinal=limit entry per
// device in the order CUDA enumerates the container's devices.
func TestTwoGPUsOneClaim(t *testing.T) {
	e := newEnvWith(t, 4, "default:\n  gpus:\n  - indices: [0, 1]\n    mode: dynamicMIG\n  - indices: [2, 3]\n    mode: shared\n")
	p := e.start()
	c := e.claim("two", []request{
		{name: "b", class: "shared", memory: "20Gi", compute: "40", selector: `device.attributes["gpu.tessera.dev"].index == 3`},
		{name: "a", class: "shared", memory: "10Gi", compute: "30", selector: `device.attributes["gpu.tessera.dev"].index == 2`},
	})
	e.mustPrepare(p, c)
	ids := e.claimIDs(p, c)
	d := e.daemon(c.UID)
	view := e.containerView(ids...)
	if !reflect.DeepEqual(d.Visible, view.UUIDs()) || len(d.Visible) != 2 || d.Visible[0] != gpuUUID(e, 2) {
		t.Fatalf("daemon's devices %v, the container enumerates %v", d.Visible, view.UUIDs())
	}
	if !reflect.DeepEqual(d.PinnedMemLimit, map[int]string{0: "10240M", 1: "20480M"}) || d.ActiveThreadPercentage != 30 {
		t.Errorf("daemon limits %v, %v%%", d.PinnedMemLimit, d.ActiveThreadPercentage)
	}
	if got := e.tools.CallsMatching("mps-control -d"); len(got) != 1 || !strings.Contains(got[0], "mem=0=10240M,1=20480M") {
		t.Errorf("daemon starts %q", got)
	}
	spec := e.container(ids...)
	pipes := 0
	for _, m := range spec.Mounts {
		if m.Destination == sharing.ContainerPipeDir {
			pipes++
			if m.Source != e.pipeDir(c.UID) {
				t.Errorf("pipe mount from %s", m.Source)
			}
		}
	}
	if pipes != 1 || len(e.daemonPods()) != 1 {
		t.Errorf("%d pipe mounts, %d daemon pods; want one of each", pipes, len(e.daemonPods()))
	}
	cl, err := faketools.Connect(tenant(spec, 0, withoutMPSVariables))
	if err != nil || cl.PinnedMemLimitMiB[0] != 10240 || cl.PinnedMemLimitMiB[1] != 20480 {
		t.Errorf("client %+v, %v", cl, err)
	}
	e.mustUnprepare(p, c)
}

// TestGPUAndMIGOneClaim: a MIG device (MPS) and a share of another GPU in
// one claim: one daemon serving both, the MIG device by its UUID, each
// with its limit at its CUDA ordinal.
func TestGPUAndMIGOneClaim(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	c := e.claim("mixed", []request{
		{name: "share", class: "shared", memory: "10Gi", compute: "20"},
		{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "3g.40gb" && device.attributes["gpu.tessera.dev"].index == 0`},
	}, claimConfig{requests: []string{"mig"}, json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"20Gi"}}}`})
	e.mustPrepare(p, c)
	ids := e.claimIDs(p, c)
	d := e.daemon(c.UID)
	view := e.containerView(ids...)
	gi := onlyGI(t, e, 0)
	if !reflect.DeepEqual(d.Visible, []string{gi.UUID, gpuUUID(e, 2)}) || !reflect.DeepEqual(d.Visible, view.UUIDs()) {
		t.Fatalf("daemon's devices %v, the container enumerates %v", d.Visible, view.UUIDs())
	}
	if !reflect.DeepEqual(d.PinnedMemLimit, map[int]string{0: "20480M", 1: "10240M"}) {
		t.Errorf("daemon limits %v", d.PinnedMemLimit)
	}
	cp, _ := checkpoint.Read(filepath.Join(e.pluginDir, "checkpoint.json"))
	rec := cp.Data.Claims[c.UID]
	if rec.MPS == nil || !reflect.DeepEqual(rec.MPS.Devices, d.Visible) || rec.Devices[0].Sharing.DeviceIndex != 1 || rec.Devices[1].Sharing.DeviceIndex != 0 {
		t.Errorf("record %+v", rec.MPS)
	}
	e.mustUnprepare(p, c)
	if got := e.migInstances(); len(got) != 0 {
		t.Errorf("MIG instances left: %v", got)
	}
}

// TestTimeSliceIntervalConflict: the interval is the GPU's. A second claim
// asking another interval on the same GPU fails naming both claims and
// leaves the first one's interval; a third asking the same joins without a
// call; the interval goes back to Default with the last of them.
func TestTimeSliceIntervalConflict(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	ts := func(interval string) claimConfig {
		return claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"` + interval + `"}}}`}
	}
	first := e.claim("first", share("8Gi", ""), ts("Short"))
	e.mustPrepare(p, first)
	g2 := gpuUUID(e, 2)
	if _, slice := e.tools.GPU(g2); slice != 1 {
		t.Fatalf("time slice %d after the first claim", slice)
	}
	second := e.claim("second", share("8Gi", ""), ts("Long"))
	res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{second})
	if err != nil {
		t.Fatal(err)
	}
	msg := fmt.Sprint(res[second.UID].Err)
	for _, want := range []string{"Long", "Short", e.ns + "/second", e.ns + "/first", "conflicts"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
	if _, slice := e.tools.GPU(g2); slice != 1 || len(e.tools.CallsMatching("nvidia-smi")) != 1 {
		t.Errorf("the first claim's interval changed: %d, calls %q", slice, e.tools.Calls())
	}
	third := e.claim("third", share("8Gi", ""), ts("Short"))
	e.mustPrepare(p, third)
	if n := len(e.tools.CallsMatching("nvidia-smi")); n != 1 {
		t.Errorf("%d nvidia-smi calls, want the first one only", n)
	}
	e.mustUnprepare(p, first)
	if _, slice := e.tools.GPU(g2); slice != 1 {
		t.Errorf("interval reset while the third claim time-slices: %d", slice)
	}
	e.mustUnprepare(p, third)
	if _, slice := e.tools.GPU(g2); slice != 0 {
		t.Errorf("interval %d after the last claim, want Default", slice)
	}
}

// statusOf returns the plugin's status data of the claim's devices.
func (e *env) statusOf(c *resourceapi.ResourceClaim) []configapi.SharingStatus {
	e.t.Helper()
	got, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Get(e.ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []configapi.SharingStatus
	for _, d := range got.Status.Devices {
		if d.Driver != DriverName || d.Data == nil {
			continue
		}
		var st configapi.SharingStatus
		if err := json.Unmarshal(d.Data.Raw, &st); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}

func (e *env) claimEvents(c *resourceapi.ResourceClaim, reason string) []string {
	e.t.Helper()
	var out []string
	_ = wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := e.client.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + c.Name + ",reason=" + reason})
		if err != nil {
			return false, err
		}
		out = nil
		for _, ev := range list.Items {
			out = append(out, ev.Message)
		}
		return len(out) > 0, nil
	})
	return out
}

// TestClaimStatusShowsLimits: what was applied is in the claim's
// status.devices[].data (kubectl describe shows it) and goes at unprepare;
// a time-sliced share says, there and in an Event, that its memory is not
// enforced.
func TestClaimStatusShowsLimits(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	mps := e.claim("mps", share("10Gi", "25"))
	sliced := e.claim("sliced", share("6Gi", ""), claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Medium"}}}`})
	e.mustPrepare(p, mps, sliced)

	st := e.statusOf(mps)
	if len(st) != 1 || st[0].Kind != configapi.SharingStatusKind || st[0].Strategy != configapi.MPSStrategy || st[0].MPS == nil {
		t.Fatalf("MPS status %+v", st)
	}
	m := st[0].MPS
	if m.Daemon != "pod "+e.ns+"/"+sharing.PodName(string(mps.UID)) || m.PinnedDeviceMemoryLimit.String() != "10Gi" || *m.ActiveThreadPercentage != 25 || m.DeviceOrdinal != 0 {
		t.Errorf("MPS status %+v", m)
	}
	st = e.statusOf(sliced)
	if len(st) != 1 || st[0].TimeSlicing == nil || st[0].TimeSlicing.Interval != configapi.MediumTimeSlice || len(st[0].NotEnforced) == 0 || !strings.Contains(st[0].NotEnforced[0], "memory") {
		t.Errorf("time-slicing status %+v", st)
	}
	if ev := e.claimEvents(sliced, "MemoryNotEnforced"); len(ev) == 0 || !strings.Contains(ev[0], "not enforced") {
		t.Errorf("events %q", ev)
	}
	e.mustUnprepare(p, mps, sliced)
	if st := e.statusOf(mps); len(st) != 0 {
		t.Errorf("status after unprepare %+v", st)
	}
}

// TestStaticSMPartition: a share that asks for a hard compute part gets a
// static SM partition of its compute share where MPS has static
// partitioning (version 13010+): the daemon runs with -S, the container
// runs in the partition (and cannot leave it: without
// CUDA_MPS_SM_PARTITION a client fails). Where MPS is older, Required fails
// the prepare with the reason and leaves nothing; Preferred falls back to
// the thread percentage and says so.
func TestStaticSMPartition(t *testing.T) {
	cfg := func(policy string) claimConfig {
		return claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"smPartition":"` + policy + `"}}}`}
	}
	t.Run("old MPS", func(t *testing.T) {
		e := newEnv(t)
		p := e.start()
		req := e.claim("req", share("10Gi", "25"), cfg("Required"))
		res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{req})
		if err != nil || res[req.UID].Err == nil || !strings.Contains(res[req.UID].Err.Error(), "13010") || !strings.Contains(res[req.UID].Err.Error(), "smPartition is Required") {
			t.Fatalf("Required on 12080: %v, %v", err, res[req.UID].Err)
		}
		if len(e.specFiles()) != 0 || len(e.daemonPods()) != 0 || len(e.tools.CallsMatching("mps-control -d")) != 0 {
			t.Errorf("the failed prepare left something: specs %v, pods %v", e.specFiles(), e.daemonPods())
		}
		pref := e.claim("pref", share("10Gi", "25"), cfg("Preferred"))
		e.mustPrepare(p, pref)
		if d := e.daemon(pref.UID); d.Static || d.ActiveThreadPercentage != 25 {
			t.Errorf("fallback daemon %+v", d)
		}
		if st := e.statusOf(pref); len(st) != 1 || st[0].MPS.SMPartition != nil || !strings.Contains(strings.Join(st[0].NotEnforced, " "), "static SM partition not made") {
			t.Errorf("fallback status %+v", st)
		}
		if ev := e.claimEvents(pref, "SMPartitionUnavailable"); len(ev) == 0 {
			t.Error("no SMPartitionUnavailable event")
		}
		e.mustUnprepare(p, pref)
	})
	t.Run("CUDA 13.1", func(t *testing.T) {
		e := newEnv(t)
		e.tools.SetMPSVersion(t, "13010")
		p := e.start()
		c := e.claim("hard", share("10Gi", "25"), cfg("Required"))
		e.mustPrepare(p, c)
		d := e.daemon(c.UID)
		if !d.Static || len(d.Partitions) != 1 || d.Partitions[0].Chunks != 4 || d.ActiveThreadPercentage != 0 {
			t.Fatalf("daemon %+v", d)
		}
		spec := e.container(e.claimIDs(p, c)...)
		if _, err := faketools.Connect(tenant(spec, 0, withoutMPSVariables)); err == nil {
			t.Error("a process without CUDA_MPS_SM_PARTITION got onto the GPU")
		}
		cl, err := faketools.Connect(tenant(spec, 0, func(env []string) []string { return env }))
		if err != nil || cl.Partition != d.Partitions[0].ID || cl.PinnedMemLimitMiB[0] != 10240 {
			t.Errorf("client %+v, %v", cl, err)
		}
		if st := e.statusOf(c); len(st) != 1 || st[0].MPS.SMPartition == nil || st[0].MPS.SMPartition.Chunks != 4 || st[0].MPS.MPSVersion != 13010 {
			t.Errorf("status %+v", st)
		}
		e.mustUnprepare(p, c)
	})
}

// TestWholeGPUWithMPS: a whole GPU shared by its claim's containers through
// MPS is put in exclusive-process mode, so that only the claim's MPS server
// holds a context on it, and back to DEFAULT at unprepare.
func TestWholeGPUWithMPS(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	c := e.claim("whole", []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}},
		claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"activeThreadPercentage":50}}}`})
	e.mustPrepare(p, c)
	g3 := gpuUUID(e, 3)
	if mode, _ := e.tools.GPU(g3); mode != "Exclusive_Process" {
		t.Errorf("compute mode %s", mode)
	}
	if d := e.daemon(c.UID); !d.alive || d.ActiveThreadPercentage != 50 || !reflect.DeepEqual(d.Visible, []string{g3}) {
		t.Errorf("daemon %+v", d)
	}
	if st := e.statusOf(c); len(st) != 1 || st[0].MPS.ComputeMode != "EXCLUSIVE_PROCESS" {
		t.Errorf("status %+v", st)
	}
	e.mustUnprepare(p, c)
	if mode, _ := e.tools.GPU(g3); mode != "Default" {
		t.Errorf("compute mode after unprepare %s", mode)
	}
}

// TestUpgradeFromPerDeviceDaemons: a node upgraded from a tessera-node that
// ran one daemon per GPU (checkpoint v2): the old daemon keeps serving its
// claim through the upgrade and stops with it.
func TestUpgradeFromPerDeviceDaemons(t *testing.T) {
	e := newEnv(t)
	g2 := gpuUUID(e, 2)
	legacy := filepath.Join(e.mpsDir, g2)
	// What the earlier tessera-node left: its daemon for GPU 2 and a v2
	// checkpoint with the claim that uses it.
	if _, err := (executor.OS{}).Run(e.ctx, executor.Command{Name: sharing.MPSControl, Args: []string{"-d"},
		Env: []string{"CUDA_VISIBLE_DEVICES=" + g2, "CUDA_MPS_PIPE_DIRECTORY=" + legacy + "/pipe", "CUDA_MPS_LOG_DIRECTORY=" + legacy + "/log"}}); err != nil {
		t.Fatal(err)
	}
	c := e.claim("old", share("4Gi", ""))
	shareID := c.Status.Allocation.Devices.Results[0].ShareID
	v2 := fmt.Sprintf(`{"claims":{%q:{"uid":%q,"namespace":%q,"name":"old","state":"PrepareCompleted","devices":[{"requests":["s"],"pool":%q,"device":"gpu-2-shared","shareID":%q,"kind":"shared","gpuUUID":%q,"gpuMinor":2,"sharing":{"strategy":"MPS","pinnedMemoryLimitBytes":4294967296,"mpsDevice":%q},"cdiDeviceIDs":[]}]}}}`,
		c.UID, c.UID, e.ns, e.nodeName, *shareID, g2, g2)
	raw := checkpointV2(t, e.bootID, v2)
	if err := os.MkdirAll(e.pluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.pluginDir, "checkpoint.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	p := e.start()
	if !faketools.Alive(legacy+"/pipe") || len(p.PreparedClaims()) != 1 {
		t.Fatalf("the earlier daemon or its claim did not survive the upgrade: alive %v, claims %v", faketools.Alive(legacy+"/pipe"), p.PreparedClaims())
	}
	e.mustUnprepare(p, c)
	if faketools.Alive(legacy + "/pipe") {
		t.Error("the per-device daemon survived its last claim")
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("its directory is left: %v", err)
	}
}
