package v1alpha1

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// Config is a decoded, defaulted and validated opaque configuration:
// *GpuConfig or *MigDeviceConfig.
type Config interface {
	// ConfigKind returns GpuConfigKind or MigDeviceConfigKind.
	ConfigKind() string
}

// ConfigKind implements Config.
func (c *GpuConfig) ConfigKind() string { return GpuConfigKind }

// ConfigKind implements Config.
func (c *MigDeviceConfig) ConfigKind() string { return MigDeviceConfigKind }

// Decode decodes one opaque configuration strictly: the apiVersion must be
// gpu.tessera.dev/v1alpha1 or NVIDIA's resource.nvidia.com/v1beta1 (whose
// GpuConfig and MigDeviceConfig are converted), the kind known, and unknown
// or duplicate fields are errors (a typo must never silently turn into the
// default). The
// result is defaulted and validated; errors name the offending field.
func Decode(data []byte) (Config, error) {
	var tm metav1.TypeMeta
	if err := kjson.UnmarshalCaseSensitivePreserveInts(data, &tm); err != nil {
		return nil, fmt.Errorf("decode opaque config: %w", err)
	}
	var cfg Config
	switch tm.APIVersion {
	case SchemeGroupVersion.String():
		switch tm.Kind {
		case GpuConfigKind:
			cfg = &GpuConfig{}
		case MigDeviceConfigKind:
			cfg = &MigDeviceConfig{}
		default:
			return nil, field.NotSupported(field.NewPath("kind"), tm.Kind, []string{GpuConfigKind, MigDeviceConfigKind})
		}
		strictErrs, err := kjson.UnmarshalStrict(data, cfg)
		if err != nil {
			if fe := badQuantity(data, tesseraQuantities); fe != nil {
				return nil, fmt.Errorf("invalid %s: %w", tm.Kind, fe)
			}
			return nil, fmt.Errorf("decode %s: %w", tm.Kind, err)
		}
		if len(strictErrs) > 0 {
			return nil, fmt.Errorf("decode %s: %w", tm.Kind, errors.Join(strictErrs...))
		}
	case NVIDIAGroupVersion:
		var err error
		if cfg, err = decodeNVIDIA(tm.Kind, data); err != nil {
			return nil, err
		}
	default:
		return nil, field.NotSupported(field.NewPath("apiVersion"), tm.APIVersion, []string{SchemeGroupVersion.String(), NVIDIAGroupVersion})
	}
	var errs field.ErrorList
	switch c := cfg.(type) {
	case *GpuConfig:
		c.Default()
		errs = c.Validate()
	case *MigDeviceConfig:
		c.Default()
		errs = c.Validate()
	}
	if len(errs) > 0 {
		if tm.APIVersion == NVIDIAGroupVersion {
			// Name the fields the author wrote, not tessera's.
			return nil, fmt.Errorf("invalid %s %s: %w", NVIDIAGroupVersion, tm.Kind, toNVIDIAPaths(errs).ToAggregate())
		}
		return nil, fmt.Errorf("invalid %s: %w", tm.Kind, errs.ToAggregate())
	}
	return cfg, nil
}

// Default fills in the time-slice interval when time-slicing is chosen.
func (c *GpuConfig) Default() {
	if c.Sharing != nil && c.Sharing.Strategy == TimeSlicingStrategy {
		if c.Sharing.TimeSlicing == nil {
			c.Sharing.TimeSlicing = &TimeSlicingConfig{}
		}
		if c.Sharing.TimeSlicing.Interval == "" {
			c.Sharing.TimeSlicing.Interval = DefaultTimeSlice
		}
	}
}

// Default is a no-op today; it exists so both kinds are handled alike.
func (c *MigDeviceConfig) Default() {}

// Validate checks a defaulted GpuConfig.
func (c *GpuConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.Sharing == nil {
		return nil
	}
	p := field.NewPath("sharing")
	switch c.Sharing.Strategy {
	case TimeSlicingStrategy:
		if c.Sharing.MPS != nil {
			errs = append(errs, field.Forbidden(p.Child("mps"), "only allowed with strategy MPS"))
		}
		if ts := c.Sharing.TimeSlicing; ts != nil {
			if _, err := ts.Interval.Index(); err != nil {
				errs = append(errs, field.NotSupported(p.Child("timeSlicing", "interval"), ts.Interval,
					[]string{string(DefaultTimeSlice), string(ShortTimeSlice), string(MediumTimeSlice), string(LongTimeSlice)}))
			}
		}
	case MPSStrategy:
		if c.Sharing.TimeSlicing != nil {
			errs = append(errs, field.Forbidden(p.Child("timeSlicing"), "only allowed with strategy TimeSlicing"))
		}
		errs = append(errs, c.Sharing.MPS.validate(p.Child("mps"))...)
	default:
		errs = append(errs, field.NotSupported(p.Child("strategy"), c.Sharing.Strategy,
			[]string{string(TimeSlicingStrategy), string(MPSStrategy)}))
	}
	return errs
}

// Validate checks a defaulted MigDeviceConfig.
func (c *MigDeviceConfig) Validate() field.ErrorList {
	if c.Sharing == nil {
		return nil
	}
	p := field.NewPath("sharing")
	if c.Sharing.Strategy != MPSStrategy {
		return field.ErrorList{field.NotSupported(p.Child("strategy"), c.Sharing.Strategy, []string{string(MPSStrategy)})}
	}
	return c.Sharing.MPS.validate(p.Child("mps"))
}

// minPinnedMemory is the smallest limit MPS accepts: it counts in MiB.
var minPinnedMemory = resource.MustParse("1Mi")

func (m *MPSConfig) validate(p *field.Path) field.ErrorList {
	if m == nil {
		return nil
	}
	var errs field.ErrorList
	if pct := m.ActiveThreadPercentage; pct != nil && (*pct < 1 || *pct > 100) {
		errs = append(errs, field.Invalid(p.Child("activeThreadPercentage"), *pct, "must be between 1 and 100"))
	}
	if lim := m.PinnedDeviceMemoryLimit; lim != nil && lim.Cmp(minPinnedMemory) < 0 {
		errs = append(errs, field.Invalid(p.Child("pinnedDeviceMemoryLimit"), lim.String(), "must be at least 1Mi"))
	}
	if lim := m.PinnedDeviceMemoryLimit; lim != nil && lim.Cmp(maxPinnedMemory) > 0 {
		errs = append(errs, field.Invalid(p.Child("pinnedDeviceMemoryLimit"), lim.String(), "must be at most 1Pi"))
	}
	if sp := m.SMPartition; sp != nil && *sp != SMPartitionRequired && *sp != SMPartitionPreferred {
		errs = append(errs, field.NotSupported(p.Child("smPartition"), *sp, []string{string(SMPartitionRequired), string(SMPartitionPreferred)}))
	}
	return errs
}

// maxPinnedMemory bounds a limit so that its MiB fit any tool's parser.
var maxPinnedMemory = resource.MustParse("1Pi")

// Index returns the value that `nvidia-smi compute-policy --set-timeslice`
// takes for the interval (0..3).
func (i TimeSliceInterval) Index() (int, error) {
	switch i {
	case DefaultTimeSlice, "":
		return 0, nil
	case ShortTimeSlice:
		return 1, nil
	case MediumTimeSlice:
		return 2, nil
	case LongTimeSlice:
		return 3, nil
	}
	return -1, fmt.Errorf("unknown time-slice interval %q", string(i))
}
