package deviceplugin

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

// MIGStrategy says how MIG-enabled GPUs are offered to the kubelet.
type MIGStrategy string

const (
	// MIGStrategyNone offers every GPU whole, MIG mode or not (as NVIDIA's
	// device plugin does), so a node keeps its resource names while MIG is
	// being rolled out.
	MIGStrategyNone MIGStrategy = "none"
	// MIGStrategySingle offers the MIG devices under the main resource name.
	// Every GPU must have MIG enabled and every MIG device must have the
	// same profile; anything else is refused at start.
	MIGStrategySingle MIGStrategy = "single"
	// MIGStrategyMixed offers GPUs without MIG under the main resource name
	// and each MIG profile as its own resource <domain>/mig-<profile>.
	MIGStrategyMixed MIGStrategy = "mixed"
)

// ReplicaPolicy says which time-sliced replicas GetPreferredAllocation
// prefers when a container asks for several.
type ReplicaPolicy string

const (
	// ReplicaPolicySpread takes replicas from as many GPUs as it can, the GPUs
	// with the most free replicas first, so that co-tenants are balanced.
	ReplicaPolicySpread ReplicaPolicy = "spread"
	// ReplicaPolicyPack takes replicas from as few GPUs as it can, preferring
	// GPUs that are already shared, so that whole GPUs stay free.
	ReplicaPolicyPack ReplicaPolicy = "pack"
)

// DeviceListStrategy says how Allocate tells the container runtime which
// devices to inject.
type DeviceListStrategy string

const (
	// DeviceListEnvVar sets NVIDIA_VISIBLE_DEVICES and passes the device
	// nodes as DeviceSpecs (for runtimes without CDI).
	DeviceListEnvVar DeviceListStrategy = "envvar"
	// DeviceListCDIAnnotations names the CDI devices in a cdi.k8s.io/
	// container annotation.
	DeviceListCDIAnnotations DeviceListStrategy = "cdi-annotations"
	// DeviceListCDICRI names the CDI devices in the CDIDevices field of the
	// v1beta1 API, which the kubelet forwards to the runtime through the CRI.
	DeviceListCDICRI DeviceListStrategy = "cdi-cri"
)

// Defaults.
const (
	DefaultResourceName  = "tessera.dev/gpu"
	DefaultPluginDir     = pluginapi.DevicePluginPath
	DefaultKubeletSocket = "kubelet.sock"
	// DefaultCDIKind names the devices of the CDI spec that
	// `nvidia-ctk cdi generate` writes (devices named by UUID), which injects
	// the driver libraries along with the device nodes.
	DefaultCDIKind = "nvidia.com/gpu"
	// sharedSuffix is appended to a resource name when time-sliced replicas
	// are renamed, so that pods asking for a whole GPU never get a share.
	sharedSuffix = ".shared"
)

// Config is the device plugin's part of the node configuration. The zero
// value, after Default, serves every selected GPU whole as tessera.dev/gpu.
type Config struct {
	// ResourceName of whole GPUs (and, with MIG strategy single, of MIG
	// devices). MIG resources in mixed mode use its domain:
	// <domain>/mig-<profile>.
	ResourceName string `json:"resourceName,omitempty"`
	// MIGStrategy is none, single or mixed.
	MIGStrategy MIGStrategy `json:"migStrategy,omitempty"`
	// TimeSlicing, when set, advertises every device as Replicas devices.
	TimeSlicing *TimeSlicing `json:"timeSlicing,omitempty"`
	// DeviceListStrategy lists how Allocate names the devices: envvar,
	// cdi-annotations, cdi-cri (one or more).
	DeviceListStrategy []DeviceListStrategy `json:"deviceListStrategy,omitempty"`
	// CDIKind is the vendor/class of the CDI devices named by the cdi-*
	// strategies; the device name is the GPU or MIG UUID.
	CDIKind string `json:"cdiKind,omitempty"`
	// PluginDir is the kubelet's device plugin directory, where kubelet.sock
	// lives and the plugin's own sockets are created.
	PluginDir string `json:"pluginDir,omitempty"`
	// KubeletSocket is the file name of the kubelet's registration socket
	// inside PluginDir.
	KubeletSocket string `json:"kubeletSocket,omitempty"`
}

// TimeSlicing configures time-sliced replicas of each device.
type TimeSlicing struct {
	// Replicas per device; must be at least 1.
	Replicas int `json:"replicas"`
	// RenameByDefault serves replicas as <resource>.shared.
	RenameByDefault bool `json:"renameByDefault,omitempty"`
	// FailRequestsGreaterThanOne refuses a container asking for more than
	// one replica: several replicas of a time-sliced GPU give no more
	// compute, only the illusion of it.
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne,omitempty"`
	// Policy is spread (default) or pack; see ReplicaPolicy.
	Policy ReplicaPolicy `json:"policy,omitempty"`
}

// ParseConfig decodes a YAML or JSON config strictly (an unknown field is an
// error naming it), fills in defaults and validates it.
func ParseConfig(data []byte) (Config, error) {
	var cfg Config
	if len(bytes.TrimSpace(data)) > 0 {
		if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
			return Config{}, fmt.Errorf("device plugin config: %w", err)
		}
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Default fills in the fields left empty.
func (c *Config) Default() {
	if c.ResourceName == "" {
		c.ResourceName = DefaultResourceName
	}
	if c.MIGStrategy == "" {
		c.MIGStrategy = MIGStrategyNone
	}
	if len(c.DeviceListStrategy) == 0 {
		c.DeviceListStrategy = []DeviceListStrategy{DeviceListEnvVar}
	}
	if c.CDIKind == "" {
		c.CDIKind = DefaultCDIKind
	}
	if c.PluginDir == "" {
		c.PluginDir = DefaultPluginDir
	}
	if c.KubeletSocket == "" {
		c.KubeletSocket = DefaultKubeletSocket
	}
	if c.TimeSlicing != nil && c.TimeSlicing.Policy == "" {
		c.TimeSlicing.Policy = ReplicaPolicySpread
	}
}

// Validate checks a defaulted config. The error lists every bad field by its
// path, e.g. "timeSlicing.replicas: Invalid value: 0: must be at least 1".
func (c *Config) Validate() error {
	var errs field.ErrorList
	errs = append(errs, validateResourceName(field.NewPath("resourceName"), c.ResourceName)...)
	switch c.MIGStrategy {
	case MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("migStrategy"), c.MIGStrategy,
			[]MIGStrategy{MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed}))
	}
	if ts := c.TimeSlicing; ts != nil {
		p := field.NewPath("timeSlicing")
		if ts.Replicas < 1 {
			errs = append(errs, field.Invalid(p.Child("replicas"), ts.Replicas, "must be at least 1"))
		}
		switch ts.Policy {
		case ReplicaPolicySpread, ReplicaPolicyPack:
		default:
			errs = append(errs, field.NotSupported(p.Child("policy"), ts.Policy,
				[]ReplicaPolicy{ReplicaPolicySpread, ReplicaPolicyPack}))
		}
		if ts.RenameByDefault {
			errs = append(errs, validateResourceName(field.NewPath("resourceName"), c.ResourceName+sharedSuffix)...)
		}
	}
	seen := map[DeviceListStrategy]bool{}
	for i, s := range c.DeviceListStrategy {
		p := field.NewPath("deviceListStrategy").Index(i)
		switch s {
		case DeviceListEnvVar, DeviceListCDIAnnotations, DeviceListCDICRI:
		default:
			errs = append(errs, field.NotSupported(p, s,
				[]DeviceListStrategy{DeviceListEnvVar, DeviceListCDIAnnotations, DeviceListCDICRI}))
		}
		if seen[s] {
			errs = append(errs, field.Duplicate(p, s))
		}
		seen[s] = true
	}
	if vendor, class := parser.ParseQualifier(c.CDIKind); vendor == "" || class == "" {
		errs = append(errs, field.Invalid(field.NewPath("cdiKind"), c.CDIKind, "must be <vendor>/<class>"))
	} else {
		if err := parser.ValidateVendorName(vendor); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("cdiKind"), c.CDIKind, err.Error()))
		}
		if err := parser.ValidateClassName(class); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("cdiKind"), c.CDIKind, err.Error()))
		}
	}
	if !filepath.IsAbs(c.PluginDir) {
		errs = append(errs, field.Invalid(field.NewPath("pluginDir"), c.PluginDir, "must be an absolute path"))
	}
	if c.KubeletSocket == "" || strings.ContainsRune(c.KubeletSocket, filepath.Separator) {
		errs = append(errs, field.Invalid(field.NewPath("kubeletSocket"), c.KubeletSocket,
			"must be a file name inside pluginDir"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid device plugin config: %w", errs.ToAggregate())
	}
	return nil
}

// validateResourceName applies the kubelet's own test for extended resource
// names (v1helper.IsExtendedResourceName), which it applies at Register: a
// domain-prefixed name outside kubernetes.io that is a valid qualified name
// even with the quota prefix "requests." in front.
func validateResourceName(p *field.Path, name string) field.ErrorList {
	domain, _, ok := strings.Cut(name, "/")
	switch {
	case name == "":
		return field.ErrorList{field.Required(p, "")}
	case !ok || domain == "":
		return field.ErrorList{field.Invalid(p, name, "must be <domain>/<name>, e.g. tessera.dev/gpu")}
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return field.ErrorList{field.Invalid(p, name, "the kubernetes.io domain is reserved for native resources")}
	case strings.HasPrefix(name, "requests."):
		return field.ErrorList{field.Invalid(p, name, `must not start with "requests."`)}
	}
	if msgs := content.IsLabelKey("requests." + name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, name, strings.Join(msgs, "; "))}
	}
	return nil
}

// resourceDomain is the part of a resource name before the slash.
func resourceDomain(name string) string {
	domain, _, _ := strings.Cut(name, "/")
	return domain
}
