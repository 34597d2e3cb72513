// Package v1alpha1 holds the opaque device configuration of the
// gpu.tessera.dev DRA driver: GpuConfig for whole and shared GPUs and
// MigDeviceConfig for MIG devices. Claims and DeviceClasses carry these
// objects in spec.devices.config[].opaque.parameters; the kubelet plugin
// decodes them strictly, applies defaults and validates them at prepare.
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tessera-gpu/tessera/contract"
)

const (
	// GroupName is the API group of the opaque configuration and also the
	// DRA driver name under which it appears in claims.
	GroupName = contract.DriverName
	// Version is the only served version.
	Version = "v1alpha1"

	// GpuConfigKind configures whole GPUs and fractional GPU shares.
	GpuConfigKind = "GpuConfig"
	// MigDeviceConfigKind configures MIG devices.
	MigDeviceConfigKind = "MigDeviceConfig"
)

// SchemeGroupVersion is gpu.tessera.dev/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// SharingStrategy says how the processes that use one device share it.
type SharingStrategy string

const (
	// TimeSlicingStrategy shares a GPU in time; nothing limits memory.
	TimeSlicingStrategy SharingStrategy = "TimeSlicing"
	// MPSStrategy shares a GPU through the CUDA Multi-Process Service with
	// an enforced pinned device memory limit and active thread percentage.
	MPSStrategy SharingStrategy = "MPS"
)

// TimeSliceInterval is the scheduling time slice of a time-shared GPU.
type TimeSliceInterval string

const (
	DefaultTimeSlice TimeSliceInterval = "Default"
	ShortTimeSlice   TimeSliceInterval = "Short"
	MediumTimeSlice  TimeSliceInterval = "Medium"
	LongTimeSlice    TimeSliceInterval = "Long"
)

// GpuConfig is the opaque configuration of a whole GPU or of a fractional
// share of one.
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing selects how the processes that use the device share it.
	// Unset means: exclusive for a whole GPU, MPS for a fractional share.
	Sharing *GpuSharing `json:"sharing,omitempty"`
}

// MigDeviceConfig is the opaque configuration of a MIG device.
type MigDeviceConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing selects how the containers of a claim share the MIG device.
	// MIG devices support MPS only: the GPU time slice is a property of the
	// parent GPU and cannot be set per MIG device.
	Sharing *MigSharing `json:"sharing,omitempty"`
}

// GpuSharing configures sharing of a whole GPU or a share of one.
type GpuSharing struct {
	// Strategy is TimeSlicing or MPS.
	Strategy SharingStrategy `json:"strategy"`
	// TimeSlicing is only allowed with strategy TimeSlicing.
	TimeSlicing *TimeSlicingConfig `json:"timeSlicing,omitempty"`
	// MPS is only allowed with strategy MPS.
	MPS *MPSConfig `json:"mps,omitempty"`
}

// MigSharing configures sharing of a MIG device.
type MigSharing struct {
	// Strategy must be MPS.
	Strategy SharingStrategy `json:"strategy"`
	// MPS holds the limits for MPS clients.
	MPS *MPSConfig `json:"mps,omitempty"`
}

// TimeSlicingConfig configures time-slicing.
type TimeSlicingConfig struct {
	// Interval is Default, Short, Medium or Long (default: Default).
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// MPSConfig limits the MPS clients of a claim. For a fractional share the
// limits default to what the allocation consumed and may only lower it.
// The limits are set on the claim's own MPS control daemon, not in the
// clients' environment.
type MPSConfig struct {
	// ActiveThreadPercentage is the share of the device's SMs, 1..100.
	ActiveThreadPercentage *int32 `json:"activeThreadPercentage,omitempty"`
	// PinnedDeviceMemoryLimit limits device memory per client, at least 1Mi.
	PinnedDeviceMemoryLimit *resource.Quantity `json:"pinnedDeviceMemoryLimit,omitempty"`
	// SMPartition asks for a hard compute fraction: a static SM partition
	// (MPS static partitioning, CUDA 13.1 and later) of the compute share's
	// part of the device's SM chunks, instead of an active thread
	// percentage. Required fails the prepare where MPS cannot do it;
	// Preferred falls back to the thread percentage and says so in the
	// claim's status and an Event. Unset: the thread percentage.
	SMPartition *SMPartitionPolicy `json:"smPartition,omitempty"`
}

// SMPartitionPolicy says whether a static SM partition is required.
type SMPartitionPolicy string

const (
	SMPartitionRequired  SMPartitionPolicy = "Required"
	SMPartitionPreferred SMPartitionPolicy = "Preferred"
)

// SharingStatusKind is the kind of the data the plugin writes into a
// claim's status.devices[].data for each shared device.
const SharingStatusKind = "SharingStatus"

// SharingStatus is what the plugin applied to one device of a claim, in
// status.devices[].data (kubectl describe resourceclaim shows it): the
// strategy, each limit with how it is enforced, and what is not enforced.
type SharingStatus struct {
	metav1.TypeMeta `json:",inline"`

	// Strategy is MPS or TimeSlicing.
	Strategy SharingStrategy `json:"strategy"`
	// MPS is set for a device served by the claim's MPS control daemon.
	MPS *MPSStatus `json:"mps,omitempty"`
	// TimeSlicing is set for a time-sliced GPU.
	TimeSlicing *TimeSlicingStatus `json:"timeSlicing,omitempty"`
	// NotEnforced lists what the allocation accounts for but nothing on
	// the node limits, with the reason.
	NotEnforced []string `json:"notEnforced,omitempty"`
}

// MPSStatus is the claim's MPS daemon as it serves one device.
type MPSStatus struct {
	// Daemon is where the claim's control daemon runs ("pod
	// tessera/tessera-mps-<claim UID>" or "process").
	Daemon string `json:"daemon"`
	// DeviceOrdinal is the device's CUDA ordinal in the claim's containers.
	DeviceOrdinal int `json:"deviceOrdinal"`
	// PinnedDeviceMemoryLimit is the daemon's limit for the device.
	PinnedDeviceMemoryLimit *resource.Quantity `json:"pinnedDeviceMemoryLimit,omitempty"`
	// ActiveThreadPercentage is the daemon's default for its clients.
	ActiveThreadPercentage *int32 `json:"activeThreadPercentage,omitempty"`
	// SMPartition is the device's static SM partition.
	SMPartition *SMPartitionStatus `json:"smPartition,omitempty"`
	// ComputeMode is the GPU's compute mode when the plugin set it
	// (EXCLUSIVE_PROCESS for an MPS whole GPU).
	ComputeMode string `json:"computeMode,omitempty"`
	// MPSVersion is the installed nvidia-cuda-mps-control version (0:
	// unknown).
	MPSVersion int `json:"mpsVersion,omitempty"`
}

// SMPartitionStatus is a static SM partition.
type SMPartitionStatus struct {
	ID     string `json:"id"`
	Chunks int    `json:"chunks"`
}

// TimeSlicingStatus is a time-sliced GPU.
type TimeSlicingStatus struct {
	Interval TimeSliceInterval `json:"interval"`
}
