// Package contract is the one definition of what tessera's node side publishes
// and its scheduler, overview and catalog read: the DRA driver name, the
// DeviceClasses, device types, attribute, capacity and counter names, taint
// keys, partition modes, and what a device costs in GPU units.
//
// Every part imports these names from here rather than spelling them, so the
// publishing and the reading side cannot drift apart. Attribute names follow
// NVIDIA's own DRA driver (gpu.nvidia.com) so that CEL selectors written for it
// work after the domain is changed (see docs/user-guide.md).
package contract

import (
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// DriverName is tessera's DRA driver, the domain of its DeviceClasses, and
// the API group of its opaque device configuration.
const DriverName = "gpu.tessera.dev"

// DeviceClasses published with the chart (deployments/deviceclasses).
const (
	// ClassGPU selects whole GPUs.
	ClassGPU = DriverName
	// ClassMIG selects MIG devices (dynamic or static).
	ClassMIG = "mig." + DriverName
	// ClassShared selects fractions of shared GPUs (consumable capacity).
	ClassShared = "shared." + DriverName
)

// DeviceType is the value of the AttrType attribute.
type DeviceType string

const (
	// TypeGPU is a whole GPU, allocated exclusively.
	TypeGPU DeviceType = "gpu"
	// TypeMIG is a MIG device: a GPU instance with one full compute instance.
	TypeMIG DeviceType = "mig"
	// TypeShared is a GPU shared by many claims through consumable capacity.
	TypeShared DeviceType = "shared"
)

// Device attributes. Unqualified names are in the driver's domain.
const (
	AttrType                  resourceapi.QualifiedName = "type"
	AttrUUID                  resourceapi.QualifiedName = "uuid"
	AttrProductName           resourceapi.QualifiedName = "productName"
	AttrBrand                 resourceapi.QualifiedName = "brand"
	AttrArchitecture          resourceapi.QualifiedName = "architecture"
	AttrCUDAComputeCapability resourceapi.QualifiedName = "cudaComputeCapability"
	AttrDriverVersion         resourceapi.QualifiedName = "driverVersion"
	AttrCUDADriverVersion     resourceapi.QualifiedName = "cudaDriverVersion"
	AttrIndex                 resourceapi.QualifiedName = "index"
	AttrMinor                 resourceapi.QualifiedName = "minor"
	// AttrParentUUID is the UUID of a MIG device's GPU.
	AttrParentUUID resourceapi.QualifiedName = "parentUUID"
	// AttrProfile is a MIG device's profile as NVML spells it ("1g.10gb").
	AttrProfile resourceapi.QualifiedName = "profile"
	// AttrPlacementStart and AttrPlacementSize are a static MIG device's memory-slice
	// placement (a dynamic MIG device's placement is the memory-slice counters it consumes,
	// and its name: slices.MaxDynamicMIGAttributes).
	AttrPlacementStart resourceapi.QualifiedName = "placementStart"
	AttrPlacementSize  resourceapi.QualifiedName = "placementSize"
	// AttrMultiprocessors is the SM count of a shared GPU (an attribute there, because
	// every capacity of a device that allows multiple allocations is consumable).
	AttrMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	// AttrPCIBusID is the standard Kubernetes attribute for a device's PCI address.
	AttrPCIBusID resourceapi.QualifiedName = "resource.kubernetes.io/pciBusID"
	// AttrPCIeRoot is the standard Kubernetes attribute for the PCIe root complex, so that
	// matchAttribute constraints can pair a GPU with a NIC under the same root.
	AttrPCIeRoot resourceapi.QualifiedName = "resource.kubernetes.io/pcieRoot"
)

// Device capacities.
const (
	// CapMemory is device memory in bytes; on a shared GPU it is consumable.
	CapMemory resourceapi.QualifiedName = "memory"
	// CapMultiprocessors is the SM count of a whole GPU or MIG device.
	CapMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	// CapCompute is the consumable compute share (percent, 0..100) of a shared GPU.
	CapCompute     resourceapi.QualifiedName = "compute"
	CapCopyEngines resourceapi.QualifiedName = "copyEngines"
	CapDecoders    resourceapi.QualifiedName = "decoders"
	CapEncoders    resourceapi.QualifiedName = "encoders"
	CapJPEGEngines resourceapi.QualifiedName = "jpegEngines"
	CapOFAEngines  resourceapi.QualifiedName = "ofaEngines"
)

// Taint keys of device health.
const (
	// TaintKeyXID taints the devices of a GPU with a critical XID or ECC error.
	TaintKeyXID = DriverName + "/xid"
	// TaintKeyLost taints the devices of a GPU that is gone.
	TaintKeyLost = DriverName + "/gpu-lost"
)

// memorySliceCounterPrefix names the counters of a dynamic-MIG GPU's memory slices.
const memorySliceCounterPrefix = "memory-slice-"

// MemorySliceCounter is the counter of one MIG memory slice. Every slice is a counter
// of one, so that devices whose placements overlap can never be allocated together,
// while devices on disjoint slices can.
func MemorySliceCounter(i int) string { return memorySliceCounterPrefix + strconv.Itoa(i) }

// IsMemorySliceCounter says whether a counter is one of tessera's MIG memory slices.
func IsMemorySliceCounter(name string) bool { return strings.HasPrefix(name, memorySliceCounterPrefix) }

// IsMemoryCounter says whether a counter counts GPU memory: tessera's memory slices,
// or another driver's counter with "memory" in its name.
func IsMemoryCounter(name string) bool {
	return strings.HasPrefix(name, memorySliceCounterPrefix) || strings.Contains(name, "memory") || strings.Contains(name, "Memory")
}

// Mode says how the node agent offers a GPU (its partition config).
type Mode string

const (
	// ModeWhole offers the GPU as one device, allocated exclusively.
	ModeWhole Mode = "whole"
	// ModeDynamicMIG offers the whole GPU and every (profile, placement) as
	// partitionable devices; the kubelet plugin creates the instance at prepare.
	ModeDynamicMIG Mode = "dynamicMIG"
	// ModeStaticMIG offers the MIG instances that exist (optionally created
	// from a layout by the agent).
	ModeStaticMIG Mode = "staticMIG"
	// ModeShared offers the GPU to many claims through consumable capacity.
	ModeShared Mode = "shared"
	// ModeDevicePlugin hands the GPU to the classic device plugin (extended
	// resources); it is not published through DRA.
	ModeDevicePlugin Mode = "devicePlugin"
)

// Modes lists every mode, in the order the documentation gives them.
var Modes = []Mode{ModeWhole, ModeDynamicMIG, ModeStaticMIG, ModeShared, ModeDevicePlugin}

// modeTraits is what each mode means for the other parts, in one place, so that
// no part switches over the modes itself.
var modeTraits = map[Mode]struct {
	dra      bool         // published through DRA
	mig      bool         // needs MIG mode on
	types    []DeviceType // device types published
	features []string     // DRA features the published devices need
	// migByClaims: the kubelet plugin sets MIG mode as the prepared claims
	// need it (on for a MIG device, off for the whole GPU), the agent leaves it.
	migByClaims bool
}{
	ModeWhole:        {dra: true, types: []DeviceType{TypeGPU}},
	ModeDynamicMIG:   {dra: true, mig: true, migByClaims: true, types: []DeviceType{TypeGPU, TypeMIG}, features: []string{"DRAPartitionableDevices"}},
	ModeStaticMIG:    {dra: true, mig: true, types: []DeviceType{TypeMIG}},
	ModeShared:       {dra: true, types: []DeviceType{TypeShared}, features: []string{"DRAConsumableCapacity"}},
	ModeDevicePlugin: {},
}

// Valid says whether m is a known mode.
func (m Mode) Valid() bool { _, ok := modeTraits[m]; return ok }

// PublishedThroughDRA says whether GPUs in this mode appear in ResourceSlices.
func (m Mode) PublishedThroughDRA() bool { return modeTraits[m].dra }

// NeedsMIGMode says whether GPUs in this mode run with MIG mode on.
func (m Mode) NeedsMIGMode() bool { return modeTraits[m].mig }

// MIGModeFollowsClaims says whether the GPU's MIG mode is set by the kubelet
// plugin as its prepared claims need it (a MIG device needs it on, the whole
// GPU off), rather than by the node agent from the partition config.
func (m Mode) MIGModeFollowsClaims() bool { return modeTraits[m].migByClaims }

// DeviceTypes are the device types a GPU in this mode is published as.
func (m Mode) DeviceTypes() []DeviceType { return modeTraits[m].types }

// RequiredFeatures are the DRA feature gates the mode's devices need.
func (m Mode) RequiredFeatures() []string { return modeTraits[m].features }

// ModeStrings returns the modes as strings (for validation messages).
func ModeStrings() []string {
	out := make([]string, len(Modes))
	for i, m := range Modes {
		out[i] = string(m)
	}
	return out
}
