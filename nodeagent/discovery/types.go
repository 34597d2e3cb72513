// Package discovery reads what a node's GPUs are and can become through NVML
// (github.com/NVIDIA/go-nvml) and go-nvlib: every GPU with the attributes it
// publishes (docs/nodeagent.md), its MIG capability and mode, the MIG profiles it supports
// with every placement NVML reports, and the MIG instances that exist now.
package discovery

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/devicename"
)

// Node is everything discovered on one node.
type Node struct {
	// DriverVersion is the NVIDIA driver version as a semantic version ("550.54.15").
	DriverVersion string
	// CUDADriverVersion is the CUDA version the driver supports ("12.4.0").
	CUDADriverVersion string
	// GPUs in NVML index order.
	GPUs []GPU
	// Unavailable are GPUs NVML counts but that did not answer (lost, or
	// failing to describe themselves); they are offered as nothing.
	Unavailable []UnavailableGPU `json:",omitempty"`
}

// UnavailableGPU is a GPU that discovery could not read.
type UnavailableGPU struct {
	Index int
	// UUID, when NVML still gave it.
	UUID string
	Err  error `json:"-"`
}

// GPU is one physical GPU.
type GPU struct {
	Index int
	Minor int
	UUID  string
	// ProductName is NVML's device name, e.g. "NVIDIA H100 80GB HBM3".
	ProductName  string
	Brand        string
	Architecture string
	// CUDAComputeCapability as a semantic version ("9.0.0").
	CUDAComputeCapability string
	MemoryBytes           uint64
	// Multiprocessors and the engine counts; zero where NVML does not report them.
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JpegEngines     int
	OfaEngines      int
	// PCIBusID ("0000:3b:00.0"), empty when NVML does not report it.
	PCIBusID string
	// PCIeRoot is the PCIe root complex ("pci0000:3a") from sysfs, empty
	// when it cannot be resolved.
	PCIeRoot string

	MigCapable bool
	MigEnabled bool
	// MemorySlices is the number of MIG memory slices (placements are in these
	// units); zero for GPUs without MIG.
	MemorySlices int
	// MigProfiles lists the GPU-instance profiles that the GPU supports, each
	// with one full-size compute instance, ordered by GPU instance profile ID.
	MigProfiles []MigProfile
	// MigInstances lists the MIG devices that exist now.
	MigInstances []MigInstance

	// Lost is set (by the node agent) for a GPU that NVML counts but that does
	// not answer: its description is the last one seen, Device is nil.
	Lost bool `json:",omitempty"`

	// Device is the NVML handle, for components that act on the GPU.
	Device nvml.Device `json:"-"`
}

// MigProfile is one GPU instance profile of a GPU.
type MigProfile struct {
	// Name as NVML tools spell it: "1g.10gb", "1g.10gb+me", "7g.80gb".
	Name string
	// GIProfileID and CIProfileID are the NVML profile IDs
	// (nvml.GPU_INSTANCE_PROFILE_*, nvml.COMPUTE_INSTANCE_PROFILE_*) to create it.
	GIProfileID int
	CIProfileID int
	// Slices is the number of compute slices ("1g" → 1).
	Slices int
	// MaxInstances is how many instances of this profile fit on the GPU at
	// once (NVML's InstanceCount).
	MaxInstances    int
	MemoryBytes     uint64
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JpegEngines     int
	OfaEngines      int
	// Placements are where NVML allows an instance of this profile, in memory slices.
	Placements []Placement
}

// Placement is a GPU instance placement in memory slices.
type Placement struct {
	Start int
	Size  int
}

// Overlaps reports whether two placements share a memory slice.
func (p Placement) Overlaps(q Placement) bool {
	return p.Start < q.Start+q.Size && q.Start < p.Start+p.Size
}

// MigInstance is an existing MIG device: a GPU instance and a compute instance.
type MigInstance struct {
	Profile     string
	GIProfileID int
	CIProfileID int
	GIID        int
	CIID        int
	Placement   Placement
	// UUID of the MIG device ("MIG-..."), empty if NVML has no handle for it.
	UUID string
}

// Profile returns the GPU's profile with this name.
func (g *GPU) Profile(name string) (*MigProfile, bool) {
	for i := range g.MigProfiles {
		if g.MigProfiles[i].Name == name {
			return &g.MigProfiles[i], true
		}
	}
	return nil, false
}

// ProfileNames lists the names of the GPU's MIG profiles.
func (g *GPU) ProfileNames() []string {
	out := make([]string, 0, len(g.MigProfiles))
	for _, p := range g.MigProfiles {
		out = append(out, p.Name)
	}
	return out
}

// GPUByMinor returns the GPU with this minor number.
func (n *Node) GPUByMinor(minor int) (*GPU, bool) {
	for i := range n.GPUs {
		if n.GPUs[i].Minor == minor {
			return &n.GPUs[i], true
		}
	}
	return nil, false
}

// GPUByUUID returns the GPU with this UUID.
func (n *Node) GPUByUUID(uuid string) (*GPU, bool) {
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			return &n.GPUs[i], true
		}
	}
	return nil, false
}

// Target is what a published device name stands for on this node.
type Target struct {
	Name devicename.Name
	GPU  *GPU
	// Profile and Placement are set for MIG devices.
	Profile   *MigProfile
	Placement Placement
	// Instance is the existing MIG instance of the name, if any (always set
	// for static MIG devices, set for a dynamic one once it was created).
	Instance *MigInstance
}

// Lookup maps a device name published by tessera back to the GPU and, for a
// MIG device, the profile and the placement (start and size) to create.
func (n *Node) Lookup(deviceName string) (Target, error) {
	name, err := devicename.Parse(deviceName)
	if err != nil {
		return Target{}, err
	}
	gpu, ok := n.GPUByMinor(name.Minor)
	if !ok {
		return Target{}, fmt.Errorf("device %q: no GPU with minor number %d on this node", deviceName, name.Minor)
	}
	t := Target{Name: name, GPU: gpu}
	if name.Kind != devicename.KindMIG {
		return t, nil
	}
	for i := range gpu.MigInstances {
		in := &gpu.MigInstances[i]
		if in.Profile == name.Profile && in.Placement.Start == name.Start {
			t.Instance, t.Placement = in, in.Placement
		}
	}
	profile, ok := gpu.Profile(name.Profile)
	if !ok && t.Instance != nil {
		// A static instance with a partial compute instance ("1c.3g.40gb"):
		// its GPU instance profile is known by ID.
		for i := range gpu.MigProfiles {
			if gpu.MigProfiles[i].GIProfileID == t.Instance.GIProfileID {
				t.Profile = &gpu.MigProfiles[i]
				return t, nil
			}
		}
	}
	if !ok {
		return Target{}, fmt.Errorf("device %q: GPU %d (%s) has no MIG profile %q", deviceName, gpu.Minor, gpu.ProductName, name.Profile)
	}
	for _, p := range profile.Placements {
		if p.Start == name.Start {
			t.Profile, t.Placement = profile, p
			return t, nil
		}
	}
	return Target{}, fmt.Errorf("device %q: profile %s has no placement starting at memory slice %d", deviceName, name.Profile, name.Start)
}
