package discovery_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

func TestDiscoverMocks(t *testing.T) {
	for _, machine := range nvmlbackend.MockMachines() {
		t.Run(machine, func(t *testing.T) {
			lib, err := nvmlbackend.Open("mock:" + machine + "?gpus=2")
			if err != nil {
				t.Fatal(err)
			}
			node, err := discovery.Discover(context.Background(), lib)
			if err != nil {
				t.Fatal(err)
			}
			if len(node.GPUs) != 2 {
				t.Fatalf("got %d GPUs, want 2", len(node.GPUs))
			}
			for _, g := range node.GPUs {
				if g.UUID == "" || g.ProductName == "" || g.MemoryBytes == 0 || g.Multiprocessors == 0 || g.PCIBusID == "" {
					t.Errorf("GPU %d lacks basic attributes: %+v", g.Index, g)
				}
				if !g.MigCapable || g.MigEnabled {
					t.Errorf("GPU %d: MIG capable=%v enabled=%v, want capable and disabled", g.Index, g.MigCapable, g.MigEnabled)
				}
				// Every profile NVML reports (that go-nvlib can name) is there
				// with exactly NVML's placements.
				dev, _ := lib.DeviceGetHandleByIndex(g.Index)
				want := 0
				for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
					info, ret := dev.GetGpuInstanceProfileInfo(id)
					if ret != nvml.SUCCESS {
						continue
					}
					want++
					pls, _ := dev.GetGpuInstancePossiblePlacements(&info)
					var got *discovery.MigProfile
					for i := range g.MigProfiles {
						if g.MigProfiles[i].GIProfileID == id {
							got = &g.MigProfiles[i]
						}
					}
					if got == nil {
						t.Errorf("GPU %d: profile ID %d missing", g.Index, id)
						continue
					}
					if len(got.Placements) != len(pls) {
						t.Errorf("GPU %d profile %s: %d placements, NVML has %d", g.Index, got.Name, len(got.Placements), len(pls))
					}
					if got.MemoryBytes != info.MemorySizeMB<<20 || got.Slices != int(info.SliceCount) {
						t.Errorf("GPU %d profile %s: memory %d slices %d, NVML %d MiB %d", g.Index, got.Name, got.MemoryBytes, got.Slices, info.MemorySizeMB, info.SliceCount)
					}
				}
				if len(g.MigProfiles) != want {
					t.Errorf("GPU %d: %d profiles, NVML reports %d", g.Index, len(g.MigProfiles), want)
				}
				// The names are nvidia-smi's, as the product table gives them.
				product, _ := nvmlbackend.MachineProduct(machine)
				names := g.ProfileNames()
				slices.Sort(names)
				if !slices.Equal(names, product.ProfileNames()) {
					t.Errorf("GPU %d: profile names %v, want %v", g.Index, names, product.ProfileNames())
				}
				for _, p := range g.MigProfiles {
					for _, pl := range p.Placements {
						if pl.Start+pl.Size > g.MemorySlices {
							t.Errorf("GPU %d: placement %+v of %s beyond %d memory slices", g.Index, pl, p.Name, g.MemorySlices)
						}
					}
				}
			}
		})
	}
}

func TestDiscoverInstancesAndLookup(t *testing.T) {
	ctx := context.Background()
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=1")
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := lib.DeviceGetHandleByIndex(0)
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	giInfo, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	pls, _ := dev.GetGpuInstancePossiblePlacements(&giInfo)
	last := pls[len(pls)-1]
	gi, ret := dev.CreateGpuInstanceWithPlacement(&giInfo, &last)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	// The mock now refuses an overlapping placement, as NVML does.
	info1, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info1, &nvml.GpuInstancePlacement{Start: last.Start + 1, Size: 1}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("overlapping placement: got %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	node, err := discovery.Discover(ctx, lib)
	if err != nil {
		t.Fatal(err)
	}
	g := node.GPUs[0]
	if !g.MigEnabled || len(g.MigInstances) != 1 {
		t.Fatalf("want MIG enabled with one instance, got enabled=%v %+v", g.MigEnabled, g.MigInstances)
	}
	inst := g.MigInstances[0]
	if inst.Profile != "3g.40gb" || inst.Placement != (discovery.Placement{Start: int(last.Start), Size: int(last.Size)}) || inst.UUID == "" {
		t.Fatalf("unexpected instance %+v", inst)
	}
	// go-nvlib sees the same MIG device through the filled-in handles.
	migs, err := nvdev.New(lib).GetMigDevices()
	if err != nil || len(migs) != 1 {
		t.Fatalf("go-nvlib GetMigDevices: %v, %d devices", err, len(migs))
	}
	if id, _ := migs[0].GetUUID(); id != inst.UUID {
		t.Fatalf("go-nvlib MIG UUID %q, discovery %q", id, inst.UUID)
	}

	if id, err := discovery.MigDeviceUUID(lib, dev, inst.GIID, inst.CIID); err != nil || id != inst.UUID {
		t.Fatalf("MigDeviceUUID = %q, %v; want %q", id, err, inst.UUID)
	}
	if _, err := discovery.MigDeviceUUID(lib, dev, inst.GIID+1, 0); err == nil {
		t.Fatal("MigDeviceUUID of a missing instance succeeded")
	}

	target, err := node.Lookup(devicename.MIG(g.Minor, "3g.40gb", int(last.Start)))
	if err != nil {
		t.Fatal(err)
	}
	if target.GPU.UUID != g.UUID || target.Profile.GIProfileID != nvml.GPU_INSTANCE_PROFILE_3_SLICE || target.Placement.Size != int(last.Size) || target.Instance == nil || target.Instance.UUID != inst.UUID {
		t.Fatalf("lookup: %+v", target)
	}
	if _, err := node.Lookup(devicename.MIG(g.Minor, "3g.40gb", 1)); err == nil {
		t.Fatal("lookup of a placement NVML does not offer succeeded")
	}
	if _, err := node.Lookup("gpu-9"); err == nil {
		t.Fatal("lookup of a missing GPU succeeded")
	}
}

func TestSemVer(t *testing.T) {
	for in, want := range map[string]string{"550.54.15": "550.54.15", "535.104.05": "535.104.5", "9.0": "9.0.0", "12": "12.0.0", "x": "0.0.0"} {
		if got := discovery.SemVer(in); got != want {
			t.Errorf("SemVer(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPartialComputeInstance(t *testing.T) {
	lib, err := nvmlbackend.Open("mock:dgxa100?gpus=1")
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := lib.DeviceGetHandleByIndex(0)
	dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 4})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	node, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatal(err)
	}
	in := node.GPUs[0].MigInstances
	if len(in) != 1 || in[0].Profile != "1c.3g.20gb" {
		t.Fatalf("instances %+v, want one 1c.3g.20gb", in)
	}
	target, err := node.Lookup(devicename.MIG(0, "1c.3g.20gb", 0))
	if err != nil {
		t.Fatal(err)
	}
	if target.Instance == nil || target.Profile == nil || target.Profile.Name != "3g.20gb" {
		t.Fatalf("lookup %+v", target)
	}
}

// TestLostGPUIsIsolated: a GPU that fell off the bus is reported
// unavailable; the others are discovered as usual.
func TestLostGPUIsIsolated(t *testing.T) {
	lib, err := nvmlbackend.NewMock("dgxh100", 8)
	if err != nil {
		t.Fatal(err)
	}
	lost := lib.GPUs()[5]
	if err := lib.SetLost(lost.UUID, true); err != nil {
		t.Fatal(err)
	}
	node, err := discovery.Discover(context.Background(), lib)
	if err != nil {
		t.Fatalf("one lost GPU failed discovery of the node: %v", err)
	}
	if len(node.GPUs) != 7 || len(node.Unavailable) != 1 || node.Unavailable[0].Index != 5 {
		t.Fatalf("%d GPUs, unavailable %+v; want 7 and GPU 5", len(node.GPUs), node.Unavailable)
	}
	if !strings.Contains(node.Unavailable[0].Err.Error(), "ERROR_GPU_IS_LOST") {
		t.Fatalf("reason %v", node.Unavailable[0].Err)
	}
	if _, ok := node.GPUByUUID(lost.UUID); ok {
		t.Fatal("the lost GPU is discovered")
	}
}

// TestPCIeRoot: the PCIe root complex of each GPU comes from sysfs.
func TestPCIeRoot(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 2)
	root, err := lib.DriverRoot()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	node, err := discovery.DiscoverWith(context.Background(), lib, discovery.Options{SysRoot: filepath.Join(root, "sys")})
	if err != nil {
		t.Fatal(err)
	}
	if node.GPUs[0].PCIBusID != "0000:18:00.0" || node.GPUs[0].PCIeRoot != "pci0000:15" || node.GPUs[1].PCIeRoot != "pci0000:27" {
		t.Fatalf("bus %s root %s / %s", node.GPUs[0].PCIBusID, node.GPUs[0].PCIeRoot, node.GPUs[1].PCIeRoot)
	}
}
