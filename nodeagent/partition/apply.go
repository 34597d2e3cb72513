package partition

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
)

// Apply brings the GPUs' MIG state in line with the plan: MIG mode on for
// dynamic and static MIG, off for whole and shared GPUs, and static layouts
// created on GPUs without MIG instances. It checks every GPU before changing
// any, and undoes the instances it created on a GPU where creation fails, so
// that a refused plan leaves the GPUs as they were. It reports whether
// anything changed (the caller then discovers again).
func Apply(ctx context.Context, lib nvml.Interface, node *discovery.Node, plan *Plan) (bool, error) {
	logger := klog.FromContext(ctx)
	var errs []error
	for i := range plan.GPUs {
		if err := check(&node.GPUs[i], &plan.GPUs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	changed := false
	for i := range plan.GPUs {
		g, gp := &node.GPUs[i], &plan.GPUs[i]
		if gp.Mode == ModeDevicePlugin {
			continue // the device plugin serves the GPU as it is, MIG or not
		}
		wantMIG := gp.Mode == ModeDynamicMIG || gp.Mode == ModeStaticMIG
		if wantMIG != g.MigEnabled && (g.MigCapable || wantMIG) {
			mode := nvml.DEVICE_MIG_DISABLE
			if wantMIG {
				mode = nvml.DEVICE_MIG_ENABLE
			}
			if err := setMigMode(g, mode); err != nil {
				return changed, err
			}
			logger.Info("Changed MIG mode", "gpu", g.UUID, "index", g.Index, "migEnabled", wantMIG, "rule", gp.Field)
			changed = true
		}
		if gp.Mode == ModeStaticMIG && len(gp.Layout) > 0 && len(g.MigInstances) == 0 {
			if err := createLayout(ctx, g, gp); err != nil {
				return changed, err
			}
			changed = true
		}
	}
	return changed, nil
}

func check(g *discovery.GPU, gp *GPUPlan) error {
	switch gp.Mode {
	case ModeWhole, ModeShared:
		if g.MigEnabled && len(g.MigInstances) > 0 {
			return fmt.Errorf("%s: GPU %d (%s) has %d MIG instances (%s) but is configured %s; destroy them first", gp.Field, g.Index, g.UUID, len(g.MigInstances), instances(g.MigInstances), gp.Mode)
		}
	case ModeStaticMIG:
		if len(gp.Layout) == 0 || len(g.MigInstances) == 0 {
			return nil
		}
		var have, want []string
		for _, in := range g.MigInstances {
			have = append(have, fmt.Sprintf("%s@%d", in.Profile, in.Placement.Start))
		}
		for _, s := range gp.Layout {
			want = append(want, fmt.Sprintf("%s@%d", s.Profile.Name, s.Placement.Start))
		}
		sort.Strings(have)
		sort.Strings(want)
		if strings.Join(have, ",") != strings.Join(want, ",") {
			return fmt.Errorf("%s.layout: GPU %d (%s) already has MIG instances %s, not the configured layout %s; destroy them or drop the layout to publish them as they are", gp.Field, g.Index, g.UUID, strings.Join(have, ", "), strings.Join(want, ", "))
		}
	}
	return nil
}

func instances(in []discovery.MigInstance) string {
	var out []string
	for _, i := range in {
		out = append(out, fmt.Sprintf("%s@%d", i.Profile, i.Placement.Start))
	}
	return strings.Join(out, ", ")
}

func setMigMode(g *discovery.GPU, mode int) error {
	ret, _ := g.Device.SetMigMode(mode)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d (%s): set MIG mode %d: %w", g.Index, g.UUID, mode, ret)
	}
	current, pending, ret := g.Device.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d (%s): read MIG mode: %w", g.Index, g.UUID, ret)
	}
	if current != mode {
		return fmt.Errorf("GPU %d (%s): MIG mode is pending (%d, current %d): the GPU needs a reset before it can be offered this way", g.Index, g.UUID, pending, current)
	}
	return nil
}

func createLayout(ctx context.Context, g *discovery.GPU, gp *GPUPlan) error {
	logger := klog.FromContext(ctx)
	type created struct {
		gi nvml.GpuInstance
		ci nvml.ComputeInstance
	}
	var done []created
	undo := func() {
		for i := len(done) - 1; i >= 0; i-- {
			if done[i].ci != nil {
				if ret := done[i].ci.Destroy(); ret != nvml.SUCCESS {
					logger.Error(ret, "Undo: destroy compute instance", "gpu", g.UUID)
				}
			}
			if ret := done[i].gi.Destroy(); ret != nvml.SUCCESS {
				logger.Error(ret, "Undo: destroy GPU instance", "gpu", g.UUID)
			}
		}
	}
	for _, s := range gp.Layout {
		info, ret := g.Device.GetGpuInstanceProfileInfo(s.Profile.GIProfileID)
		if ret != nvml.SUCCESS {
			undo()
			return fmt.Errorf("%s.layout: GPU %d: profile %s: %w", gp.Field, g.Index, s.Profile.Name, ret)
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(s.Placement.Start), Size: uint32(s.Placement.Size)}
		gi, ret := g.Device.CreateGpuInstanceWithPlacement(&info, &pl)
		if ret != nvml.SUCCESS {
			undo()
			return fmt.Errorf("%s.layout: GPU %d: create %s at memory slice %d: %w", gp.Field, g.Index, s.Profile.Name, s.Placement.Start, ret)
		}
		done = append(done, created{gi: gi})
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(s.Profile.CIProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			undo()
			return fmt.Errorf("%s.layout: GPU %d: compute instance profile of %s: %w", gp.Field, g.Index, s.Profile.Name, ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			undo()
			return fmt.Errorf("%s.layout: GPU %d: create compute instance of %s: %w", gp.Field, g.Index, s.Profile.Name, ret)
		}
		done[len(done)-1].ci = ci
	}
	logger.Info("Created static MIG layout", "gpu", g.UUID, "index", g.Index, "instances", len(done))
	return nil
}
