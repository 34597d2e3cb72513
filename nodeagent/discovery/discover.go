package discovery

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/nodeagent/devicename"
)

// fullComputeInstance maps a GPU instance's compute slice count to the compute
// instance profile that spans all of it: tessera creates one such compute
// instance per GPU instance.
var fullComputeInstance = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// Options tune discovery.
type Options struct {
	// SysRoot is where sysfs is mounted (default /sys): the PCIe root
	// complex of each GPU is read from it.
	SysRoot string
}

// Discover reads every GPU of the node with the host's sysfs. It does not
// change anything.
func Discover(ctx context.Context, lib nvml.Interface) (*Node, error) {
	return DiscoverWith(ctx, lib, Options{})
}

// DiscoverWith reads every GPU of the node. A GPU that does not answer
// (ERROR_GPU_IS_LOST, XID 79) or fails to describe itself is not in GPUs but
// in Unavailable, so that one broken GPU never hides the others. It does not
// change anything.
func DiscoverWith(ctx context.Context, lib nvml.Interface, opts Options) (*Node, error) {
	logger := klog.FromContext(ctx)
	if opts.SysRoot == "" {
		opts.SysRoot = "/sys"
	}
	node := &Node{}
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("read driver version: %w", ret)
	}
	node.DriverVersion = SemVer(driver)
	cuda, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("read CUDA driver version: %w", ret)
	}
	node.CUDADriverVersion = fmt.Sprintf("%d.%d.0", cuda/1000, (cuda%1000)/10)

	devlib := nvdev.New(lib)
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count GPUs: %w", ret)
	}
	for index := 0; index < count; index++ {
		handle, ret := lib.DeviceGetHandleByIndex(index)
		if ret != nvml.SUCCESS {
			node.Unavailable = append(node.Unavailable, UnavailableGPU{Index: index, Err: fmt.Errorf("get handle: %w", ret)})
			continue
		}
		dev, err := devlib.NewDevice(handle)
		if err != nil {
			node.Unavailable = append(node.Unavailable, UnavailableGPU{Index: index, Err: err})
			continue
		}
		gpu, err := discoverGPU(ctx, devlib, index, dev)
		if err != nil {
			u := UnavailableGPU{Index: index, Err: err}
			u.UUID, _ = dev.GetUUID()
			node.Unavailable = append(node.Unavailable, u)
			continue
		}
		if gpu.PCIBusID != "" {
			attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(gpu.PCIBusID, deviceattribute.WithFSFromRoot(opts.SysRoot))
			if err == nil && attr.Value.StringValue != nil {
				gpu.PCIeRoot = *attr.Value.StringValue
			} else {
				logger.V(2).Info("PCIe root not found in sysfs", "gpu", gpu.UUID, "sysRoot", opts.SysRoot, "err", err)
			}
		}
		node.GPUs = append(node.GPUs, *gpu)
	}
	for _, u := range node.Unavailable {
		logger.Info("GPU does not answer; it is not offered", "index", u.Index, "uuid", u.UUID, "err", u.Err)
	}
	logger.V(4).Info("Discovered GPUs", "count", len(node.GPUs), "unavailable", len(node.Unavailable), "driverVersion", node.DriverVersion)
	return node, nil
}

func discoverGPU(ctx context.Context, devlib nvdev.Interface, index int, dev nvdev.Device) (*GPU, error) {
	logger := klog.FromContext(ctx)
	g := &GPU{Index: index, Device: dev}
	var ret nvml.Return
	if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("UUID: %w", ret)
	}
	if g.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("minor number: %w", ret)
	}
	if g.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("name: %w", ret)
	}
	var err error
	if g.Brand, err = dev.GetBrandAsString(); err != nil {
		return nil, err
	}
	if g.Architecture, err = dev.GetArchitectureAsString(); err != nil {
		return nil, err
	}
	cc, err := dev.GetCudaComputeCapabilityAsString()
	if err != nil {
		return nil, err
	}
	g.CUDAComputeCapability = SemVer(cc)
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("memory info: %w", ret)
	}
	g.MemoryBytes = mem.Total
	if busID, err := dev.GetPCIBusID(); err == nil {
		g.PCIBusID = busID
	} else {
		logger.V(2).Info("PCI bus ID not reported", "gpu", g.UUID, "err", err)
	}

	if g.MigCapable, err = dev.IsMigCapable(); err != nil {
		return nil, err
	}
	if g.MigCapable {
		if g.MigEnabled, err = dev.IsMigEnabled(); err != nil {
			return nil, err
		}
		if err := discoverProfiles(ctx, devlib, dev, g); err != nil {
			return nil, fmt.Errorf("MIG profiles: %w", err)
		}
	}

	if attrs, ret := dev.GetAttributes(); ret == nvml.SUCCESS {
		g.Multiprocessors = int(attrs.MultiprocessorCount)
		g.CopyEngines = int(attrs.SharedCopyEngineCount)
		g.Decoders = int(attrs.SharedDecoderCount)
		g.Encoders = int(attrs.SharedEncoderCount)
		g.JpegEngines = int(attrs.SharedJpegCount)
		g.OfaEngines = int(attrs.SharedOfaCount)
	} else if full := g.fullProfile(); full != nil {
		// A GPU without device attributes still describes itself through
		// its largest MIG profile, which spans all engines.
		g.Multiprocessors, g.CopyEngines, g.Decoders = full.Multiprocessors, full.CopyEngines, full.Decoders
		g.Encoders, g.JpegEngines, g.OfaEngines = full.Encoders, full.JpegEngines, full.OfaEngines
	}

	if g.MigEnabled {
		if err := discoverInstances(ctx, devlib, dev, g); err != nil {
			return nil, fmt.Errorf("MIG instances: %w", err)
		}
	}
	return g, nil
}

// fullProfile is the profile with the most slices (7g on A100/H100).
func (g *GPU) fullProfile() *MigProfile {
	var best *MigProfile
	for i := range g.MigProfiles {
		p := &g.MigProfiles[i]
		if best == nil || p.Slices > best.Slices || (p.Slices == best.Slices && p.Multiprocessors > best.Multiprocessors) {
			best = p
		}
	}
	return best
}

func discoverProfiles(ctx context.Context, devlib nvdev.Interface, dev nvdev.Device, g *GPU) error {
	logger := klog.FromContext(ctx)
	type candidate struct {
		profile MigProfile
		nvlib   string // go-nvlib's name (memory rounded to eighths of the GPU)
		rounded string // the same with memory rounded to whole GiB
	}
	var cands []candidate
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("profile %d: %w", id, ret)
		}
		ci, ok := fullComputeInstance[int(info.SliceCount)]
		if !ok {
			logger.V(2).Info("Skipping MIG profile with unusual slice count", "gpu", g.UUID, "profileID", id, "slices", info.SliceCount)
			continue
		}
		p, err := devlib.NewMigProfile(id, ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, g.MemoryBytes)
		if err != nil {
			// go-nvlib does not name every profile ID (e.g. 3-slice GFX); such
			// a profile cannot be requested by name, so it is not offered.
			logger.V(2).Info("Skipping MIG profile that go-nvlib cannot name", "gpu", g.UUID, "profileID", id, "err", err)
			continue
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("placements of profile %s: %w", p.String(), ret)
		}
		mp := MigProfile{
			GIProfileID:     id,
			CIProfileID:     ci,
			Slices:          int(info.SliceCount),
			MaxInstances:    int(info.InstanceCount),
			MemoryBytes:     info.MemorySizeMB * 1024 * 1024,
			Multiprocessors: int(info.MultiprocessorCount),
			CopyEngines:     int(info.CopyEngineCount),
			Decoders:        int(info.DecoderCount),
			Encoders:        int(info.EncoderCount),
			JpegEngines:     int(info.JpegCount),
			OfaEngines:      int(info.OfaCount),
		}
		for _, pl := range placements {
			mp.Placements = append(mp.Placements, Placement{Start: int(pl.Start), Size: int(pl.Size)})
			g.MemorySlices = max(g.MemorySlices, int(pl.Start+pl.Size))
		}
		gib := (info.MemorySizeMB + 512) / 1024
		rounded := strings.Replace(p.String(), fmt.Sprintf(".%dgb", p.GetInfo().GB), fmt.Sprintf(".%dgb", gib), 1)
		cands = append(cands, candidate{profile: mp, nvlib: p.String(), rounded: rounded})
	}
	// go-nvlib's names are what nvidia-smi prints on real GPUs. Where its
	// rounding makes two profiles of one GPU share a name (the mock H200 and
	// B200 report memory sizes that do), whole GiB are used for every
	// profile of that GPU so that each profile keeps a distinct name.
	unique := func(name func(candidate) string) bool {
		seen := map[string]bool{}
		for _, c := range cands {
			if seen[name(c)] {
				return false
			}
			seen[name(c)] = true
		}
		return true
	}
	name := func(c candidate) string { return c.nvlib }
	if !unique(name) {
		name = func(c candidate) string { return c.rounded }
	}
	seen := map[string]bool{}
	for _, c := range cands {
		c.profile.Name = name(c)
		if seen[c.profile.Name] {
			logger.Info("Skipping MIG profile whose name is not unique", "gpu", g.UUID, "profileID", c.profile.GIProfileID, "profile", c.profile.Name)
			continue
		}
		seen[c.profile.Name] = true
		g.MigProfiles = append(g.MigProfiles, c.profile)
	}
	return nil
}

// migProfileName names a profile of an existing instance the way
// discoverProfiles named its GPU instance profile.
func (g *GPU) migProfileName(devlib nvdev.Interface, giProfileID, ciProfileID int, memoryMB uint64) (string, error) {
	var base *MigProfile
	for i := range g.MigProfiles {
		if g.MigProfiles[i].GIProfileID == giProfileID {
			base = &g.MigProfiles[i]
		}
	}
	if base == nil {
		return "", fmt.Errorf("GPU instance profile %d is not offered", giProfileID)
	}
	if ciProfileID == base.CIProfileID {
		return base.Name, nil
	}
	p, err := devlib.NewMigProfile(giProfileID, ciProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, memoryMB, g.MemoryBytes)
	if err != nil {
		return "", err
	}
	// Keep the memory part of the GPU instance profile's name: "1c.<base>".
	info := p.GetInfo()
	return fmt.Sprintf("%dc.%s", info.C, base.Name), nil
}

func discoverInstances(ctx context.Context, devlib nvdev.Interface, dev nvdev.Device, g *GPU) error {
	logger := klog.FromContext(ctx)
	type key struct{ gi, ci int }
	uuids := map[key]string{}
	err := dev.VisitMigDevices(func(_ int, mig nvdev.MigDevice) error {
		giID, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instance ID of MIG device: %w", ret)
		}
		ciID, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("compute instance ID of MIG device: %w", ret)
		}
		id, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("UUID of MIG device: %w", ret)
		}
		uuids[key{giID, ciID}] = id
		return nil
	})
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, prof := range g.MigProfiles {
		info, ret := dev.GetGpuInstanceProfileInfo(prof.GIProfileID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("profile %s: %w", prof.Name, ret)
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instances of profile %s: %w", prof.Name, ret)
		}
		for _, gi := range gis {
			giInfo, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return fmt.Errorf("GPU instance info: %w", ret)
			}
			for ciProfile := 0; ciProfile < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; ciProfile++ {
				ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
					continue
				}
				if ret != nvml.SUCCESS {
					return fmt.Errorf("compute instance profile %d: %w", ciProfile, ret)
				}
				cis, ret := gi.GetComputeInstances(&ciInfo)
				if ret != nvml.SUCCESS {
					return fmt.Errorf("compute instances: %w", ret)
				}
				for _, ci := range cis {
					cinfo, ret := ci.GetInfo()
					if ret != nvml.SUCCESS {
						return fmt.Errorf("compute instance info: %w", ret)
					}
					name, err := g.migProfileName(devlib, prof.GIProfileID, ciProfile, info.MemorySizeMB)
					if err != nil {
						logger.Info("Ignoring MIG instance with a profile that cannot be named", "gpu", g.UUID, "gi", giInfo.Id, "ci", cinfo.Id, "err", err)
						continue
					}
					inst := MigInstance{
						Profile:     name,
						GIProfileID: prof.GIProfileID,
						CIProfileID: ciProfile,
						GIID:        int(giInfo.Id),
						CIID:        int(cinfo.Id),
						Placement:   Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
						UUID:        uuids[key{int(giInfo.Id), int(cinfo.Id)}],
					}
					dn := devicename.MIG(g.Minor, inst.Profile, inst.Placement.Start)
					if names[dn] {
						// Two compute instances of one profile in one GPU
						// instance cannot be told apart by name.
						logger.Info("Ignoring second compute instance with the same device name", "gpu", g.UUID, "device", dn, "gi", giInfo.Id, "ci", cinfo.Id)
						continue
					}
					names[dn] = true
					g.MigInstances = append(g.MigInstances, inst)
				}
			}
		}
	}
	sort.Slice(g.MigInstances, func(i, j int) bool {
		a, b := g.MigInstances[i], g.MigInstances[j]
		if a.Placement.Start != b.Placement.Start {
			return a.Placement.Start < b.Placement.Start
		}
		return a.CIID < b.CIID
	})
	return nil
}

// SemVer turns an NVIDIA version ("535.104.05", "9.0") into a valid semantic
// version ("535.104.5", "9.0.0"), as version-typed DRA attributes require.
func SemVer(v string) string {
	parts := strings.Split(strings.TrimSpace(v), ".")
	nums := []int{0, 0, 0}
	for i := 0; i < len(parts) && i < 3; i++ {
		n, err := strconv.Atoi(parts[i])
		if err != nil || n < 0 {
			return "0.0.0"
		}
		nums[i] = n
	}
	return fmt.Sprintf("%d.%d.%d", nums[0], nums[1], nums[2])
}

// MigDeviceUUID returns the UUID of the MIG device of a GPU instance and
// compute instance (the MIG-... UUID that CDI and CUDA_VISIBLE_DEVICES use),
// walking the parent GPU's MIG device handles as go-nvlib does.
func MigDeviceUUID(lib nvml.Interface, parent nvml.Device, giID, ciID int) (string, error) {
	dev, err := nvdev.New(lib).NewDevice(parent)
	if err != nil {
		return "", err
	}
	found := ""
	err = dev.VisitMigDevices(func(_ int, mig nvdev.MigDevice) error {
		g, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU instance ID: %w", ret)
		}
		c, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("compute instance ID: %w", ret)
		}
		if g == giID && c == ciID {
			id, ret := mig.GetUUID()
			if ret != nvml.SUCCESS {
				return fmt.Errorf("UUID: %w", ret)
			}
			found = id
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "", fmt.Errorf("no MIG device for GPU instance %d, compute instance %d", giID, ciID)
	}
	return found, nil
}
