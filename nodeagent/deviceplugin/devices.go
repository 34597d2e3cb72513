package deviceplugin

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// GPU is what the plugin needs to know about one GPU; the node agent fills
// it from discovery (see Options.GPUs).
type GPU struct {
	UUID  string
	Index int
	// Minor is the N of /dev/nvidiaN.
	Minor      int
	MIGEnabled bool
	// MIGDevices are the GPU's existing MIG devices.
	MIGDevices []MIGDevice
	// NUMANode is the GPU's NUMA node, nil when unknown; the kubelet's
	// topology manager aligns CPUs with it.
	NUMANode *int
}

// MIGDevice is one existing MIG device (GPU instance + compute instance).
type MIGDevice struct {
	// UUID of the MIG device (MIG-...): its kubelet device ID and CDI device
	// name.
	UUID string
	// Profile is the GPU instance profile name, e.g. 1g.10gb.
	Profile string
	// Start of the GPU instance placement, which orders the MIG devices of
	// one GPU.
	Start int
	// GIID and CIID are the GPU and compute instance IDs, which name the
	// capability device nodes that grant access to the MIG device.
	GIID, CIID int
}

// unit is one thing the kubelet can hand out before replication: a whole
// GPU or one MIG device.
type unit struct {
	// id is the GPU or MIG UUID.
	id  string
	gpu *GPU
	mig *MIGDevice
}

// advertised is one device as the kubelet sees it.
type advertised struct {
	// id is the kubelet device ID: the unit's UUID, or <uuid>::<n> for the
	// n-th time-sliced replica.
	id      string
	unit    *unit
	replica int
}

// resource is one extended resource and the devices advertised under it.
type resource struct {
	name string
	// whole is true when the devices are whole GPUs, which makes NVLink
	// topology matter for preferred allocation.
	whole      bool
	replicated bool
	devices    []*advertised
	byID       map[string]*advertised
}

// replicaSeparator joins a unit ID and a replica number in a device ID; the
// same convention as NVIDIA's device plugin, so tooling that splits on it
// keeps working.
const replicaSeparator = "::"

// buildResources groups the selected GPUs into extended resources following
// the MIG strategy and time-slicing of cfg. It fails, naming the config
// field, when the hardware does not fit the strategy.
func buildResources(cfg Config, gpus []GPU) ([]*resource, error) {
	sorted := append([]GPU(nil), gpus...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })

	groups := map[string][]*unit{}
	wholeNames := map[string]bool{}
	addWhole := func(g *GPU) {
		groups[cfg.ResourceName] = append(groups[cfg.ResourceName], &unit{id: g.UUID, gpu: g})
		wholeNames[cfg.ResourceName] = true
	}
	addMIGs := func(g *GPU, name func(profile string) string) {
		migs := append([]MIGDevice(nil), g.MIGDevices...)
		sort.Slice(migs, func(i, j int) bool { return migs[i].Start < migs[j].Start })
		for i := range migs {
			n := name(migs[i].Profile)
			groups[n] = append(groups[n], &unit{id: migs[i].UUID, gpu: g, mig: &migs[i]})
		}
	}

	switch cfg.MIGStrategy {
	case MIGStrategyNone:
		for i := range sorted {
			addWhole(&sorted[i])
		}
	case MIGStrategySingle:
		var enabled, disabled []string
		profiles := map[string]bool{}
		for _, g := range sorted {
			if g.MIGEnabled {
				enabled = append(enabled, gpuName(g))
				for _, m := range g.MIGDevices {
					profiles[m.Profile] = true
				}
			} else {
				disabled = append(disabled, gpuName(g))
			}
		}
		if len(enabled) > 0 && len(disabled) > 0 {
			return nil, fmt.Errorf("migStrategy %q: MIG is enabled on %s but not on %s; use %q: %w",
				cfg.MIGStrategy, strings.Join(enabled, ", "), strings.Join(disabled, ", "), MIGStrategyMixed, ErrHardwareMismatch)
		}
		if len(profiles) > 1 {
			return nil, fmt.Errorf("migStrategy %q: MIG devices have several profiles (%s); use %q: %w",
				cfg.MIGStrategy, strings.Join(sortedKeys(profiles), ", "), MIGStrategyMixed, ErrHardwareMismatch)
		}
		for i := range sorted {
			if sorted[i].MIGEnabled {
				addMIGs(&sorted[i], func(string) string { return cfg.ResourceName })
			} else {
				addWhole(&sorted[i])
			}
		}
	case MIGStrategyMixed:
		domain := resourceDomain(cfg.ResourceName)
		for i := range sorted {
			if sorted[i].MIGEnabled {
				addMIGs(&sorted[i], func(profile string) string { return migResourceName(domain, profile) })
			} else {
				addWhole(&sorted[i])
			}
		}
	default:
		return nil, fmt.Errorf("migStrategy: unsupported value %q", cfg.MIGStrategy)
	}

	var out []*resource
	for _, name := range sortedKeys(groups) {
		units := groups[name]
		r := &resource{name: name, whole: wholeNames[name], byID: map[string]*advertised{}}
		replicas := 1
		if ts := cfg.TimeSlicing; ts != nil {
			replicas = ts.Replicas
			if ts.RenameByDefault {
				r.name += sharedSuffix
			}
		}
		r.replicated = replicas > 1
		if errs := validateResourceName(field.NewPath("resourceName"), r.name); len(errs) > 0 {
			return nil, fmt.Errorf("resource %q derived from migStrategy %q is not a valid extended resource name: %w",
				r.name, cfg.MIGStrategy, errs.ToAggregate())
		}
		for _, u := range units {
			for n := 0; n < replicas; n++ {
				a := &advertised{id: u.id, unit: u, replica: n}
				if r.replicated {
					a.id = u.id + replicaSeparator + strconv.Itoa(n)
				}
				if _, dup := r.byID[a.id]; dup {
					return nil, fmt.Errorf("resource %q: device ID %q is not unique (discovery reported the same UUID twice)", r.name, a.id)
				}
				r.devices = append(r.devices, a)
				r.byID[a.id] = a
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// ErrHardwareMismatch marks errors where the config is valid but the node's
// GPUs do not fit it.
var ErrHardwareMismatch = errors.New("the node's GPUs do not fit the device plugin config")

// migResourceName is <domain>/mig-<profile>. A '+' in a profile name
// (e.g. 1g.10gb+me, a profile with media extensions) is not allowed in a
// resource name; it becomes '.'.
func migResourceName(domain, profile string) string {
	return domain + "/mig-" + strings.ReplaceAll(profile, "+", ".")
}

func gpuName(g GPU) string {
	return fmt.Sprintf("gpu-%d (%s)", g.Minor, g.UUID)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
