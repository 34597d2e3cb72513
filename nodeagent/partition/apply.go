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
	"github.com/tessera-gpu/tessera/nodeagent/gpulock"
)

// Apply brings the GPUs' MIG state in line with the plan: MIG mode as the
// mode's traits say (on for static MIG, off for whole and shared GPUs; a
// dynamic-MIG GPU's mode follows its prepared claims and is left to the
// kubelet plugin; a device-plugin GPU is left as it is), and static layouts
// created on GPUs without MIG instances. It checks every GPU before changing
// any, undoes the instances it created on a GPU where creation fails, and
// withdraws a MIG mode change that would need a GPU reset, so that a
// refused plan leaves the GPUs as they were. Each GPU's changes run under
// its lock in locks (shared with the kubelet plugin; nil locks nothing). It
// reports whether anything changed (the caller then discovers again).
func Apply(ctx context.Context, lib nvml.Interface, node *discovery.Node, plan *Plan, locks *gpulock.Locks) (bool, error) {
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
		c, err := applyGPU(ctx, g, gp, locks)
		changed = changed || c
		if err != nil {
			return changed, err
		}
	}
	return changed, nil
}

func applyGPU(ctx context.Context, g *discovery.GPU, gp *GPUPlan, locks *gpulock.Locks) (bool, error) {
	logger := klog.FromContext(ctx)
	if !gp.Mode.PublishedThroughDRA() || g.Lost {
		// The device plugin serves the GPU as it is, MIG or not; a lost GPU
		// does not answer.
		return false, nil
	}
	unlock := locks.Lock(g.UUID)
	defer unlock()
	changed := false
	wantMIG := gp.Mode.NeedsMIGMode()
	if !gp.Mode.MIGModeFollowsClaims() && wantMIG != g.MigEnabled && (g.MigCapable || wantMIG) {
		mode := nvml.DEVICE_MIG_DISABLE
		if wantMIG {
			mode = nvml.DEVICE_MIG_ENABLE
		}
		if err := SetMIGMode(g.Device, mode); err != nil {
			return false, fmt.Errorf("%s: GPU %d (%s): %w", gp.Field, g.Index, g.UUID, err)
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
	return changed, nil
}

func check(g *discovery.GPU, gp *GPUPlan) error {
	if g.Lost {
		return nil
	}
	// A mode published through DRA whose MIG mode the agent turns off.
	if gp.Mode.PublishedThroughDRA() && !gp.Mode.NeedsMIGMode() && g.MigEnabled && len(g.MigInstances) > 0 {
		return fmt.Errorf("%s: GPU %d (%s) has %d MIG instances (%s) but is configured %s; destroy them first", gp.Field, g.Index, g.UUID, len(g.MigInstances), instances(g.MigInstances), gp.Mode)
	}
	switch gp.Mode {
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

// ErrResetNeeded is returned (wrapped) when a MIG mode change would only
// take effect after a GPU reset (processes hold the GPU, or the platform
// refuses resets).
var ErrResetNeeded = errors.New("the MIG mode change needs a GPU reset")

// SetMIGMode sets the GPU's MIG mode and checks that it took effect. A
// change that stays pending is withdrawn again (pending set back to the
// current mode), so that no later reset surprises the node, and reported as
// ErrResetNeeded. The caller holds the GPU's lock.
func SetMIGMode(dev nvml.Device, mode int) error {
	before, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("read MIG mode: %w", ret)
	}
	ret, activation := dev.SetMigMode(mode)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("set MIG mode %s: %w", migModeName(mode), ret)
	}
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("read MIG mode: %w", ret)
	}
	if current == mode {
		return nil
	}
	if r, _ := dev.SetMigMode(before); r != nvml.SUCCESS {
		return fmt.Errorf("%w: MIG mode %s is pending (activation: %v) and withdrawing it failed: %v", ErrResetNeeded, migModeName(mode), activation, r)
	}
	return fmt.Errorf("%w: MIG mode %s did not take effect (activation: %v; processes such as nvidia-persistenced or DCGM may hold the GPU); the request was withdrawn", ErrResetNeeded, migModeName(mode), activation)
}

func migModeName(mode int) string {
	if mode == nvml.DEVICE_MIG_ENABLE {
		return "enabled"
	}
	return "disabled"
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
