package nvmlbackend_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

func TestParseSpec(t *testing.T) {
	for spec, want := range map[string]nvmlbackend.Spec{
		"nvml":                     {},
		"nvml:/opt/lib/libnvml.so": {LibraryPath: "/opt/lib/libnvml.so"},
		"mock:dgxa100":             {Mock: "dgxa100", GPUs: 8},
		"mock:dgxb200?gpus=3":      {Mock: "dgxb200", GPUs: 3},
		"mock:dgxh100?gpus=2&root=/tmp/r&control=/tmp/c.sock": {Mock: "dgxh100", GPUs: 2, DriverRoot: "/tmp/r", Control: "/tmp/c.sock"},
		"mock:dgxh100?serial=node-3":                          {Mock: "dgxh100", GPUs: 8, Serial: "node-3"},
		"mock:dgxh100?serial=node-3&state=/tmp/s.json":        {Mock: "dgxh100", GPUs: 8, Serial: "node-3", State: "/tmp/s.json"},
	} {
		got, err := nvmlbackend.ParseSpec(spec)
		if err != nil || got != want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	for spec, want := range map[string]string{
		"":                            "want",
		"cuda":                        "want",
		"mock:dgx1":                   `unknown mock machine "dgx1"`,
		"mock:dgxh100?gpus=0":         "gpus must be a number from 1 to 64",
		"mock:dgxh100?gpus=x":         "gpus must be a number",
		"mock:dgxh100?mig=1":          `unknown option "mig"`,
		"mock:dgxh100?gpus=%%":        "bad options",
		"mock:dgxh100?root=r":         "root must be an absolute path",
		"mock:dgxh100?control=c.sock": "control must be an absolute path",
		"mock:dgxh100?serial=":        "serial must not be empty",
		"mock:dgxh100?state=s.json":   "state must be an absolute path",
	} {
		if _, err := nvmlbackend.ParseSpec(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSpec(%q): %v, want an error containing %q", spec, err, want)
		}
	}
}

// TestMockSerialKeepsUUIDs: two mocks of the machine named by serial (a
// tessera-node restarted on it) have the same GPU UUIDs; another serial, or
// none, gives other GPUs.
func TestMockSerialKeepsUUIDs(t *testing.T) {
	uuids := func(spec string) []string {
		lib, err := nvmlbackend.Open(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer lib.Shutdown()
		var out []string
		for _, g := range lib.(*nvmlbackend.Mock).GPUs() {
			out = append(out, g.UUID)
		}
		return out
	}
	a, b := uuids("mock:dgxh100?gpus=2&serial=node-a"), uuids("mock:dgxh100?gpus=2&serial=node-a")
	if !slices.Equal(a, b) || a[0] == a[1] {
		t.Errorf("same serial: %v and %v, want the same two distinct UUIDs", a, b)
	}
	if c := uuids("mock:dgxh100?gpus=2&serial=node-b"); slices.Equal(a, c) {
		t.Errorf("another serial has the same UUIDs %v", c)
	}
	if d := uuids("mock:dgxh100?gpus=2"); slices.Equal(a, d) {
		t.Errorf("no serial has the same UUIDs %v", d)
	}
}

func TestRealBackendWithoutLibrary(t *testing.T) {
	_, err := nvmlbackend.Open("nvml:/nonexistent/libnvidia-ml.so.1")
	if !errors.Is(err, nvmlbackend.ErrLibraryNotFound) {
		t.Fatalf("Open: %v, want ErrLibraryNotFound", err)
	}
}

func TestMockMIGSemantics(t *testing.T) {
	lib, err := nvmlbackend.Open("mock:dgxa100?gpus=2")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := lib.DeviceGetCount(); n != 2 {
		t.Fatalf("%d GPUs, want 2", n)
	}
	dev, _ := lib.DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	p := nvml.GpuInstancePlacement{Start: 2, Size: 2}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &p); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("create without MIG mode: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 1, Size: 2}); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Fatalf("create at a placement NVML does not list: %v", ret)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &p)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &p); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("create on an occupied placement: %v", ret)
	}
	// Without a placement, the first free one is taken.
	gi2, ret := dev.CreateGpuInstance(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if i, _ := gi2.GetInfo(); i.Placement.Start != 0 {
		t.Fatalf("first free placement %+v, want start 0", i.Placement)
	}
	if n, _ := dev.GetGpuInstanceRemainingCapacity(&info); n != 1 {
		t.Fatalf("remaining 2g capacity %d, want 1 (start 4)", n)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("second full compute instance: %v", ret)
	}
	giInfo, _ := gi.GetInfo()
	if got, ret := dev.GetGpuInstanceById(int(giInfo.Id)); ret != nvml.SUCCESS || got != gi {
		t.Fatalf("GetGpuInstanceById: %v", ret)
	}
	// The MIG device handle: its own UUID, found by UUID, parent known.
	mig, ret := dev.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.GetMigDeviceHandleByIndex(1); ret != nvml.ERROR_NOT_FOUND {
		t.Fatalf("second MIG device: %v, want ERROR_NOT_FOUND", ret)
	}
	uuid, _ := mig.GetUUID()
	if byUUID, ret := lib.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS || byUUID != mig {
		t.Fatalf("handle by MIG UUID: %v", ret)
	}
	if parent, _ := mig.GetDeviceHandleFromMigDeviceHandle(); parent != dev {
		t.Fatal("wrong parent")
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Fatalf("destroy GPU instance with a compute instance: %v, want ERROR_IN_USE", ret)
	}
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Fatalf("disable MIG with instances: %v, want ERROR_IN_USE", ret)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := lib.DeviceGetHandleByUUID(uuid); ret == nvml.SUCCESS {
		t.Fatal("MIG device still found after its compute instance was destroyed")
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi2.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	// PCI bus IDs are filled in.
	pci, _ := dev.GetPciInfo()
	if pci.BusId[0] == 0 {
		t.Fatal("empty PCI bus ID")
	}
}

func TestMockEvents(t *testing.T) {
	mock, err := nvmlbackend.NewMock("dgxh200", 1)
	if err != nil {
		t.Fatal(err)
	}
	gpu := mock.GPUs()[0]
	if err := mock.InjectXID(gpu.UUID, 48); err == nil {
		t.Fatal("injection without a registered event set succeeded")
	}
	set, _ := mock.EventSetCreate()
	if ret := gpu.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := mock.InjectECC(gpu.UUID, true); err == nil {
		t.Fatal("ECC delivered to a set registered for XIDs only")
	}
	if err := mock.InjectXID(gpu.UUID, 48); err != nil {
		t.Fatal(err)
	}
	ev, ret := set.Wait(1000)
	if ret != nvml.SUCCESS || ev.EventType != nvml.EventTypeXidCriticalError || ev.EventData != 48 || ev.Device != gpu {
		t.Fatalf("Wait: %+v %v", ev, ret)
	}
	if _, ret := set.Wait(10); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("empty Wait: %v", ret)
	}
	if err := mock.InjectXID("GPU-missing", 48); err == nil {
		t.Fatal("injection into a missing GPU succeeded")
	}
	set.Free()
	if err := mock.InjectXID(gpu.UUID, 48); err == nil {
		t.Fatal("injection after Free succeeded")
	}
}
