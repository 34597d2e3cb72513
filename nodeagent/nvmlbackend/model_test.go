package nvmlbackend_test

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// published is what NVIDIA publishes for every 8-memory-slice product (MIG
// User Guide, "Supported MIG Profiles", and `nvidia-smi mig -lgipp`), per
// profile index: placements as "start:size", and how many may exist.
var published = map[int]struct {
	placements string
	instances  int
}{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      {"0:1 1:1 2:1 3:1 4:1 5:1 6:1", 7},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: {"0:1 1:1 2:1 3:1 4:1 5:1 6:1", 1},
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {"0:2 2:2 4:2 6:2", 4},
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      {"0:2 2:2 4:2", 3},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {"0:4 4:4", 2},
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      {"0:4", 1},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {"0:8", 1},
}

// publishedNames are nvidia-smi's profile names per product.
var publishedNames = map[string][]string{
	"dgxa100":      {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
	"dgxa100-80gb": {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	"dgxh100":      {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	"dgxh200":      {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
	"dgxb200":      {"1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"},
}

// TestProductTables checks what the model answers through NVML against the
// published tables: every profile's placements and instance count, and the
// names go-nvlib (which names profiles as nvidia-smi does) derives from the
// reported memory sizes.
func TestProductTables(t *testing.T) {
	for _, machine := range nvmlbackend.MockMachines() {
		t.Run(machine, func(t *testing.T) {
			lib, err := nvmlbackend.NewMock(machine, 1)
			if err != nil {
				t.Fatal(err)
			}
			dev, ret := lib.DeviceGetHandleByIndex(0)
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			mem, _ := dev.GetMemoryInfo()
			devlib := nvdev.New(lib)
			var names []string
			devices := 0
			for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
				info, ret := dev.GetGpuInstanceProfileInfo(index)
				want, listed := published[index]
				if ret == nvml.ERROR_NOT_SUPPORTED {
					if listed {
						t.Errorf("profile index %d not supported, NVIDIA lists it", index)
					}
					continue
				}
				if ret != nvml.SUCCESS || !listed {
					t.Fatalf("profile index %d: %v (listed: %v)", index, ret, listed)
				}
				if info.Id == uint32(index) && index != 0 {
					t.Errorf("profile index %d reports id %d: NVML's profile IDs are not the indices", index, info.Id)
				}
				pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
				if ret != nvml.SUCCESS {
					t.Fatal(ret)
				}
				var got []string
				for _, p := range pls {
					got = append(got, fmt.Sprintf("%d:%d", p.Start, p.Size))
				}
				if strings.Join(got, " ") != want.placements || int(info.InstanceCount) != want.instances {
					t.Errorf("profile index %d: placements %v instances %d, want %s and %d", index, got, info.InstanceCount, want.placements, want.instances)
				}
				devices += len(pls)
				p, err := devlib.NewMigProfile(index, fullCI(int(info.SliceCount)), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, mem.Total)
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, p.String())
			}
			if !slices.Equal(names, sortedByIndex(publishedNames[machine])) {
				t.Errorf("go-nvlib names %v, nvidia-smi names %v", names, publishedNames[machine])
			}
			// 7 + 7 + 4 + 3 + 2 + 1 + 1 (profile, placement) pairs.
			if devices != 25 {
				t.Errorf("%d (profile, placement) pairs, want 25", devices)
			}
			product, _ := nvmlbackend.MachineProduct(machine)
			if product.PlacementCount() != 25 || product.MemorySlices() != 8 {
				t.Errorf("product: %d placements over %d memory slices", product.PlacementCount(), product.MemorySlices())
			}
		})
	}
}

// sortedByIndex orders published names (given as 1g, 1g+me, 1g double,
// 2g, 3g, 4g, 7g) by NVML profile index (1g=0, 2g=1, 3g=2, 4g=3, 7g=4,
// 1g+me=7, 1g double=9).
func sortedByIndex(names []string) []string {
	return []string{names[0], names[3], names[4], names[5], names[6], names[1], names[2]}
}

func fullCI(slices int) int {
	return map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
		4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[slices]
}

func TestMIGModeIsPendingWhileTheGPUIsHeld(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 1)
	gpu := lib.GPUs()[0]
	if err := lib.HoldGPU(gpu.UUID, 1); err != nil { // nvidia-persistenced
		t.Fatal(err)
	}
	ret, activation := gpu.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if ret != nvml.SUCCESS || activation != nvml.ERROR_IN_USE {
		t.Fatalf("SetMigMode on a held GPU: %v, %v; want SUCCESS, ERROR_IN_USE (pending)", ret, activation)
	}
	if cur, pend, _ := gpu.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("mode %d pending %d, want 0 pending 1", cur, pend)
	}
	info, _ := gpu.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := gpu.CreateGpuInstance(&info); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("create while MIG is only pending: %v", ret)
	}
	if ret := lib.ResetGPU(gpu.UUID); ret != nvml.ERROR_IN_USE {
		t.Fatalf("reset of a held GPU: %v", ret)
	}
	_ = lib.HoldGPU(gpu.UUID, 0)
	if ret := lib.ResetGPU(gpu.UUID); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if !gpu.MIGMode().Current {
		t.Fatal("MIG mode not on after the reset")
	}
	// On an idle GPU the change takes effect at once.
	if ret, act := gpu.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS || gpu.MIGMode().Current {
		t.Fatalf("disable on idle GPU: %v %v %+v", ret, act, gpu.MIGMode())
	}
}

func TestInstanceIDsLimitsAndHandles(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 1)
	gpu := lib.GPUs()[0]
	if err := gpu.EnableMIG(); err != nil {
		t.Fatal(err)
	}
	// GPU instance IDs follow the placement.
	for _, c := range []struct {
		profile string
		start   uint32
		gi      uint32
	}{{"3g.40gb", 4, 2}, {"1g.10gb+me", 0, 7}, {"1g.10gb", 1, 8}} {
		in, err := gpu.CreateInstance(c.profile, c.start)
		if err != nil {
			t.Fatal(err)
		}
		if in.GIID != c.gi || in.CIID != 0 || !strings.HasPrefix(in.UUID, "MIG-") {
			t.Fatalf("%s@%d: %+v, want GPU instance %d, compute instance 0", c.profile, c.start, in, c.gi)
		}
	}
	// One +me per GPU, even on a free slice.
	if _, err := gpu.CreateInstance("1g.10gb+me", 2); err == nil || !strings.Contains(err.Error(), "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("second +me instance: %v", err)
	}
	if _, err := gpu.CreateInstance("1g.20gb", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := gpu.CreateInstance("2g.20gb", 4); err == nil || !strings.Contains(err.Error(), "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("2g over 3g's slices: %v", err)
	}
	// Whole-GPU attributes are MIG-only; MIG handles answer them.
	if _, ret := gpu.GetAttributes(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("GetAttributes on a GPU handle: %v", ret)
	}
	n, _ := gpu.GetMaxMigDeviceCount()
	var uuids []string
	for i := 0; i < n; i++ {
		mig, ret := gpu.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		a, ret := mig.GetAttributes()
		if ret != nvml.SUCCESS || a.MultiprocessorCount == 0 || a.MemorySizeMB == 0 {
			t.Fatalf("MIG attributes %+v %v", a, ret)
		}
		id, _ := mig.GetUUID()
		uuids = append(uuids, id)
		if h, ret := lib.DeviceGetHandleByUUID(id); ret != nvml.SUCCESS || h != mig {
			t.Fatalf("MIG handle by UUID: %v", ret)
		}
	}
	if len(uuids) != 4 {
		t.Fatalf("%d MIG device handles, want 4", len(uuids))
	}
	if got := fmt.Sprint(gpu.Instances()); got != "[3g.40gb@4(gi2/ci0) 1g.20gb@2(gi4/ci0) 1g.10gb+me@0(gi7/ci0) 1g.10gb@1(gi8/ci0)]" {
		t.Fatalf("instances %s", got)
	}
	if ret, _ := gpu.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Fatalf("MIG off with instances: %v", ret)
	}
}

func TestLostGPUAndReset(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 2)
	gpu := lib.GPUs()[1]
	_ = gpu.EnableMIG()
	if _, err := gpu.CreateInstance("7g.80gb", 0); err != nil {
		t.Fatal(err)
	}
	set, _ := lib.EventSetCreate()
	defer set.Free()
	if ret := gpu.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := lib.InjectXID(gpu.UUID, 79); err != nil {
		t.Fatal(err)
	}
	if ev, ret := set.Wait(1000); ret != nvml.SUCCESS || ev.EventData != 79 {
		t.Fatalf("XID 79: %+v %v", ev, ret)
	}
	if _, ret := lib.DeviceGetHandleByIndex(1); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("handle of a lost GPU: %v", ret)
	}
	if _, ret := lib.DeviceGetHandleByUUID(gpu.UUID); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("handle by UUID of a lost GPU: %v", ret)
	}
	if _, ret := gpu.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("query of a lost GPU: %v", ret)
	}
	if n, _ := lib.DeviceGetCount(); n != 2 {
		t.Fatalf("count %d: a lost GPU is still counted", n)
	}
	if _, ret := lib.DeviceGetHandleByIndex(0); ret != nvml.SUCCESS {
		t.Fatalf("the other GPU: %v", ret)
	}
	// Back after a reset: instances gone, MIG mode kept, events silent
	// until registered again.
	if err := lib.SetLost(gpu.UUID, false); err != nil {
		t.Fatal(err)
	}
	if len(gpu.Instances()) != 0 || !gpu.MIGMode().Current {
		t.Fatalf("after reset: instances %v, mode %+v", gpu.Instances(), gpu.MIGMode())
	}
	if err := lib.InjectXID(gpu.UUID, 48); err == nil {
		t.Fatal("event delivered through a registration from before the reset")
	}
	if ret := gpu.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := lib.InjectXID(gpu.UUID, 48); err != nil {
		t.Fatal(err)
	}
}

func TestFailCall(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxa100", 1)
	gpu := lib.GPUs()[0]
	_ = gpu.EnableMIG()
	lib.FailCall(gpu.UUID, "CreateGpuInstanceWithPlacement", 1, nvml.ERROR_UNKNOWN)
	if _, err := gpu.CreateInstance("1g.5gb", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := gpu.CreateInstance("1g.5gb", 1); err == nil || !strings.Contains(err.Error(), "ERROR_UNKNOWN") {
		t.Fatalf("second create: %v", err)
	}
	if _, err := gpu.CreateInstance("1g.5gb", 1); err != nil {
		t.Fatalf("the fault fires once: %v", err)
	}
}

func TestDriverRoot(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 2)
	root, err := lib.DriverRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	ver := lib.DriverVersion()
	f, err := elf.Open(filepath.Join(root, nvmlbackend.LibDir, "libcuda.so."+ver))
	if err != nil {
		t.Fatal(err)
	}
	sonames, err := f.DynString(elf.DT_SONAME)
	_ = f.Close()
	if err != nil || !slices.Equal(sonames, []string{"libcuda.so.1"}) {
		t.Fatalf("SONAME %v %v", sonames, err)
	}
	if target, _ := os.Readlink(filepath.Join(root, nvmlbackend.LibDir, "libcuda.so.1")); target != "libcuda.so."+ver {
		t.Fatalf("libcuda.so.1 -> %q", target)
	}
	// ldconfig reads the SONAME as from a real library (through the program
	// headers): it makes the SONAME link in a directory that has only the
	// file, as nvidia-cdi-hook's update-ldcache has it do in a container.
	if _, err := os.Stat("/sbin/ldconfig"); err == nil {
		dir := t.TempDir()
		data, err := os.ReadFile(filepath.Join(root, nvmlbackend.LibDir, "libnvidia-ml.so."+ver))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so."+ver), data, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("/sbin/ldconfig", "-n", dir).CombinedOutput(); err != nil {
			t.Fatalf("ldconfig -n: %v: %s", err, out)
		}
		if target, err := os.Readlink(filepath.Join(dir, "libnvidia-ml.so.1")); err != nil || target != "libnvidia-ml.so."+ver {
			t.Errorf("ldconfig made libnvidia-ml.so.1 -> %q (%v), want the library: it does not read the model's SONAME", target, err)
		}
	}
	if st, err := os.Stat(filepath.Join(root, "usr/bin/nvidia-smi")); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("nvidia-smi: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(root, "dev/nvidia1"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR && (unix.Major(st.Rdev) != nvmlbackend.NVIDIAMajor || unix.Minor(st.Rdev) != 1) {
		t.Fatalf("/dev/nvidia1 is %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	// Capability files follow the instances, as the driver's do.
	gpu := lib.GPUs()[1]
	_ = gpu.EnableMIG()
	in, err := gpu.CreateInstance("3g.40gb", 0)
	if err != nil {
		t.Fatal(err)
	}
	capFile := filepath.Join(root, fmt.Sprintf("proc/driver/nvidia/capabilities/gpu1/mig/gi%d/ci0/access", in.GIID))
	raw, err := os.ReadFile(capFile)
	giMinor, ciMinor := nvmlbackend.CapMinors(1, in.GIID)
	if err != nil || !strings.Contains(string(raw), fmt.Sprintf("DeviceFileMinor: %d\n", ciMinor(0))) {
		t.Fatalf("%s: %q %v", capFile, raw, err)
	}
	minors, _ := os.ReadFile(filepath.Join(root, "proc/driver/nvidia-caps/mig-minors"))
	if !strings.Contains(string(minors), fmt.Sprintf("gpu1/gi%d/access %d\n", in.GIID, giMinor)) {
		t.Fatal("mig-minors lacks the GPU instance")
	}
	// The PCIe root is resolvable the way Kubernetes' helper resolves it.
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID("0000:2a:00.0", deviceattribute.WithFSFromRoot(filepath.Join(root, "sys")))
	if err != nil || *attr.Value.StringValue != "pci0000:27" {
		t.Fatalf("pcieRoot: %+v %v", attr, err)
	}
	if err := lib.Shutdown(); err != nvml.SUCCESS {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("driver root kept after shutdown: %v", err)
	}
	_ = lib.Init()
}

// container builds the OCI spec a runtime makes for a container with these
// device nodes, mounts and hooks.
func container(devices []oci.LinuxDevice, mounts []string, hooks []oci.Hook, env ...string) *oci.Spec {
	s := &oci.Spec{Process: &oci.Process{Env: env}, Linux: &oci.Linux{Devices: devices}, Hooks: &oci.Hooks{CreateContainer: hooks}}
	for _, m := range mounts {
		s.Mounts = append(s.Mounts, oci.Mount{Destination: m, Source: m})
	}
	return s
}

func cdev(path string, major, minor int64) oci.LinuxDevice {
	return oci.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor}
}

func TestContainerView(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 2)
	ver := lib.DriverVersion()
	libs := []string{nvmlbackend.LibDir + "/libcuda.so." + ver, nvmlbackend.LibDir + "/libnvidia-ml.so." + ver}
	links := []oci.Hook{{Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so." + ver + "::" + nvmlbackend.LibDir + "/libcuda.so.1", "--link", "libnvidia-ml.so." + ver + "::" + nvmlbackend.LibDir + "/libnvidia-ml.so.1"}}}
	control := []oci.LinuxDevice{cdev("/dev/nvidiactl", 195, 255), cdev("/dev/nvidia-uvm", nvmlbackend.UVMMajor, 0)}
	gpu0, gpu1 := lib.GPUs()[0], lib.GPUs()[1]

	whole := lib.ContainerView(container(append(control, cdev("/dev/nvidia0", 195, 0)), libs, links))
	if !slices.Equal(whole.UUIDs(), []string{gpu0.UUID}) || len(whole.Problems) != 0 {
		t.Fatalf("whole GPU 0: %+v", whole)
	}
	noDriver := lib.ContainerView(container(append(control, cdev("/dev/nvidia0", 195, 0)), nil, nil))
	if len(noDriver.Devices) != 0 || !strings.Contains(strings.Join(noDriver.Problems, "; "), "libcuda.so."+ver+" is not mounted") {
		t.Fatalf("device nodes without the driver: %+v", noDriver)
	}
	noLink := lib.ContainerView(container(append(control, cdev("/dev/nvidia0", 195, 0)), libs, nil))
	if len(noLink.Devices) != 0 {
		t.Fatalf("libcuda.so.1 missing but devices seen: %+v", noLink)
	}

	_ = gpu1.EnableMIG()
	a, _ := gpu1.CreateInstance("1g.10gb", 0)
	b, _ := gpu1.CreateInstance("3g.40gb", 4)
	giMinor, ciMinor := nvmlbackend.CapMinors(1, b.GIID)
	withoutCaps := lib.ContainerView(container(append(control, cdev("/dev/nvidia1", 195, 1)), libs, links))
	if len(withoutCaps.Devices) != 0 || !strings.Contains(strings.Join(withoutCaps.Problems, "; "), "in MIG mode") {
		t.Fatalf("MIG GPU without capabilities: %+v", withoutCaps)
	}
	caps := []oci.LinuxDevice{cdev("/dev/nvidia1", 195, 1),
		cdev(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", giMinor), nvmlbackend.CapsMajor, int64(giMinor)),
		cdev(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ciMinor(0)), nvmlbackend.CapsMajor, int64(ciMinor(0)))}
	mig := lib.ContainerView(container(append(control, caps...), libs, links))
	if !slices.Equal(mig.UUIDs(), []string{b.UUID}) || mig.Sees(a.UUID) || mig.Devices[0].Profile != "3g.40gb" {
		t.Fatalf("MIG device 3g.40gb@4: %+v (other instance %s)", mig, a.UUID)
	}
	filtered := lib.ContainerView(container(append(append(control, cdev("/dev/nvidia0", 195, 0)), caps...), libs, links, "CUDA_VISIBLE_DEVICES="+b.UUID))
	if !slices.Equal(filtered.UUIDs(), []string{b.UUID}) {
		t.Fatalf("CUDA_VISIBLE_DEVICES: %+v", filtered)
	}
	_ = lib.SetLost(gpu0.UUID, true)
	lost := lib.ContainerView(container(append(control, cdev("/dev/nvidia0", 195, 0)), libs, links))
	if len(lost.Devices) != 0 || !strings.Contains(strings.Join(lost.Problems, " "), "lost") {
		t.Fatalf("lost GPU: %+v", lost)
	}
}

// TestStaleDriverRootsAreRemoved: a driver root left by a process that is
// gone (never shut down, killed) is removed when the next one is made.
func TestStaleDriverRootsAreRemoved(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	stale := filepath.Join(os.TempDir(), fmt.Sprintf("tessera-driver-dgxh100-%d-123", cmd.Process.Pid))
	if err := os.MkdirAll(filepath.Join(stale, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	lib, _ := nvmlbackend.NewMock("dgxh100", 1)
	if _, err := lib.DriverRoot(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale root of pid %d kept: %v", cmd.Process.Pid, err)
	}
}
