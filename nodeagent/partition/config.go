// Package partition holds the partition config of tessera-node: for each GPU
// of a node, whether it is offered whole, as dynamic MIG (partitionable
// devices), as static MIG (existing instances) or shared with consumable
// capacity. A config file serves many nodes: entries select nodes by label.
// Load checks what can be checked without GPUs; Resolve checks the selected
// entry against what NVML discovered and yields the node's Plan.
package partition

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/contract"
)

// Mode says how a GPU is offered; the modes and what each means for the other
// parts are defined once, in the contract package.
type Mode = contract.Mode

// The modes. ModeDevicePlugin leaves the GPU's MIG mode as it is, so that a cluster
// can move from the device plugin to DRA GPU by GPU; a GPU is offered through exactly
// one of the two.
const (
	ModeWhole        = contract.ModeWhole
	ModeDynamicMIG   = contract.ModeDynamicMIG
	ModeStaticMIG    = contract.ModeStaticMIG
	ModeShared       = contract.ModeShared
	ModeDevicePlugin = contract.ModeDevicePlugin
)

var modes = contract.ModeStrings()

// Config is the partition config file.
type Config struct {
	// Default applies to nodes that no entry of Nodes selects. Without it,
	// such nodes offer every GPU whole.
	Default *NodeConfig `json:"default,omitempty"`
	// Nodes are tried in order; the first whose nodeSelector matches the
	// node's labels applies.
	Nodes []NodeEntry `json:"nodes,omitempty"`
}

// NodeEntry is the config of the nodes a label selector picks.
type NodeEntry struct {
	// Name identifies the entry in logs and events.
	Name string `json:"name,omitempty"`
	// NodeSelector picks nodes by label; required.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector"`
	NodeConfig
}

// NodeConfig says how each GPU of a node is offered.
type NodeConfig struct {
	// GPUs rules are tried in order for each GPU; the first that matches it
	// applies. A GPU no rule matches is offered whole.
	GPUs []GPURule `json:"gpus,omitempty"`
}

// GPURule selects GPUs and says how to offer them.
type GPURule struct {
	// Indices select GPUs by NVML index; empty selects every GPU.
	Indices []int `json:"indices,omitempty"`
	// ProductName, if set, selects only GPUs with this NVML name
	// ("NVIDIA H100 80GB HBM3").
	ProductName string `json:"productName,omitempty"`
	Mode        Mode   `json:"mode"`
	// Profiles (dynamicMIG) restricts the MIG profiles offered; empty offers
	// every profile the GPU supports.
	Profiles []string `json:"profiles,omitempty"`
	// Layout (staticMIG) is the MIG layout to create at start on a GPU that
	// has no MIG instances. Empty publishes the existing instances as they are.
	Layout []MigSlot `json:"layout,omitempty"`
	// Shared (shared) tunes the consumable capacity.
	Shared *SharedConfig `json:"shared,omitempty"`
}

// MigSlot is one MIG device of a static layout.
type MigSlot struct {
	Profile string `json:"profile"`
	// Start is the first memory slice; it must be one of the profile's
	// placements. Omitted: the first free placement, in layout order.
	Start *int `json:"start,omitempty"`
}

// SharedConfig tunes a shared GPU.
type SharedConfig struct {
	// ReservedMemory is kept back from claims (for the MPS server, the
	// driver or other tenants); default 0.
	ReservedMemory *resource.Quantity `json:"reservedMemory,omitempty"`
	// MemoryStep is the granularity of memory requests; requests are rounded
	// up to a multiple. Default 256Mi.
	MemoryStep *resource.Quantity `json:"memoryStep,omitempty"`
	// DefaultMemory is consumed by a claim that does not ask for memory.
	// Default 1Gi; must be a multiple of MemoryStep.
	DefaultMemory *resource.Quantity `json:"defaultMemory,omitempty"`
	// DefaultComputeShare is the compute share (percent of the GPU's
	// multiprocessors) consumed by a claim that does not ask for one.
	// Default 0: such a claim is not limited and consumes no share.
	DefaultComputeShare *int64 `json:"defaultComputeShare,omitempty"`
}

// Load reads and checks a config file. The error names the file and, for
// invalid content, every offending field.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("partition config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("partition config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes and checks a config. Unknown fields are errors, so that a
// misspelt field does not silently fall back to a default.
func Parse(data []byte) (*Config, error) {
	cfg := &Config{}
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil
	}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, err
	}
	if errs := cfg.validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return cfg, nil
}

func (c *Config) validate() field.ErrorList {
	var errs field.ErrorList
	if c.Default != nil {
		errs = append(errs, c.Default.validate(field.NewPath("default"))...)
	}
	for i, e := range c.Nodes {
		p := field.NewPath("nodes").Index(i)
		if e.NodeSelector == nil {
			errs = append(errs, field.Required(p.Child("nodeSelector"), "each node entry selects nodes by label"))
		} else if _, err := metav1.LabelSelectorAsSelector(e.NodeSelector); err != nil {
			errs = append(errs, field.Invalid(p.Child("nodeSelector"), e.NodeSelector, err.Error()))
		}
		errs = append(errs, e.NodeConfig.validate(p)...)
	}
	return errs
}

func (n *NodeConfig) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, r := range n.GPUs {
		rp := p.Child("gpus").Index(i)
		seen := map[int]bool{}
		for j, idx := range r.Indices {
			if idx < 0 {
				errs = append(errs, field.Invalid(rp.Child("indices").Index(j), idx, "must not be negative"))
			}
			if seen[idx] {
				errs = append(errs, field.Duplicate(rp.Child("indices").Index(j), idx))
			}
			seen[idx] = true
		}
		switch {
		case r.Mode == "":
			errs = append(errs, field.Required(rp.Child("mode"), "one of "+strings.Join(modes, ", ")))
		case !r.Mode.Valid():
			errs = append(errs, field.NotSupported(rp.Child("mode"), r.Mode, modes))
		}
		if len(r.Profiles) > 0 && r.Mode != ModeDynamicMIG {
			errs = append(errs, field.Forbidden(rp.Child("profiles"), "only for mode dynamicMIG"))
		}
		if len(r.Layout) > 0 && r.Mode != ModeStaticMIG {
			errs = append(errs, field.Forbidden(rp.Child("layout"), "only for mode staticMIG"))
		}
		if r.Shared != nil && r.Mode != ModeShared {
			errs = append(errs, field.Forbidden(rp.Child("shared"), "only for mode shared"))
		}
		for j, name := range r.Profiles {
			if err := checkProfileSyntax(name); err != nil {
				errs = append(errs, field.Invalid(rp.Child("profiles").Index(j), name, err.Error()))
			}
		}
		for j, s := range r.Layout {
			sp := rp.Child("layout").Index(j)
			if s.Profile == "" {
				errs = append(errs, field.Required(sp.Child("profile"), "a MIG profile such as 1g.10gb"))
			} else if err := checkProfileSyntax(s.Profile); err != nil {
				errs = append(errs, field.Invalid(sp.Child("profile"), s.Profile, err.Error()))
			}
			if s.Start != nil && *s.Start < 0 {
				errs = append(errs, field.Invalid(sp.Child("start"), *s.Start, "must not be negative"))
			}
		}
		if r.Shared != nil {
			errs = append(errs, r.Shared.validate(rp.Child("shared"))...)
		}
	}
	return errs
}

func (s *SharedConfig) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if s.ReservedMemory != nil && s.ReservedMemory.Sign() < 0 {
		errs = append(errs, field.Invalid(p.Child("reservedMemory"), s.ReservedMemory.String(), "must not be negative"))
	}
	if s.MemoryStep != nil && s.MemoryStep.Sign() <= 0 {
		errs = append(errs, field.Invalid(p.Child("memoryStep"), s.MemoryStep.String(), "must be positive"))
	}
	step, def := s.memoryStep(), s.defaultMemory()
	if def.Sign() <= 0 {
		errs = append(errs, field.Invalid(p.Child("defaultMemory"), def.String(), "must be positive"))
	} else if step.Sign() > 0 && def.Value()%step.Value() != 0 {
		errs = append(errs, field.Invalid(p.Child("defaultMemory"), def.String(), "must be a multiple of memoryStep "+step.String()))
	}
	if s.DefaultComputeShare != nil && (*s.DefaultComputeShare < 0 || *s.DefaultComputeShare > 100) {
		errs = append(errs, field.Invalid(p.Child("defaultComputeShare"), *s.DefaultComputeShare, "must be a percentage from 0 to 100"))
	}
	return errs
}

func (s *SharedConfig) memoryStep() resource.Quantity {
	if s == nil || s.MemoryStep == nil {
		return resource.MustParse("256Mi")
	}
	return *s.MemoryStep
}

func (s *SharedConfig) defaultMemory() resource.Quantity {
	if s == nil || s.DefaultMemory == nil {
		return resource.MustParse("1Gi")
	}
	return *s.DefaultMemory
}

// checkProfileSyntax accepts NVML profile names such as "1g.10gb",
// "1g.10gb+me", "1g.23gb+me.all" or "1g.10gb-me": <n>g.<m>gb[+attrs][-attrs].
// Compute-instance prefixes ("1c.") are not offered: tessera creates one
// full compute instance per GPU instance.
func checkProfileSyntax(name string) error {
	const want = "want <slices>g.<memory>gb with optional +attribute, e.g. 1g.10gb or 1g.10gb+me"
	base, _, _ := strings.Cut(name, "+")
	if i := strings.Index(base, "gb-"); i >= 0 {
		base = base[:i+2]
	}
	g, mem, ok := strings.Cut(base, ".")
	if !ok || !strings.HasSuffix(g, "g") || !strings.HasSuffix(mem, "gb") || !digits(strings.TrimSuffix(g, "g")) || !digits(strings.TrimSuffix(mem, "gb")) {
		return fmt.Errorf("not a MIG profile name: %s", want)
	}
	return nil
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Select returns the node config for a node with these labels, the path of
// the entry in the file (for error messages) and its name.
func (c *Config) Select(nodeLabels map[string]string) (*NodeConfig, *field.Path, string) {
	for i := range c.Nodes {
		e := &c.Nodes[i]
		sel, err := metav1.LabelSelectorAsSelector(e.NodeSelector)
		if err != nil {
			continue // rejected by validate; unreachable for a loaded config
		}
		if sel.Matches(labels.Set(nodeLabels)) {
			name := e.Name
			if name == "" {
				name = fmt.Sprintf("nodes[%d]", i)
			}
			return &e.NodeConfig, field.NewPath("nodes").Index(i), name
		}
	}
	if c.Default != nil {
		return c.Default, field.NewPath("default"), "default"
	}
	return &NodeConfig{}, field.NewPath("default"), "built-in default (every GPU whole)"
}
