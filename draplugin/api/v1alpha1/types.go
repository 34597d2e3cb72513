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
type MPSConfig struct {
	// ActiveThreadPercentage is the share of the device's SMs, 1..100.
	ActiveThreadPercentage *int32 `json:"activeThreadPercentage,omitempty"`
	// PinnedDeviceMemoryLimit limits device memory per client, at least 1Mi.
	PinnedDeviceMemoryLimit *resource.Quantity `json:"pinnedDeviceMemoryLimit,omitempty"`
}
