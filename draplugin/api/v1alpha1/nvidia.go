package v1alpha1

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// NVIDIAGroupVersion is the API of NVIDIA's DRA driver's opaque configs
// (api/nvidia.com/resource/v1beta1 of k8s-dra-driver-gpu). tessera accepts
// its GpuConfig and MigDeviceConfig as they are, so that claims written for
// NVIDIA's driver keep their sharing settings after the port (only the
// opaque.driver must name gpu.tessera.dev).
const NVIDIAGroupVersion = "resource.nvidia.com/v1beta1"

// NVIDIADriverName is NVIDIA's DRA driver.
const NVIDIADriverName = "gpu.nvidia.com"

// The NVIDIA types, as far as tessera reads them (sharing.go of the driver).
type (
	nvidiaGpuConfig struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Sharing    *nvidiaGpuSharing `json:"sharing,omitempty"`
	}
	nvidiaGpuSharing struct {
		Strategy          SharingStrategy          `json:"strategy"`
		TimeSlicingConfig *nvidiaTimeSlicingConfig `json:"timeSlicingConfig,omitempty"`
		MpsConfig         *nvidiaMpsConfig         `json:"mpsConfig,omitempty"`
	}
	nvidiaTimeSlicingConfig struct {
		Interval *TimeSliceInterval `json:"interval,omitempty"`
	}
	nvidiaMpsConfig struct {
		DefaultActiveThreadPercentage     *int32                       `json:"defaultActiveThreadPercentage,omitempty"`
		DefaultPinnedDeviceMemoryLimit    *resource.Quantity           `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
		DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
		MultiUser                         *bool                        `json:"multiUser,omitempty"`
	}
	nvidiaMigDeviceConfig struct {
		APIVersion string                  `json:"apiVersion"`
		Kind       string                  `json:"kind"`
		Sharing    *nvidiaMigDeviceSharing `json:"sharing,omitempty"`
	}
	nvidiaMigDeviceSharing struct {
		Strategy  SharingStrategy  `json:"strategy"`
		MpsConfig *nvidiaMpsConfig `json:"mpsConfig,omitempty"`
	}
)

// decodeNVIDIA decodes NVIDIA's GpuConfig or MigDeviceConfig strictly and
// converts it to tessera's; what tessera cannot do is an error naming the
// field.
func decodeNVIDIA(kind string, data []byte) (Config, error) {
	var into any
	switch kind {
	case GpuConfigKind:
		into = &nvidiaGpuConfig{}
	case MigDeviceConfigKind:
		into = &nvidiaMigDeviceConfig{}
	default:
		return nil, field.NotSupported(field.NewPath("kind"), kind, []string{GpuConfigKind, MigDeviceConfigKind})
	}
	strictErrs, err := kjson.UnmarshalStrict(data, into)
	if err != nil {
		if fe := badQuantity(data, nvidiaQuantities); fe != nil {
			return nil, fmt.Errorf("invalid %s %s: %w", NVIDIAGroupVersion, kind, fe)
		}
		return nil, fmt.Errorf("decode %s %s: %w", NVIDIAGroupVersion, kind, err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("decode %s %s: %w", NVIDIAGroupVersion, kind, errors.Join(strictErrs...))
	}
	mpsPath := field.NewPath("sharing", "mpsConfig")
	mps := func(m *nvidiaMpsConfig) (*MPSConfig, field.ErrorList) {
		if m == nil {
			return nil, nil
		}
		var errs field.ErrorList
		if len(m.DefaultPerDevicePinnedMemoryLimit) > 0 {
			errs = append(errs, field.Forbidden(mpsPath.Child("defaultPerDevicePinnedMemoryLimit"), "not supported by tessera: a claim's MPS limit applies to its device; use defaultPinnedDeviceMemoryLimit"))
		}
		if m.MultiUser != nil && *m.MultiUser {
			errs = append(errs, field.Forbidden(mpsPath.Child("multiUser"), "not supported by tessera: its MPS daemons serve one user"))
		}
		return &MPSConfig{ActiveThreadPercentage: m.DefaultActiveThreadPercentage, PinnedDeviceMemoryLimit: m.DefaultPinnedDeviceMemoryLimit}, errs
	}
	var errs field.ErrorList
	var out Config
	switch c := into.(type) {
	case *nvidiaGpuConfig:
		g := &GpuConfig{}
		g.APIVersion, g.Kind = SchemeGroupVersion.String(), GpuConfigKind
		if s := c.Sharing; s != nil {
			g.Sharing = &GpuSharing{Strategy: s.Strategy}
			if s.TimeSlicingConfig != nil {
				g.Sharing.TimeSlicing = &TimeSlicingConfig{}
				if s.TimeSlicingConfig.Interval != nil {
					g.Sharing.TimeSlicing.Interval = *s.TimeSlicingConfig.Interval
				}
			}
			var e field.ErrorList
			g.Sharing.MPS, e = mps(s.MpsConfig)
			errs = append(errs, e...)
		}
		out = g
	case *nvidiaMigDeviceConfig:
		m := &MigDeviceConfig{}
		m.APIVersion, m.Kind = SchemeGroupVersion.String(), MigDeviceConfigKind
		if s := c.Sharing; s != nil {
			m.Sharing = &MigSharing{Strategy: s.Strategy}
			var e field.ErrorList
			m.Sharing.MPS, e = mps(s.MpsConfig)
			errs = append(errs, e...)
		}
		out = m
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s %s: %w", NVIDIAGroupVersion, kind, errs.ToAggregate())
	}
	return out, nil
}
