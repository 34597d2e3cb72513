package cdi

import (
	"errors"

	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// machine is a modelled DGX H100 with its driver installation laid out in
// a directory: ELF libraries with their SONAMEs and links, binaries, device
// nodes, /proc/devices, /proc/driver/nvidia-caps/mig-minors and
// /proc/driver/nvidia/capabilities.
func machine(t *testing.T, gpus int) (*nvmlbackend.Mock, string) {
	t.Helper()
	lib, err := nvmlbackend.NewMock("dgxh100", gpus)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	if err := lib.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	return lib, root
}

func newDriver(t *testing.T, lib *nvmlbackend.Mock, root string) *Driver {
	t.Helper()
	d, err := NewDriver(DriverOptions{NVML: lib, DriverRoot: root, ProcRoot: filepath.Join(root, "proc")})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func node(e cdispec.ContainerEdits, path string) *cdispec.DeviceNode {
	for _, n := range e.DeviceNodes {
		if n.Path == path {
			return n
		}
	}
	return nil
}

func hookArgs(e cdispec.ContainerEdits) string {
	var out []string
	for _, h := range e.Hooks {
		out = append(out, strings.Join(h.Args, " "))
	}
	return strings.Join(out, "\n")
}

// TestDriverEdits: nvcdi's edits from the driver root carry the libraries,
// binaries, hooks and char devices with type, major and minor.
func TestDriverEdits(t *testing.T) {
	lib, root := machine(t, 2)
	d := newDriver(t, lib, root)
	ver := lib.DriverVersion()
	if d.Version() != ver {
		t.Fatalf("driver version %q, want %q", d.Version(), ver)
	}
	common, err := d.Common()
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{}
	for _, m := range common.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	for _, want := range []string{
		nvmlbackend.LibDir + "/libcuda.so." + ver, nvmlbackend.LibDir + "/libnvidia-ml.so." + ver, nvmlbackend.LibDir + "/libnvidia-ptxjitcompiler.so." + ver,
		"/usr/bin/nvidia-smi", "/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server",
	} {
		if host, ok := mounts[want]; !ok || host != filepath.Join(root, want) {
			t.Errorf("common edits mount %s from %q, want %s", want, host, filepath.Join(root, want))
		}
	}
	hooks := hookArgs(common)
	for _, want := range []string{"create-symlinks", "libcuda.so." + ver + "::" + nvmlbackend.LibDir + "/libcuda.so.1", "update-ldcache", "--folder " + nvmlbackend.LibDir} {
		if !strings.Contains(hooks, want) {
			t.Errorf("hooks lack %q:\n%s", want, hooks)
		}
	}
	for _, h := range common.Hooks {
		if h.Path != DefaultHookPath {
			t.Errorf("hook path %q, want %s", h.Path, DefaultHookPath)
		}
	}
	for path, num := range map[string][2]int64{"/dev/nvidiactl": {195, 255}, "/dev/nvidia-uvm": {nvmlbackend.UVMMajor, 0}, "/dev/nvidia-uvm-tools": {nvmlbackend.UVMMajor, 1}} {
		n := node(common, path)
		if n == nil || n.Type != "c" || n.Major != num[0] || n.Minor != num[1] {
			t.Errorf("%s: %+v, want c %d:%d", path, n, num[0], num[1])
		}
	}

	gpu := lib.GPUs()[1]
	e, err := d.GPU(gpu.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if n := node(e, "/dev/nvidia1"); n == nil || n.Type != "c" || n.Major != 195 || n.Minor != 1 || len(e.DeviceNodes) != 1 {
		t.Fatalf("GPU 1 edits %+v", e.DeviceNodes)
	}

	_ = gpu.EnableMIG()
	in, err := gpu.CreateInstance("3g.40gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	m, err := d.MIG(gpu.UUID, 1, in.GIID, in.CIID)
	if err != nil {
		t.Fatal(err)
	}
	giMinor, ciMinor := nvmlbackend.CapMinors(1, in.GIID)
	for _, want := range []struct {
		path         string
		major, minor int64
	}{{"/dev/nvidia1", 195, 1}, {capPath(giMinor), nvmlbackend.CapsMajor, int64(giMinor)}, {capPath(ciMinor(in.CIID)), nvmlbackend.CapsMajor, int64(ciMinor(in.CIID))}} {
		n := node(m, want.path)
		if n == nil || n.Type != "c" || n.Major != want.major || n.Minor != want.minor {
			t.Errorf("MIG edits %s: %+v", want.path, n)
		}
	}
	// The capability nodes need not exist on the host: the driver creates
	// them on demand, the runtime creates them from type/major/minor.
	if _, err := os.Stat(filepath.Join(root, capPath(giMinor))); !os.IsNotExist(err) {
		t.Fatalf("the fake driver root has the capability node: %v", err)
	}
}

// TestSpecsAsTheRuntimeSeesThem: the base and claim specs validate with
// the CDI library, resolve in a fresh cache (as a runtime's), and injected
// into a container give what the model says a CUDA process needs: a whole
// GPU, exactly one MIG device, or a share with its MPS edits.
func TestSpecsAsTheRuntimeSeesThem(t *testing.T) {
	lib, root := machine(t, 2)
	d := newDriver(t, lib, root)
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	common, _ := d.Common()
	baseID, err := w.WriteBase(common)
	if err != nil || baseID != "k8s.gpu.tessera.dev/driver=common" {
		t.Fatalf("WriteBase: %q %v", baseID, err)
	}
	gpu0, gpu1 := lib.GPUs()[0], lib.GPUs()[1]
	whole, _ := d.GPU(gpu0.UUID)
	_ = gpu1.EnableMIG()
	in, _ := gpu1.CreateInstance("1g.10gb", 2)
	other, _ := gpu1.CreateInstance("1g.10gb", 3)
	mig, err := d.MIG(gpu1.UUID, 1, in.GIID, in.CIID)
	if err != nil {
		t.Fatal(err)
	}
	share := whole
	// The claim's MPS daemon: spec-level, once per container whatever
	// devices of the claim it gets.
	claimEdits := cdispec.ContainerEdits{
		Env:    []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
		Mounts: []*cdispec.Mount{MountEdit(Mount{HostPath: "/run/tessera/mps/claims/x/pipe", ContainerPath: "/tmp/nvidia-mps"})},
	}
	uid := types.UID("0b7d3c6e-1111-2222-3333-444455556666")
	ids, err := w.WriteClaim(uid, []byte(`{"uid":"x"}`), []Device{{Name: "gpu-0", Edits: whole}, {Name: "gpu-1-mig-1g-10gb-2", Edits: mig}, {Name: "gpu-0-shared-a", Edits: share}}, claimEdits)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"k8s.gpu.tessera.dev/claim=" + string(uid) + "-gpu-0", "k8s.gpu.tessera.dev/claim=" + string(uid) + "-gpu-1-mig-1g-10gb-2", "k8s.gpu.tessera.dev/claim=" + string(uid) + "-gpu-0-shared-a"}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("ids = %q, want %q", ids, want)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("spec errors: %v", errs)
	}
	inject := func(ids ...string) *oci.Spec {
		t.Helper()
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
			t.Fatalf("inject %v: %v (%v)", ids, err, unresolved)
		}
		return spec
	}
	// The base ID goes with every device; given twice it adds its edits once.
	twice := inject(baseID, ids[0], baseID)
	if got := countHooks(twice, "create-symlinks"); got != 1 {
		t.Errorf("create-symlinks hook %d times with the base ID given twice", got)
	}
	if v := lib.ContainerView(twice); !slices.Equal(v.UUIDs(), []string{gpu0.UUID}) || len(v.Problems) != 0 {
		t.Errorf("whole GPU 0: %+v", v)
	}
	if v := lib.ContainerView(inject(baseID, ids[1])); !slices.Equal(v.UUIDs(), []string{in.UUID}) || v.Sees(other.UUID) {
		t.Errorf("MIG device: sees %v, want only %s", v.UUIDs(), in.UUID)
	}
	if v := lib.ContainerView(inject(ids[0])); len(v.Devices) != 0 {
		t.Errorf("claim device without the base (no driver): sees %v", v.UUIDs())
	}
	s := inject(baseID, ids[2], ids[0])
	if !slices.Contains(s.Process.Env, "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps") || !hasMount(s, "/tmp/nvidia-mps") {
		t.Errorf("share: env %v mounts %v", s.Process.Env, s.Mounts)
	}
	n := 0
	for _, m := range s.Mounts {
		if m.Destination == "/tmp/nvidia-mps" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("two devices of the claim: the pipe directory is mounted %d times", n)
	}

	records, broken, err := w.Claims()
	if err != nil || len(broken) != 0 || string(records[uid]) != `{"uid":"x"}` || len(records) != 1 {
		t.Fatalf("records = %q %v %v (the base spec is no claim)", records, broken, err)
	}
	if err := w.Remove(uid); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove(uid); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if _, err := os.Stat(w.SpecPath(uid)); !os.IsNotExist(err) {
		t.Errorf("spec still there: %v", err)
	}
}

func countHooks(s *oci.Spec, name string) int {
	n := 0
	if s.Hooks != nil {
		for _, h := range s.Hooks.CreateContainer {
			if slices.Contains(h.Args, name) {
				n++
			}
		}
	}
	return n
}

func hasMount(s *oci.Spec, dst string) bool {
	return slices.ContainsFunc(s.Mounts, func(m oci.Mount) bool { return m.Destination == dst })
}

// TestNoDriverIsAnError: a driver root without the driver's libraries is
// refused at start, naming the root, never a spec without libraries.
func TestNoDriverIsAnError(t *testing.T) {
	lib, root := machine(t, 1)
	empty := t.TempDir()
	_, err := NewDriver(DriverOptions{NVML: lib, DriverRoot: empty, ProcRoot: filepath.Join(root, "proc")})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), empty) || !strings.Contains(err.Error(), "--driver-root") {
		t.Fatalf("NewDriver on an empty root: %v", err)
	}
	if _, err := NewDriver(DriverOptions{NVML: lib, DriverRoot: root, ProcRoot: empty}); err == nil || !strings.Contains(err.Error(), "devices") {
		t.Fatalf("NewDriver without /proc/devices: %v", err)
	}
}

// TestHostDriverRoot: with the driver root mounted elsewhere in
// tessera-node (the GPU operator's /run/nvidia/driver at /driver-root),
// every host path in the spec is the host's.
func TestHostDriverRoot(t *testing.T) {
	lib, root := machine(t, 1)
	d, err := NewDriver(DriverOptions{NVML: lib, DriverRoot: root, HostDriverRoot: "/run/nvidia/driver", ProcRoot: filepath.Join(root, "proc")})
	if err != nil {
		t.Fatal(err)
	}
	common, _ := d.Common()
	for _, m := range common.Mounts {
		if !strings.HasPrefix(m.HostPath, "/run/nvidia/driver/") {
			t.Errorf("mount %s from %s, want a host path under /run/nvidia/driver", m.ContainerPath, m.HostPath)
		}
	}
	e, _ := d.GPU(lib.GPUs()[0].UUID)
	if n := node(e, "/dev/nvidia0"); n == nil || n.HostPath != "/run/nvidia/driver/dev/nvidia0" {
		t.Errorf("device node %+v, want host path /run/nvidia/driver/dev/nvidia0", n)
	}
}

func TestWriteRejectsInvalid(t *testing.T) {
	w, err := NewWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Write("uid", nil, []Device{{Name: "bad name!", Edits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", Type: "c", Major: 195}}}}})
	if err == nil || !strings.Contains(err.Error(), "uid") {
		t.Fatalf("err = %v, want a validation error naming the claim", err)
	}
	if entries, _ := os.ReadDir(w.dir); len(entries) != 0 {
		t.Errorf("invalid spec left files: %v", entries)
	}
}

func TestMIGCaps(t *testing.T) {
	if _, err := (MIGCaps{MinorsFile: filepath.Join(t.TempDir(), "none")}).Minors(1, 2, 0); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing table: %v", err)
	}
	table := filepath.Join(t.TempDir(), "mig-minors")
	if err := os.WriteFile(table, []byte("config 1\nmonitor 2\ngpu1/gi2/access 40\ngpu1/gi2/ci0/access 41\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes, err := MIGCaps{MinorsFile: table}.Nodes(1, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/dev/nvidia-caps/nvidia-cap40", "/dev/nvidia-caps/nvidia-cap41"}; !reflect.DeepEqual(nodes, want) {
		t.Errorf("table nodes = %q, want %q", nodes, want)
	}
	if _, err := (MIGCaps{MinorsFile: table}).Nodes(0, 0, 0); err == nil {
		t.Error("missing table entry accepted")
	}
}
