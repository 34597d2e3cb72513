package draplugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
)

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin. A claim the
// plugin does not know is already unprepared. A claim whose undo fails
// stays recorded and is reported, so the kubelet retries; every undo step
// is idempotent.
func (p *Plugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := time.Now()
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() {
		p.metrics.duration.WithLabelValues("unprepare").Observe(time.Since(start).Seconds())
	}()
	if err := p.syncFromDisk(ctx); err != nil {
		return nil, err
	}
	results := make(map[types.UID]error, len(claims))
	removed := map[types.UID]*checkpoint.Claim{}
	for _, c := range claims {
		p.metrics.operations.WithLabelValues("unprepare").Inc()
		results[c.UID] = nil
		rec := p.state.Claims[c.UID]
		if rec == nil {
			logger.V(3).Info("Claim is not prepared, nothing to do", "claim", c.NamespacedName)
			continue
		}
		if err := p.undo(ctx, rec); err != nil {
			p.metrics.errors.WithLabelValues("unprepare").Inc()
			results[c.UID] = fmt.Errorf("unprepare claim %s: %w", c.NamespacedName, err)
			continue
		}
		delete(p.state.Claims, c.UID)
		removed[c.UID] = rec
	}
	if len(removed) > 0 {
		// Everything is undone and the checkpoint still names the claims: a crash here
		// leaves them recorded, and the kubelet's retry undoes them again (idempotently).
		p.opts.crashPoint("unprepare-undone")
	}
	defer func() {
		for _, rec := range removed {
			if _, back := p.state.Claims[rec.UID]; !back {
				p.clearReport(ctx, rec)
			}
		}
	}()
	if len(removed) == 0 {
		return results, nil
	}
	if err := p.save(); err != nil {
		// Keep the records so a retry undoes (idempotently) and saves again.
		for uid, rec := range removed {
			p.state.Claims[uid] = rec
			p.metrics.errors.WithLabelValues("unprepare").Inc()
			results[uid] = fmt.Errorf("record unprepare of claim %s/%s: %w", rec.Namespace, rec.Name, err)
		}
		return results, nil
	}
	for _, rec := range removed {
		logger.V(2).Info("Unprepared claim", "claim", klog.KRef(rec.Namespace, rec.Name))
	}
	return results, nil
}

// undo reverses everything a prepare of rec may have done, in reverse
// order: the CDI spec (so no new container gets the device), the claim's
// MPS daemon (a v2 record's per-device daemon stops with its last claim),
// the compute mode (back to DEFAULT), the time slice (back to Default when
// no other claim time-slices the GPU), and the MIG instance. Each step is
// idempotent and works from what is recorded before the side effect, so
// undo also cleans up a prepare that crashed half-way. rec must still be in
// p.state (it is excluded when counting other users). Caller holds mu.
func (p *Plugin) undo(ctx context.Context, rec *checkpoint.Claim) error {
	var errs []error
	if err := p.cdi.Remove(rec.UID); err != nil {
		errs = append(errs, err)
	}
	p.opts.crashPoint("undo-cdi-removed")
	if rec.MPS != nil {
		if err := p.sharing.Stop(ctx, rec.MPS.ID); err != nil {
			errs = append(errs, err)
		}
		p.opts.crashPoint("undo-mps-stopped")
	}
	reset := map[string]bool{}
	for i := len(rec.Devices) - 1; i >= 0; i-- {
		d := &rec.Devices[i]
		if s := d.Sharing; s != nil && !d.AdminAccess {
			switch configapi.SharingStrategy(s.Strategy) {
			case configapi.MPSStrategy:
				if rec.MPS == nil && s.MPSDevice != "" && !p.otherUser(rec.UID, func(o *checkpoint.Device) bool {
					return o.Sharing != nil && o.Sharing.MPSDevice == s.MPSDevice && p.legacyMPS(o)
				}) {
					// A v2 record: its device's daemon goes with its last claim.
					if err := p.sharing.StopLegacy(ctx, s.MPSDevice); err != nil {
						errs = append(errs, err)
					}
				}
				if s.ExclusiveProcess {
					if err := p.gpus.SetComputeMode(ctx, d.GPUUUID, sharing.ComputeDefault); err != nil {
						errs = append(errs, err)
					}
				}
			case configapi.TimeSlicingStrategy:
				if !reset[d.GPUUUID] && !p.otherUser(rec.UID, func(o *checkpoint.Device) bool { return timeSliced(o, d.GPUUUID) }) {
					reset[d.GPUUUID] = true
					if err := p.gpus.SetTimeSlice(ctx, d.GPUUUID, sharing.TimeSliceDefault); err != nil {
						errs = append(errs, err)
					}
					p.opts.crashPoint("undo-timeslice-reset")
				}
			}
		}
		if d.Kind == checkpoint.KindMIG && !d.MIG.Static {
			if err := p.destroyOurs(ctx, rec.UID, d); err != nil {
				errs = append(errs, fmt.Errorf("device %s: %w", d.Device, err))
			}
			p.opts.crashPoint("undo-mig-destroyed")
		}
	}
	return errors.Join(errs...)
}

// legacyMPS says whether d is an MPS device of a claim recorded by v2 (a
// daemon per device, no Claim.MPS). Caller holds mu.
func (p *Plugin) legacyMPS(d *checkpoint.Device) bool {
	if !isMPS(d) {
		return false
	}
	for _, c := range p.state.Claims {
		for i := range c.Devices {
			if &c.Devices[i] == d {
				return c.MPS == nil
			}
		}
	}
	return false
}

// destroyOurs destroys the MIG instance the plugin created for d, and
// nothing else: a created instance is found by its GPU, IDs, profile and
// placement, and only in the boot it was made in (after a reboot the IDs
// are reused by instances that are not ours). A record without IDs is a
// prepare cut short between recording the intent and recording the IDs:
// the instance at exactly the recorded profile and placement is taken for
// the one just made, unless another claim holds it. Caller holds mu.
func (p *Plugin) destroyOurs(ctx context.Context, uid types.UID, d *checkpoint.Device) error {
	m := d.MIG
	unlock := p.locks.Lock(m.ParentUUID)
	defer unlock()
	if m.Created {
		if m.BootID != p.opts.BootID {
			klog.FromContext(ctx).Info("Not destroying a MIG instance recorded in another boot", "gpu", m.ParentUUID, "giID", m.GIID, "recordedBoot", m.BootID)
			return nil
		}
		return p.mig.DestroyByID(m.ParentUUID, m.GIID, m.CIID, m.GIProfileID, m.Start)
	}
	if p.otherUser(uid, func(o *checkpoint.Device) bool {
		return o.MIG != nil && o.MIG.ParentUUID == m.ParentUUID && o.MIG.GIProfileID == m.GIProfileID && o.MIG.Start == m.Start
	}) {
		return nil
	}
	return p.mig.Destroy(m.ParentUUID, m.GIProfileID, m.Start)
}

// otherUser reports whether a claim other than uid holds a device that
// matches. Caller holds mu.
func (p *Plugin) otherUser(uid types.UID, match func(*checkpoint.Device) bool) bool {
	for _, c := range p.state.Claims {
		if c.UID == uid {
			continue
		}
		for i := range c.Devices {
			if match(&c.Devices[i]) {
				return true
			}
		}
	}
	return false
}
