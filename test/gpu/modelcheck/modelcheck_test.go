package modelcheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// TestModelsMatchThemselves: every mock machine, asked through NVML as the
// check asks a real GPU, matches its product's table, with MIG mode off and
// on; and the check changes nothing.
func TestModelsMatchThemselves(t *testing.T) {
	for _, machine := range nvmlbackend.MockMachines() {
		t.Run(machine, func(t *testing.T) {
			lib, _ := nvmlbackend.NewMock(machine, 2)
			gpu := lib.GPUs()[1]
			_ = gpu.EnableMIG()
			product, _ := nvmlbackend.MachineProduct(machine)
			in, err := gpu.CreateInstance(product.Profiles[4].Name, 0) // 3g at 0
			if err != nil {
				t.Fatal(err)
			}
			reports, err := Check(lib)
			if err != nil {
				t.Fatal(err)
			}
			if len(reports) != 2 {
				t.Fatalf("%d reports", len(reports))
			}
			for _, r := range reports {
				if !r.OK() {
					t.Errorf("%s", r)
				}
			}
			if reports[0].MIGMode != "off/off" || reports[1].MIGMode != "on/on" || len(reports[0].Notes) != 1 {
				t.Errorf("MIG modes %s, %s; notes %v", reports[0].MIGMode, reports[1].MIGMode, reports[0].Notes)
			}
			// Read-only: MIG modes and instances are as they were.
			if lib.GPUs()[0].MIGMode().Current || !gpu.MIGMode().Current || fmt.Sprint(gpu.Instances()) != fmt.Sprint([]nvmlbackend.Instance{in}) {
				t.Fatalf("the check changed the GPUs: %+v %+v %v", lib.GPUs()[0].MIGMode(), gpu.MIGMode(), gpu.Instances())
			}
		})
	}
}

// wrongGPU answers as go-nvml v0.13.4-1's mock H100 did: 3g placements of
// size 3, and 1g.20gb at seven places of size 1.
type wrongGPU struct{ *nvmlbackend.GPU }

func (w wrongGPU) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	switch info.Id {
	case 9: // 3g
		return []nvml.GpuInstancePlacement{{Start: 0, Size: 3}, {Start: 4, Size: 3}}, nvml.SUCCESS
	case 15: // 1g.20gb
		var out []nvml.GpuInstancePlacement
		for s := uint32(0); s < 7; s++ {
			out = append(out, nvml.GpuInstancePlacement{Start: s, Size: 1})
		}
		return out, nvml.SUCCESS
	}
	return w.GPU.GetGpuInstancePossiblePlacements(info)
}

func (w wrongGPU) GetGpuInstanceProfileInfo(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	info, ret := w.GPU.GetGpuInstanceProfileInfo(index)
	if index == nvml.GPU_INSTANCE_PROFILE_7_SLICE {
		info.MultiprocessorCount = 112
	}
	return info, ret
}

// TestDifferencesAreReported: a GPU that answers otherwise than the model
// (here the old mock's geometry) is reported with each difference.
func TestDifferencesAreReported(t *testing.T) {
	lib, _ := nvmlbackend.NewMock("dgxh100", 1)
	r := CheckGPU(lib, 0, wrongGPU{lib.GPUs()[0]})
	if r.OK() {
		t.Fatal("the old mock's geometry matches the model")
	}
	all := strings.Join(r.Differences, "\n")
	for _, want := range []string{
		"3g.40gb: placements {0:3 4:3}, model {0:4 4:4}",
		"1g.20gb: placements {0:1 1:1 2:1 3:1 4:1 5:1 6:1}, model {0:2 2:2 4:2 6:2}",
		"7g.80gb: 112 SMs, model 132",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("differences lack %q:\n%s", want, all)
		}
	}
	if len(r.Differences) != 3 {
		t.Errorf("%d differences, want 3:\n%s", len(r.Differences), all)
	}
	unknown, _ := nvmlbackend.NewMockProducts("550.54.15", 12040, "l40s-48gb")
	if r := CheckGPU(unknown, 0, unknown.GPUs()[0]); !r.OK() || r.MIGMode != "not supported" {
		t.Errorf("L40S: %s", r)
	}
}
