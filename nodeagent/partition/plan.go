package partition

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
)

// DevicePluginGPUs returns the indices of the GPUs the plan hands to the
// classic device plugin.
func (p *Plan) DevicePluginGPUs() []int {
	var out []int
	for _, g := range p.GPUs {
		if !g.Mode.PublishedThroughDRA() {
			out = append(out, g.Index)
		}
	}
	return out
}

// Plan is how each GPU of one node is offered.
type Plan struct {
	// Entry names the config entry that selected the node.
	Entry string
	// GPUs is parallel to the discovered node's GPUs.
	GPUs []GPUPlan
}

// GPUPlan is how one GPU is offered.
type GPUPlan struct {
	Index int
	UUID  string
	Mode  Mode
	// Profiles offered under dynamic MIG.
	Profiles []discovery.MigProfile
	// Layout to ensure under static MIG; empty publishes what exists.
	Layout []LayoutSlot
	// Shared capacity settings under shared mode.
	Shared SharedPlan
	// Field is where the rule that chose this plan sits in the config.
	Field string
}

// LayoutSlot is one MIG device of a static layout, with its placement.
type LayoutSlot struct {
	Profile   discovery.MigProfile
	Placement discovery.Placement
}

// SharedPlan is the resolved consumable capacity of a shared GPU, in bytes
// and percent.
type SharedPlan struct {
	Memory              int64
	MemoryStep          int64
	DefaultMemory       int64
	DefaultComputeShare int64
}

// Resolve picks the config entry for a node with these labels and checks it
// against the discovered GPUs: every index exists, MIG modes are only used on
// MIG-capable GPUs, every profile is one the GPU supports, static layouts use
// real placements and do not overlap, shared memory settings fit the GPU.
// Every problem is reported, each naming its field.
func Resolve(cfg *Config, nodeLabels map[string]string, node *discovery.Node) (*Plan, error) {
	nc, base, entry := cfg.Select(nodeLabels)
	plan := &Plan{Entry: entry, GPUs: make([]GPUPlan, len(node.GPUs))}
	var errs field.ErrorList
	for i, r := range nc.GPUs {
		for j, idx := range r.Indices {
			if idx >= len(node.GPUs) {
				errs = append(errs, field.Invalid(base.Child("gpus").Index(i).Child("indices").Index(j), idx, fmt.Sprintf("this node has %d GPUs (indices 0 to %d)", len(node.GPUs), len(node.GPUs)-1)))
			}
		}
	}
	for gi := range node.GPUs {
		g := &node.GPUs[gi]
		gp := GPUPlan{Index: g.Index, UUID: g.UUID, Mode: ModeWhole, Field: "(no rule matches: whole)"}
		for i := range nc.GPUs {
			r := &nc.GPUs[i]
			if !r.matches(g) {
				continue
			}
			rp := base.Child("gpus").Index(i)
			gp.Mode, gp.Field = r.Mode, rp.String()
			errs = append(errs, resolveRule(r, rp, g, &gp)...)
			break
		}
		plan.GPUs[gi] = gp
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("partition config entry %q: %w", entry, errs.ToAggregate())
	}
	return plan, nil
}

func (r *GPURule) matches(g *discovery.GPU) bool {
	if r.ProductName != "" && r.ProductName != g.ProductName {
		return false
	}
	if len(r.Indices) == 0 {
		return true
	}
	for _, i := range r.Indices {
		if i == g.Index {
			return true
		}
	}
	return false
}

func describe(g *discovery.GPU) string {
	return fmt.Sprintf("GPU %d (%s)", g.Index, g.ProductName)
}

func resolveRule(r *GPURule, rp *field.Path, g *discovery.GPU, gp *GPUPlan) field.ErrorList {
	var errs field.ErrorList
	if r.Mode.NeedsMIGMode() && (!g.MigCapable || len(g.MigProfiles) == 0) {
		return field.ErrorList{field.Invalid(rp.Child("mode"), r.Mode, describe(g)+" does not support MIG")}
	}
	supported := strings.Join(g.ProfileNames(), ", ")
	switch r.Mode {
	case ModeDynamicMIG:
		if len(r.Profiles) == 0 {
			gp.Profiles = append(gp.Profiles, g.MigProfiles...)
			break
		}
		for j, name := range r.Profiles {
			p, ok := g.Profile(name)
			if !ok {
				errs = append(errs, field.NotSupported(rp.Child("profiles").Index(j), name, g.ProfileNames()))
				continue
			}
			gp.Profiles = append(gp.Profiles, *p)
		}
	case ModeStaticMIG:
		var taken []discovery.Placement
		for j, s := range r.Layout {
			sp := rp.Child("layout").Index(j)
			p, ok := g.Profile(s.Profile)
			if !ok {
				errs = append(errs, field.Invalid(sp.Child("profile"), s.Profile, fmt.Sprintf("%s does not support this profile; supported: %s", describe(g), supported)))
				continue
			}
			var pl *discovery.Placement
			if s.Start != nil {
				for k := range p.Placements {
					if p.Placements[k].Start == *s.Start {
						pl = &p.Placements[k]
					}
				}
				if pl == nil {
					errs = append(errs, field.Invalid(sp.Child("start"), *s.Start, fmt.Sprintf("profile %s can start at memory slices %s", p.Name, starts(p.Placements))))
					continue
				}
				for _, t := range taken {
					if pl.Overlaps(t) {
						errs = append(errs, field.Invalid(sp, fmt.Sprintf("%s at %d", p.Name, pl.Start), fmt.Sprintf("overlaps memory slices %d-%d used by an earlier layout entry", t.Start, t.Start+t.Size-1)))
						pl = nil
						break
					}
				}
				if pl == nil {
					continue
				}
			} else {
				for k := range p.Placements {
					free := true
					for _, t := range taken {
						if p.Placements[k].Overlaps(t) {
							free = false
							break
						}
					}
					if free {
						pl = &p.Placements[k]
						break
					}
				}
				if pl == nil {
					errs = append(errs, field.Invalid(sp.Child("profile"), s.Profile, "no free placement left for this profile after the earlier layout entries"))
					continue
				}
			}
			taken = append(taken, *pl)
			gp.Layout = append(gp.Layout, LayoutSlot{Profile: *p, Placement: *pl})
		}
		sort.Slice(gp.Layout, func(a, b int) bool { return gp.Layout[a].Placement.Start < gp.Layout[b].Placement.Start })
	case ModeShared:
		s := r.Shared
		step, def := s.memoryStep(), s.defaultMemory()
		reserved := int64(0)
		if s != nil && s.ReservedMemory != nil {
			reserved = s.ReservedMemory.Value()
		}
		mem := int64(g.MemoryBytes) - reserved
		// Memory offered is a whole number of steps, so that a claim
		// rounded up to a step can use the last of it.
		if step.Value() > 0 {
			mem -= mem % step.Value()
		}
		switch {
		case mem < step.Value():
			errs = append(errs, field.Invalid(rp.Child("shared", "reservedMemory"), reserved, fmt.Sprintf("leaves less than one memoryStep of the %d bytes of %s", g.MemoryBytes, describe(g))))
		case def.Value() > mem:
			errs = append(errs, field.Invalid(rp.Child("shared", "defaultMemory"), def.String(), fmt.Sprintf("exceeds the %d bytes offered by %s", mem, describe(g))))
		}
		gp.Shared = SharedPlan{Memory: mem, MemoryStep: step.Value(), DefaultMemory: def.Value()}
		if s != nil && s.DefaultComputeShare != nil {
			gp.Shared.DefaultComputeShare = *s.DefaultComputeShare
		}
	}
	return errs
}

func starts(ps []discovery.Placement) string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprint(p.Start))
	}
	return strings.Join(out, ", ")
}
