package draplugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// readSpec reads the claim's CDI spec from disk.
func (e *env) readSpec(uid string) *cdispec.Spec {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.cdiDir, "k8s.gpu.tessera.dev-claim_"+uid+".json"))
	if err != nil {
		e.t.Fatalf("CDI spec of claim %s: %v", uid, err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		e.t.Fatal(err)
	}
	return &spec
}

func nodePaths(edits cdispec.ContainerEdits) []string {
	var out []string
	for _, n := range edits.DeviceNodes {
		out = append(out, n.Path)
	}
	return out
}

// TestKubeletPrepareUnprepare acts as the kubelet over the real sockets for
// claims that the structured allocator allocated on the API server: a whole
// GPU, a dynamic MIG device and a fractional share.
func TestKubeletPrepareUnprepare(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	if k.info.Type != registerapi.DRAPlugin || k.info.Name != DriverName || !strings.HasPrefix(k.info.Endpoint, e.pluginDir) {
		t.Errorf("GetInfo = %+v", k.info)
	}
	if !slices.Contains(k.info.SupportedVersions, "v1.DRAPlugin") {
		t.Errorf("supported services %v lack v1.DRAPlugin", k.info.SupportedVersions)
	}

	whole := e.claim("whole", []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
	migc := e.claim("mig", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "1g.10gb" && device.attributes["gpu.tessera.dev"].index == 1`}})
	shared := e.claim("share", []request{{name: "share", class: "shared", memory: "10Gi", compute: "25"}})

	resp := k.prepare(t, e.ctx, whole, migc, shared)
	for _, c := range []string{string(whole.UID), string(migc.UID), string(shared.UID)} {
		if r := resp[c]; r == nil || r.Error != "" {
			t.Fatalf("prepare of %s: %+v", c, r)
		}
	}

	// Whole GPU: its device node and the control nodes.
	wr := resp[string(whole.UID)]
	if len(wr.Devices) != 1 || wr.Devices[0].DeviceName != "gpu-3" || wr.Devices[0].PoolName != e.nodeName {
		t.Fatalf("whole devices = %+v", wr.Devices)
	}
	// Its own ID first: the kubelet names the device by it in the pod's
	// allocatedResourcesStatus.
	wantIDs := []string{"k8s.gpu.tessera.dev/claim=" + string(whole.UID) + "-gpu-3", cdi.BaseID}
	if !reflect.DeepEqual(wr.Devices[0].CdiDeviceIds, wantIDs) {
		t.Errorf("CDI IDs = %v, want %v", wr.Devices[0].CdiDeviceIds, wantIDs)
	}
	spec := e.readSpec(string(whole.UID))
	if n := spec.Devices[0].ContainerEdits.DeviceNodes; len(n) != 1 || n[0].Path != "/dev/nvidia3" || n[0].Type != "c" || n[0].Major != 195 || n[0].Minor != 3 {
		t.Errorf("whole GPU device nodes = %+v", n)
	}
	g3, _ := e.node.GPUByMinor(3)
	if v := e.containerView(wr.Devices[0].CdiDeviceIds...); !reflect.DeepEqual(v.UUIDs(), []string{g3.UUID}) || len(v.Problems) != 0 {
		t.Errorf("a container given the whole GPU sees %+v", v)
	}

	// MIG: created at exactly the allocated placement.
	mr := resp[string(migc.UID)]
	if len(mr.Devices) != 1 {
		t.Fatalf("mig devices = %+v", mr.Devices)
	}
	name, err := devicename.Parse(mr.Devices[0].DeviceName)
	if err != nil || name.Kind != devicename.KindMIG || name.Minor != 1 || name.Profile != "1g.10gb" {
		t.Fatalf("allocated MIG device %q: %+v, %v", mr.Devices[0].DeviceName, name, err)
	}
	g1, _ := e.node.GPUByMinor(1)
	prof, _ := g1.Profile("1g.10gb")
	wantInst := []string{"gpu1:" + prof.Name + "@" + itoa(name.Start)}
	if got := e.migInstances(); !reflect.DeepEqual(got, wantInst) {
		t.Errorf("MIG instances = %v, want %v", got, wantInst)
	}
	gi := onlyGI(t, e, 1)
	mspec := e.readSpec(string(migc.UID))
	giMinor, ciMinor := nvmlbackend.CapMinors(1, gi.GIID)
	wantNodes := []string{"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap" + itoa(giMinor), "/dev/nvidia-caps/nvidia-cap" + itoa(ciMinor(gi.CIID))}
	if got := nodePaths(mspec.Devices[0].ContainerEdits); !reflect.DeepEqual(got, wantNodes) {
		t.Errorf("MIG device nodes = %v, want %v", got, wantNodes)
	}
	if v := e.containerView(mr.Devices[0].CdiDeviceIds...); !reflect.DeepEqual(v.UUIDs(), []string{gi.UUID}) {
		t.Errorf("a container given the MIG device sees %+v, want exactly %s", v, gi.UUID)
	}

	// Shared: the claim's own MPS daemon for GPU 2, in a pod of its own,
	// holding the claim's limits; the claim's containers get only the way
	// to it (spec-level edits: once per container).
	sr := resp[string(shared.UID)]
	if len(sr.Devices) != 1 || sr.Devices[0].DeviceName != "gpu-2-shared" || sr.Devices[0].ShareId == nil {
		t.Fatalf("shared devices = %+v", sr.Devices)
	}
	g2, _ := e.node.GPUByMinor(2)
	sspec := e.readSpec(string(shared.UID))
	if got := sspec.Devices[0].ContainerEdits.Env; len(got) != 0 {
		t.Errorf("device env = %v, want none: limits are the daemon's", got)
	}
	if got := sspec.ContainerEdits.Env; !reflect.DeepEqual(got, []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}) {
		t.Errorf("claim env = %v", got)
	}
	pipe := e.pipeDir(shared.UID)
	mounts := map[string]string{}
	for _, m := range sspec.ContainerEdits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	if !reflect.DeepEqual(mounts, map[string]string{"/tmp/nvidia-mps": pipe, "/dev/shm": filepath.Join(filepath.Dir(pipe), "shm")}) {
		t.Errorf("MPS mounts = %v", mounts)
	}
	st, err := faketools.Daemon(pipe)
	if err != nil || !st.Reachable(pipe) {
		t.Fatalf("no daemon on %s: %+v %v", pipe, st, err)
	}
	if !reflect.DeepEqual(st.Visible, []string{g2.UUID}) || !reflect.DeepEqual(st.PinnedMemLimit, map[int]string{0: "10240M"}) || st.ActiveThreadPercentage != 25 {
		t.Errorf("daemon %+v, want GPU 2 with 10240M and 25%%", st)
	}
	if got := e.daemonPods(); !reflect.DeepEqual(got, []string{string(shared.UID)}) {
		t.Errorf("daemon pods %v", got)
	}
	if got := e.tools.CallsMatching("mps-control -d"); len(got) != 1 || !strings.Contains(got[0], "visible="+g2.UUID+" mem=0=10240M threads=25") {
		t.Errorf("daemon starts %q", got)
	}

	// Asking again returns the same answer and changes nothing.
	again := k.prepare(t, e.ctx, whole, migc, shared)
	for uid, r := range resp {
		if !reflect.DeepEqual(again[uid].Devices, r.Devices) {
			t.Errorf("second prepare of %s = %+v, want %+v", uid, again[uid].Devices, r.Devices)
		}
	}
	if got := e.migInstances(); len(got) != 1 {
		t.Errorf("second prepare changed MIG instances: %v", got)
	}

	// Unprepare: MIG destroyed, daemon stopped, specs removed; twice is fine.
	e.tools.Reset()
	for i := 0; i < 2; i++ {
		for uid, r := range k.unprepare(t, e.ctx, whole, migc, shared) {
			if r.Error != "" {
				t.Errorf("unprepare %d of %s: %s", i, uid, r.Error)
			}
		}
	}
	if got := e.migInstances(); len(got) != 0 {
		t.Errorf("MIG instances left: %v", got)
	}
	if got := e.specFiles(); len(got) != 0 {
		t.Errorf("CDI specs left: %v", got)
	}
	if got := e.tools.CallsMatching("quit"); len(got) != 1 {
		t.Errorf("quit sent %d times at unprepare: %q", len(got), e.tools.Calls())
	}
	if faketools.Alive(pipe) {
		t.Error("MPS daemon alive after unprepare")
	}
	e.waitNoDaemonPods()
}

func itoa(i int) string { return strconv.Itoa(i) }

// containerView is what the model says a CUDA process sees in a container
// whose runtime injected these CDI devices (resolved by a fresh CDI cache
// over the plugin's spec directory, as a runtime's).
func (e *env) containerView(ids ...string) nvmlbackend.ContainerView {
	e.t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		e.t.Fatalf("CDI spec errors: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatalf("inject %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return e.lib.ContainerView(spec)
}

func onlyGI(t *testing.T, e *env, minor int) nvmlbackend.Instance {
	t.Helper()
	in := e.lib.GPUs()[minor].Instances()
	if len(in) != 1 {
		t.Fatalf("GPU %d has MIG instances %v, want 1", minor, in)
	}
	return in[0]
}

// TestMIGWithMPS: a MIG device shared by the claim's containers through
// MPS gets a daemon of its own, addressed by the MIG device's UUID, and the
// configured client limits.
func TestMIGWithMPS(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	c := e.claim("mig-mps", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "3g.40gb" && device.attributes["gpu.tessera.dev"].index == 0`}},
		claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mps":{"activeThreadPercentage":50,"pinnedDeviceMemoryLimit":"20Gi"}}}`})
	r := k.prepare(t, e.ctx, c)[string(c.UID)]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	migs := e.lib.GPUs()[0]
	n, ret := migs.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	var migUUID string
	for i := 0; i < n; i++ {
		if h, ret := migs.GetMigDeviceHandleByIndex(i); ret == nvml.SUCCESS {
			migUUID, _ = h.GetUUID()
		}
	}
	if !strings.HasPrefix(migUUID, "MIG-") {
		t.Fatalf("no MIG device handle: %q", migUUID)
	}
	// The claim's daemon serves the MIG device by its UUID, with the
	// configured limits.
	pipe := e.pipeDir(c.UID)
	st, err := faketools.Daemon(pipe)
	if err != nil || !st.Reachable(pipe) || !reflect.DeepEqual(st.Visible, []string{migUUID}) || st.PinnedMemLimit[0] != "20480M" || st.ActiveThreadPercentage != 50 {
		t.Errorf("daemon %+v, %v", st, err)
	}
	if got := e.tools.CallsMatching("mps-control -d"); len(got) != 1 {
		t.Errorf("daemon starts %q", got)
	}
	spec := e.readSpec(string(c.UID))
	if got := spec.ContainerEdits.Env; !reflect.DeepEqual(got, []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}) {
		t.Errorf("env = %q", got)
	}
	e.tools.Reset()
	if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if got := e.tools.CallsMatching("quit"); len(got) != 1 || faketools.Alive(pipe) {
		t.Errorf("quit calls at unprepare = %q", got)
	}
	if got := e.migInstances(); len(got) != 0 {
		t.Errorf("MIG instances left: %v", got)
	}
}
