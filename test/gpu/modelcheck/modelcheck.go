// Package modelcheck compares what a GPU reports through NVML with tessera's
// model of that product (nodeagent/nvmlbackend's tables): MIG profiles by
// index and ID, names, placements, memory, SMs, engines and instance counts.
// It only reads: every call it makes is a query, so it can run on a node
// in production (test/gpu/check.sh).
package modelcheck

import (
	"fmt"
	"math"
	"slices"
	"strings"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// MemoryTolerance is how far a profile's memory may be from the model (in
// parts): drivers report slightly different sizes.
const MemoryTolerance = 0.02

// Report is the comparison of one GPU.
type Report struct {
	Index   int
	Name    string
	UUID    string
	Product string // the model's key, "" when the product is not modelled
	MIGMode string // "current/pending"
	// Differences from the model, each one line.
	Differences []string
	// Notes are facts worth recording that are no difference (e.g. whether
	// profiles are listed with MIG mode off).
	Notes []string
}

// OK says whether the GPU matches its model.
func (r Report) OK() bool { return r.Product != "" && len(r.Differences) == 0 }

func (r Report) String() string {
	var b strings.Builder
	status := "matches the model " + r.Product
	switch {
	case r.Product == "":
		status = "NOT MODELLED"
	case !r.OK():
		status = fmt.Sprintf("DIFFERS from the model %s (%d differences)", r.Product, len(r.Differences))
	}
	fmt.Fprintf(&b, "GPU %d %s (%s), MIG mode %s: %s\n", r.Index, r.Name, r.UUID, r.MIGMode, status)
	for _, d := range r.Differences {
		fmt.Fprintf(&b, "  - %s\n", d)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}

// Check compares every GPU of lib with its model. A GPU that does not answer
// is reported, never a reason to stop.
func Check(lib nvml.Interface) ([]Report, error) {
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %w", ret)
	}
	var out []Report
	for i := 0; i < n; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			out = append(out, Report{Index: i, Differences: []string{"does not answer: " + ret.Error()}})
			continue
		}
		out = append(out, CheckGPU(lib, i, dev))
	}
	return out, nil
}

// CheckGPU compares one GPU with the model of its product.
func CheckGPU(lib nvml.Interface, index int, dev nvml.Device) Report {
	r := Report{Index: index}
	r.Name, _ = dev.GetName()
	r.UUID, _ = dev.GetUUID()
	p, ok := nvmlbackend.ProductByName(r.Name)
	if !ok {
		r.Differences = append(r.Differences, fmt.Sprintf("product %q is not modelled (modelled: %s)", r.Name, modelled()))
		return r
	}
	r.Product = p.Key
	diff := func(format string, a ...any) { r.Differences = append(r.Differences, fmt.Sprintf(format, a...)) }

	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		if got := mem.Total >> 20; !near(got, p.MemoryMiB) {
			diff("total memory %d MiB, model %d MiB", got, p.MemoryMiB)
		}
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS && (major != p.CudaMajor || minor != p.CudaMinor) {
		diff("compute capability %d.%d, model %d.%d", major, minor, p.CudaMajor, p.CudaMinor)
	}
	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		r.MIGMode = "not supported"
		if len(p.Profiles) > 0 {
			diff("MIG not supported, the model has %d profiles", len(p.Profiles))
		}
		return r
	case ret != nvml.SUCCESS:
		diff("MIG mode: %v", ret)
		return r
	}
	r.MIGMode = fmt.Sprintf("%s/%s", mode(current), mode(pending))

	mem, _ := dev.GetMemoryInfo()
	devlib := nvdev.New(lib)
	seen := map[int]bool{}
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		want, modelledProfile := p.Profile(index)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			if modelledProfile {
				diff("profile index %d (%s): NVML: %v", index, want.Name, ret)
			}
			continue
		}
		if ret != nvml.SUCCESS {
			diff("profile index %d: %v", index, ret)
			continue
		}
		if !modelledProfile {
			diff("profile index %d (ID %d, %d MiB, %d SMs) is not in the model", index, info.Id, info.MemorySizeMB, info.MultiprocessorCount)
			continue
		}
		seen[index] = true
		name := fmt.Sprintf("profile index %d", index)
		if mp, err := devlib.NewMigProfile(index, fullCI(int(info.SliceCount)), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, mem.Total); err == nil {
			name = mp.String()
			if name != want.Name {
				diff("profile index %d is named %s, model %s", index, name, want.Name)
			}
		}
		if info.Id != want.ID {
			diff("%s: ID %d, model %d", name, info.Id, want.ID)
		}
		if !near(info.MemorySizeMB, want.MemoryMiB) {
			diff("%s: memory %d MiB, model %d MiB", name, info.MemorySizeMB, want.MemoryMiB)
		}
		for _, c := range []struct {
			what        string
			got, wanted int
		}{
			{"compute slices", int(info.SliceCount), want.ComputeSlices}, {"instances", int(info.InstanceCount), want.Instances},
			{"SMs", int(info.MultiprocessorCount), want.SMs}, {"copy engines", int(info.CopyEngineCount), want.CopyEngines},
			{"decoders", int(info.DecoderCount), want.Decoders}, {"encoders", int(info.EncoderCount), want.Encoders},
			{"JPEG engines", int(info.JpegCount), want.JPEGs}, {"OFA engines", int(info.OfaCount), want.OFAs},
		} {
			if c.got != c.wanted {
				diff("%s: %d %s, model %d", name, c.got, c.what, c.wanted)
			}
		}
		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			diff("%s: placements: %v", name, ret)
			continue
		}
		if got, wanted := placements(pls), placements(want.Placements); got != wanted {
			diff("%s: placements %s, model %s", name, got, wanted)
		}
	}
	for _, pr := range p.Profiles {
		if !seen[pr.Index] && !slices.ContainsFunc(r.Differences, func(d string) bool { return strings.Contains(d, fmt.Sprintf("index %d ", pr.Index)) }) {
			diff("the model's profile %s (index %d) is not reported", pr.Name, pr.Index)
		}
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		r.Notes = append(r.Notes, "MIG mode is off and NVML still lists the GPU instance profiles and placements (tessera discovers dynamic-MIG GPUs this way)")
	}
	return r
}

func modelled() string {
	var names []string
	for _, p := range nvmlbackend.Products {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func near(got, want uint64) bool {
	return math.Abs(float64(got)-float64(want)) <= MemoryTolerance*float64(want)
}

func mode(m int) string {
	if m == nvml.DEVICE_MIG_ENABLE {
		return "on"
	}
	return "off"
}

func placements(ps []nvml.GpuInstancePlacement) string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%d:%d", p.Start, p.Size))
	}
	return "{" + strings.Join(out, " ") + "}"
}

func fullCI(slices int) int {
	return map[int]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
		4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, 8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE}[slices]
}
