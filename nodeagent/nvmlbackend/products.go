package nvmlbackend

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Product is one GPU model as NVML describes it: what nvmlDeviceGetName,
// GetMemoryInfo, GetCudaComputeCapability, GetPciInfo report, and its MIG
// GPU instance profiles as nvmlDeviceGetGpuInstanceProfileInfo and
// nvmlDeviceGetGpuInstancePossiblePlacements report them.
//
// Sources, cited beside each table:
//   - NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
//     (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html):
//     profile names, fractions of memory and SMs, engines per profile,
//     number of instances, and the placement diagrams;
//   - `nvidia-smi mig -lgip` / `-lgipp` output of real GPUs published in
//     NVIDIA's own repositories (issue and pull-request descriptions named
//     beside each table): profile IDs, memory in GiB (NVML's MemorySizeMB),
//     SM, DEC, ENC, CE, JPEG and OFA counts;
//   - the total memory is what nvidia-smi prints for the GPU ("81559MiB").
//
// Memory slices: every product here has 8 memory slices and 7 compute
// slices; a placement is (start, size) in memory slices.
type Product struct {
	// Key is the product's short name ("h100-80gb").
	Key string
	// Name is nvmlDeviceGetName.
	Name         string
	Architecture nvml.DeviceArchitecture
	Brand        nvml.BrandType
	// MemoryMiB is nvmlDeviceGetMemoryInfo().Total in MiB.
	MemoryMiB            uint64
	CudaMajor, CudaMinor int
	// PCIDeviceID is nvmlPciInfo_t.pciDeviceId (device << 16 | vendor 0x10DE).
	PCIDeviceID uint32
	// SMs of the whole GPU with MIG mode off (not an NVML query: NVML reports
	// multiprocessor counts only for MIG devices and profiles).
	SMs int
	// Profiles are the GPU instance profiles, each with one full compute
	// instance profile and its compute instance subdivisions derived from it.
	Profiles []Profile
	// ResetFreeMIGChange says whether a MIG mode change takes effect at once
	// when no process holds the GPU (true on bare-metal A100, H100, H200 and
	// B200; in VMs the hypervisor may refuse resets, which HoldGPU models).
	ResetFreeMIGChange bool
}

// Profile is one GPU instance profile.
type Profile struct {
	// Index is the nvml.GPU_INSTANCE_PROFILE_* constant passed to
	// GetGpuInstanceProfileInfo.
	Index int
	// ID is nvmlGpuInstanceProfileInfo_t.id, the "ID" column of
	// `nvidia-smi mig -lgip` (19 for 1g.10gb): NOT the index.
	ID uint32
	// Name as nvidia-smi prints it, for comparison with discovery.
	Name string
	// ComputeSlices is nvmlGpuInstanceProfileInfo_t.sliceCount ("1g" → 1).
	ComputeSlices int
	// Instances is instanceCount: how many may exist at once.
	Instances int
	// MemoryMiB is memorySizeMB: what `-lgip` prints in GiB, times 1024.
	MemoryMiB                                         uint64
	SMs, CopyEngines, Decoders, Encoders, JPEGs, OFAs int
	// Placements in memory slices.
	Placements []nvml.GpuInstancePlacement
}

func placements(size uint32, starts ...uint32) []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, len(starts))
	for i, s := range starts {
		out[i] = nvml.GpuInstancePlacement{Start: s, Size: size}
	}
	return out
}

// The placements of the 8-memory-slice GPUs (A100, H100, H200, B200), from
// the placement diagrams of the MIG User Guide ("Supported MIG Profiles",
// A100 and H100 sections) and `nvidia-smi mig -lgipp`:
//
//	1g (and 1g+me)       {0,1,2,3,4,5,6}:1
//	1g, double memory    {0,2,4,6}:2
//	2g                   {0,2,4}:2
//	3g                   {0,4}:4
//	4g                   {0}:4
//	7g                   {0}:8
var (
	place1g   = placements(1, 0, 1, 2, 3, 4, 5, 6)
	place1g2x = placements(2, 0, 2, 4, 6)
	place2g   = placements(2, 0, 2, 4)
	place3g   = placements(4, 0, 4)
	place4g   = placements(4, 0)
	place7g   = placements(8, 0)
)

// gib converts the GiB that `nvidia-smi mig -lgip` prints to NVML's MiB.
func gib(g float64) uint64 { return uint64(g * 1024) }

// A100-SXM4-40GB. MIG User Guide, "A100 MIG Profiles" table (fractions,
// NVDEC/JPEG/OFA, copy engines, instance counts); memory, IDs and SMs from
// `nvidia-smi mig -lgip` on A100-SXM4-40GB (as in the MIG User Guide's
// "Getting Started with MIG" listing): 4.75 / 9.75 / 19.62 / 39.50 GiB,
// 14 / 28 / 42 / 56 / 98 SMs.
var a100_40gb = Product{
	Key: "a100-40gb", Name: "NVIDIA A100-SXM4-40GB", Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA,
	MemoryMiB: 40960, CudaMajor: 8, CudaMinor: 0, PCIDeviceID: 0x20B010DE, SMs: 108, ResetFreeMIGChange: true,
	Profiles: []Profile{
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ID: 19, Name: "1g.5gb", ComputeSlices: 1, Instances: 7, MemoryMiB: gib(4.75), SMs: 14, CopyEngines: 1, Decoders: 0, JPEGs: 0, OFAs: 0, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ID: 20, Name: "1g.5gb+me", ComputeSlices: 1, Instances: 1, MemoryMiB: gib(4.75), SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ID: 15, Name: "1g.10gb", ComputeSlices: 1, Instances: 4, MemoryMiB: gib(9.75), SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 0, OFAs: 0, Placements: place1g2x},
		{Index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ID: 14, Name: "2g.10gb", ComputeSlices: 2, Instances: 3, MemoryMiB: gib(9.75), SMs: 28, CopyEngines: 2, Decoders: 1, JPEGs: 0, OFAs: 0, Placements: place2g},
		{Index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ID: 9, Name: "3g.20gb", ComputeSlices: 3, Instances: 2, MemoryMiB: gib(19.625), SMs: 42, CopyEngines: 3, Decoders: 2, JPEGs: 0, OFAs: 0, Placements: place3g},
		{Index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ID: 5, Name: "4g.20gb", ComputeSlices: 4, Instances: 1, MemoryMiB: gib(19.625), SMs: 56, CopyEngines: 4, Decoders: 2, JPEGs: 0, OFAs: 0, Placements: place4g},
		{Index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ID: 0, Name: "7g.40gb", ComputeSlices: 7, Instances: 1, MemoryMiB: gib(39.5), SMs: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, Placements: place7g},
	},
}

// A100-SXM4-80GB. Same table as the 40GB product (the MIG User Guide: "For
// A100-SXM4-80GB, the profile names will change according to the memory
// proportion"); memory from `nvidia-smi mig -lgip` on A100-SXM4-80GB
// (9.50 / 19.50 / 39.25 / 78.75 GiB; the 2g.20gb MIG device reports
// 19968MiB, e.g. XuehaiPan/nvitop#8).
var a100_80gb = Product{
	Key: "a100-80gb", Name: "NVIDIA A100-SXM4-80GB", Architecture: nvml.DEVICE_ARCH_AMPERE, Brand: nvml.BRAND_NVIDIA,
	MemoryMiB: 81920, CudaMajor: 8, CudaMinor: 0, PCIDeviceID: 0x20B210DE, SMs: 108, ResetFreeMIGChange: true,
	Profiles: []Profile{
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ID: 19, Name: "1g.10gb", ComputeSlices: 1, Instances: 7, MemoryMiB: gib(9.5), SMs: 14, CopyEngines: 1, Decoders: 0, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ID: 20, Name: "1g.10gb+me", ComputeSlices: 1, Instances: 1, MemoryMiB: gib(9.5), SMs: 14, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ID: 15, Name: "1g.20gb", ComputeSlices: 1, Instances: 4, MemoryMiB: gib(19.5), SMs: 14, CopyEngines: 1, Decoders: 1, Placements: place1g2x},
		{Index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ID: 14, Name: "2g.20gb", ComputeSlices: 2, Instances: 3, MemoryMiB: gib(19.5), SMs: 28, CopyEngines: 2, Decoders: 1, Placements: place2g},
		{Index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ID: 9, Name: "3g.40gb", ComputeSlices: 3, Instances: 2, MemoryMiB: gib(39.25), SMs: 42, CopyEngines: 3, Decoders: 2, Placements: place3g},
		{Index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ID: 5, Name: "4g.40gb", ComputeSlices: 4, Instances: 1, MemoryMiB: gib(39.25), SMs: 56, CopyEngines: 4, Decoders: 2, Placements: place4g},
		{Index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ID: 0, Name: "7g.80gb", ComputeSlices: 7, Instances: 1, MemoryMiB: gib(78.75), SMs: 98, CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1, Placements: place7g},
	},
}

// H100 80GB HBM3 (SXM5). MIG User Guide, "H100 MIG Profiles" table; IDs,
// memory, SM and engine counts from `nvidia-smi mig -lgip` on H100 80GB HBM3
// (9.75 / 19.62 / 39.50 / 79.25 GiB; 16 / 26 / 32 / 60 / 64 / 132 SMs;
// 7 NVDEC, 7 JPEG, 1 OFA and 8 copy engines on 7g).
var h100_80gb = Product{
	Key: "h100-80gb", Name: "NVIDIA H100 80GB HBM3", Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA,
	MemoryMiB: 81559, CudaMajor: 9, CudaMinor: 0, PCIDeviceID: 0x233010DE, SMs: 132, ResetFreeMIGChange: true,
	Profiles: []Profile{
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ID: 19, Name: "1g.10gb", ComputeSlices: 1, Instances: 7, MemoryMiB: gib(9.75), SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ID: 20, Name: "1g.10gb+me", ComputeSlices: 1, Instances: 1, MemoryMiB: gib(9.75), SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ID: 15, Name: "1g.20gb", ComputeSlices: 1, Instances: 4, MemoryMiB: gib(19.625), SMs: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: place1g2x},
		{Index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ID: 14, Name: "2g.20gb", ComputeSlices: 2, Instances: 3, MemoryMiB: gib(19.625), SMs: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, Placements: place2g},
		{Index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ID: 9, Name: "3g.40gb", ComputeSlices: 3, Instances: 2, MemoryMiB: gib(39.5), SMs: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, Placements: place3g},
		{Index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ID: 5, Name: "4g.40gb", ComputeSlices: 4, Instances: 1, MemoryMiB: gib(39.5), SMs: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, Placements: place4g},
		{Index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ID: 0, Name: "7g.80gb", ComputeSlices: 7, Instances: 1, MemoryMiB: gib(79.25), SMs: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: place7g},
	},
}

// H200 (SXM5, 141GB). MIG User Guide, "H200 MIG Profiles"; `nvidia-smi mig
// -lgip` on H200 from NVIDIA/mig-parted#120 ("Add support for the NVIDIA
// H200 GPU"): 16.00 / 32.25 / 69.50 / 139.75 GiB, 16 / 26 / 32 / 60 / 64 /
// 132 SMs, 7g with 8 CE, 7 DEC, 7 JPEG, 1 OFA.
var h200_141gb = Product{
	Key: "h200-141gb", Name: "NVIDIA H200", Architecture: nvml.DEVICE_ARCH_HOPPER, Brand: nvml.BRAND_NVIDIA,
	MemoryMiB: 143771, CudaMajor: 9, CudaMinor: 0, PCIDeviceID: 0x233510DE, SMs: 132, ResetFreeMIGChange: true,
	Profiles: []Profile{
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ID: 19, Name: "1g.18gb", ComputeSlices: 1, Instances: 7, MemoryMiB: gib(16), SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ID: 20, Name: "1g.18gb+me", ComputeSlices: 1, Instances: 1, MemoryMiB: gib(16), SMs: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ID: 15, Name: "1g.35gb", ComputeSlices: 1, Instances: 4, MemoryMiB: gib(32.25), SMs: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, Placements: place1g2x},
		{Index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ID: 14, Name: "2g.35gb", ComputeSlices: 2, Instances: 3, MemoryMiB: gib(32.25), SMs: 32, CopyEngines: 2, Decoders: 2, JPEGs: 2, Placements: place2g},
		{Index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ID: 9, Name: "3g.71gb", ComputeSlices: 3, Instances: 2, MemoryMiB: gib(69.5), SMs: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, Placements: place3g},
		{Index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ID: 5, Name: "4g.71gb", ComputeSlices: 4, Instances: 1, MemoryMiB: gib(69.5), SMs: 64, CopyEngines: 4, Decoders: 4, JPEGs: 4, Placements: place4g},
		{Index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ID: 0, Name: "7g.141gb", ComputeSlices: 7, Instances: 1, MemoryMiB: gib(139.75), SMs: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: place7g},
	},
}

// B200 (180GB). MIG User Guide, "B200 MIG Profiles" (profile set and
// fractions); `nvidia-smi mig -lgip` on B200 from NVIDIA/mig-parted#166 and
// #187 / NVIDIA/gpu-operator#1351 (20.50 / 44.25 GiB, 18 / 30 / 36 SMs, 2 /
// 2 / 4 copy engines for 1g / 1g.45gb / 2g) and a published B200 listing
// for the larger profiles (3g.90gb 70 SMs, 4g.90gb 72 SMs, 89.00 GiB;
// 7g.180gb 148 SMs, 178.50 GiB). Engine counts of 3g, 4g and 7g are not in
// those excerpts; they follow the per-slice pattern of the smaller profiles
// (DEC and JPEG per compute slice, two copy engines per compute slice, one
// OFA on 7g) and are marked derived here.
var b200_180gb = Product{
	Key: "b200-180gb", Name: "NVIDIA B200", Architecture: nvml.DEVICE_ARCH_BLACKWELL, Brand: nvml.BRAND_NVIDIA,
	MemoryMiB: 183359, CudaMajor: 10, CudaMinor: 0, PCIDeviceID: 0x290110DE, SMs: 148, ResetFreeMIGChange: true,
	Profiles: []Profile{
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ID: 19, Name: "1g.23gb", ComputeSlices: 1, Instances: 7, MemoryMiB: gib(20.5), SMs: 18, CopyEngines: 2, Decoders: 1, JPEGs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ID: 20, Name: "1g.23gb+me", ComputeSlices: 1, Instances: 1, MemoryMiB: gib(20.5), SMs: 18, CopyEngines: 2, Decoders: 1, JPEGs: 1, OFAs: 1, Placements: place1g},
		{Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ID: 15, Name: "1g.45gb", ComputeSlices: 1, Instances: 4, MemoryMiB: gib(44.25), SMs: 30, CopyEngines: 2, Decoders: 1, JPEGs: 1, Placements: place1g2x},
		{Index: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ID: 14, Name: "2g.45gb", ComputeSlices: 2, Instances: 3, MemoryMiB: gib(44.25), SMs: 36, CopyEngines: 4, Decoders: 2, JPEGs: 2, Placements: place2g},
		// derived engine counts (see above)
		{Index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ID: 9, Name: "3g.90gb", ComputeSlices: 3, Instances: 2, MemoryMiB: gib(89), SMs: 70, CopyEngines: 6, Decoders: 3, JPEGs: 3, Placements: place3g},
		{Index: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ID: 5, Name: "4g.90gb", ComputeSlices: 4, Instances: 1, MemoryMiB: gib(89), SMs: 72, CopyEngines: 8, Decoders: 4, JPEGs: 4, Placements: place4g},
		{Index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ID: 0, Name: "7g.180gb", ComputeSlices: 7, Instances: 1, MemoryMiB: gib(178.5), SMs: 148, CopyEngines: 14, Decoders: 7, JPEGs: 7, OFAs: 1, Placements: place7g},
	},
}

// L40S (48GB, Ada): a GPU without MIG (GetMigMode answers
// ERROR_NOT_SUPPORTED), for nodes that mix MIG-capable and other GPUs.
// Name, memory and SMs as nvidia-smi and the L40S datasheet give them.
var l40s_48gb = Product{
	Key: "l40s-48gb", Name: "NVIDIA L40S", Architecture: nvml.DEVICE_ARCH_ADA, Brand: nvml.BRAND_NVIDIA,
	MemoryMiB: 46068, CudaMajor: 8, CudaMinor: 9, PCIDeviceID: 0x26B910DE, SMs: 142,
}

// Products lists every modelled product by key.
var Products = map[string]*Product{
	a100_40gb.Key:  &a100_40gb,
	a100_80gb.Key:  &a100_80gb,
	h100_80gb.Key:  &h100_80gb,
	h200_141gb.Key: &h200_141gb,
	b200_180gb.Key: &b200_180gb,
	l40s_48gb.Key:  &l40s_48gb,
}

// ProductByName returns the modelled product with this NVML device name.
func ProductByName(name string) (*Product, bool) {
	for _, p := range Products {
		if p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// MemorySlices is the number of MIG memory slices of the product.
func (p *Product) MemorySlices() int {
	n := 0
	for _, pr := range p.Profiles {
		for _, pl := range pr.Placements {
			n = max(n, int(pl.Start+pl.Size))
		}
	}
	return n
}

// Profile returns the profile with this index.
func (p *Product) Profile(index int) (*Profile, bool) {
	for i := range p.Profiles {
		if p.Profiles[i].Index == index {
			return &p.Profiles[i], true
		}
	}
	return nil, false
}

// PlacementCount is the number of (profile, placement) pairs: the MIG
// devices a dynamic-MIG GPU of this product publishes.
func (p *Product) PlacementCount() int {
	n := 0
	for _, pr := range p.Profiles {
		n += len(pr.Placements)
	}
	return n
}

func (pr *Profile) info() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id:                  pr.ID,
		IsP2pSupported:      0, // "P2P: No" for every profile in -lgip
		SliceCount:          uint32(pr.ComputeSlices),
		InstanceCount:       uint32(pr.Instances),
		MultiprocessorCount: uint32(pr.SMs),
		CopyEngineCount:     uint32(pr.CopyEngines),
		DecoderCount:        uint32(pr.Decoders),
		EncoderCount:        uint32(pr.Encoders),
		JpegCount:           uint32(pr.JPEGs),
		OfaCount:            uint32(pr.OFAs),
		MemorySizeMB:        pr.MemoryMiB,
	}
}

// computeProfile is one compute instance profile inside a GPU instance.
type computeProfile struct {
	index  int // nvml.COMPUTE_INSTANCE_PROFILE_*
	slices int
	count  int
	sms    int
}

// ciIndex maps compute slices to the nvml.COMPUTE_INSTANCE_PROFILE_* index.
var ciIndex = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// subdivisions are the compute instance sizes a GPU instance of g compute
// slices offers (`nvidia-smi mig -lcip`): 7g → 1c, 2c, 3c, 4c, 7c; 4g → 1c,
// 2c, 4c; 3g → 1c, 2c, 3c; 2g → 1c, 2c; 1g → 1c.
var subdivisions = map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 7: {1, 2, 3, 4, 7}}

// computeProfiles are the compute instance profiles of a GPU instance of
// this profile. SMs of a partial compute instance are the GPU instance's SMs
// pro rata (an approximation: tessera creates full compute instances only).
func (pr *Profile) computeProfiles() []computeProfile {
	var out []computeProfile
	for _, s := range subdivisions[pr.ComputeSlices] {
		sms := pr.SMs * s / pr.ComputeSlices
		out = append(out, computeProfile{index: ciIndex[s], slices: s, count: pr.ComputeSlices / s, sms: sms})
	}
	return out
}

func (pr *Profile) computeProfile(index int) (computeProfile, bool) {
	for _, c := range pr.computeProfiles() {
		if c.index == index {
			return c, true
		}
	}
	return computeProfile{}, false
}

func (p *Product) String() string { return fmt.Sprintf("%s (%s)", p.Name, p.Key) }

// ProfileNames are the names of the product's profiles, sorted.
func (p *Product) ProfileNames() []string {
	out := make([]string, 0, len(p.Profiles))
	for _, pr := range p.Profiles {
		out = append(out, pr.Name)
	}
	sort.Strings(out)
	return out
}
