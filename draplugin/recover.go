package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
)

// recover makes devices, CDI specs, MPS daemons and the checkpoint agree
// before the plugin serves the kubelet:
//
//   - a checkpoint from another boot is discarded, and its MIG instances and
//     CDI specs with it;
//   - a corrupt checkpoint is moved aside and the state rebuilt from the CDI
//     specs on disk (each carries its claim's record) checked against the
//     MIG instances NVML reports;
//   - PrepareStarted claims (a prepare cut short) are rolled back;
//   - CDI specs of unknown claims are removed, MPS daemons without clients
//     stopped, and MIG instances that no claim owns destroyed (OrphanMIG).
func (p *Plugin) recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opts.RollingUpdateUID != "" {
		// The other instance of a rolling update may be serving: take the
		// lock the kubelet plugin helper serializes gRPC calls with, so that
		// reconciliation never rolls back a prepare in progress over there.
		lock, err := fileutil.LockFile(filepath.Join(p.opts.PluginDir, "serialize.lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return fmt.Errorf("lock plugin directory: %w", err)
		}
		defer func() { _ = lock.Close() }()
	}

	path := p.opts.checkpointPath()
	cp, err := checkpoint.Read(path)
	var recorded []checkpoint.Claim // every claim any record mentions, for DestroyRecorded
	switch {
	case errors.Is(err, checkpoint.ErrCorrupt):
		dst, merr := checkpoint.MoveAside(path, time.Now())
		if merr != nil {
			return merr
		}
		logger.Error(err, "Checkpoint is corrupt; moved it aside and rebuilding from CDI specs and NVML", "checkpoint", path, "movedTo", dst)
		p.metrics.recoveredActions.WithLabelValues("checkpoint_corrupt").Inc()
		if err := p.rebuild(ctx); err != nil {
			return err
		}
	case err != nil:
		return err
	case cp == nil:
		// First start, or the file was deleted: specs on disk still tell.
		if err := p.rebuild(ctx); err != nil {
			return err
		}
	case cp.BootID != p.opts.BootID:
		logger.Info("Checkpoint is from another boot; discarding it with its MIG instances", "checkpointBootID", cp.BootID, "bootID", p.opts.BootID, "claims", len(cp.Data.Claims))
		p.metrics.recoveredActions.WithLabelValues("checkpoint_foreign_boot").Inc()
		p.state = cp.Data
		for _, rec := range cp.Data.Claims {
			recorded = append(recorded, *rec)
			if err := p.undo(ctx, rec); err != nil {
				logger.Error(err, "Cleaning up claim of the previous boot failed", "claim", klog.KRef(rec.Namespace, rec.Name))
			}
		}
		p.state = checkpoint.NewData()
	default:
		p.state = cp.Data
	}

	for uid, rec := range p.state.Claims {
		recorded = append(recorded, *rec)
		if rec.State == checkpoint.PrepareCompleted {
			continue
		}
		logger.Info("Rolling back a prepare that did not complete", "claim", klog.KRef(rec.Namespace, rec.Name))
		if err := p.undo(ctx, rec); err != nil {
			return fmt.Errorf("roll back claim %s/%s: %w", rec.Namespace, rec.Name, err)
		}
		delete(p.state.Claims, uid)
		p.metrics.recoveredActions.WithLabelValues("rolled_back").Inc()
	}

	if err := p.removeOrphanSpecs(ctx); err != nil {
		return err
	}
	if err := p.stopIdleDaemons(ctx); err != nil {
		return err
	}
	if err := p.destroyOrphanMIG(ctx, recorded); err != nil {
		return err
	}
	return p.save()
}

// rebuild reconstructs the state from the claim records in the CDI specs.
// A record whose MIG instances all exist is kept as prepared; any other is
// kept as PrepareStarted, to be rolled back. Caller holds mu.
func (p *Plugin) rebuild(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.state = checkpoint.NewData()
	records, broken, err := p.cdi.Claims()
	if err != nil {
		return err
	}
	for uid, err := range broken {
		logger.Error(err, "Removing unreadable CDI spec", "claimUID", uid)
		if err := p.cdi.Remove(uid); err != nil {
			return err
		}
	}
	for uid, raw := range records {
		var rec checkpoint.Claim
		if err := json.Unmarshal(raw, &rec); err != nil || rec.UID != uid {
			logger.Error(err, "CDI spec carries no usable claim record; removing it", "claimUID", uid)
			if err := p.cdi.Remove(uid); err != nil {
				return err
			}
			continue
		}
		complete := true
		for _, d := range rec.Devices {
			if d.Kind != checkpoint.KindMIG {
				continue
			}
			inst, err := p.mig.Find(d.MIG.ParentUUID, d.MIG.GIProfileID, d.MIG.Start)
			if err != nil {
				return err
			}
			if inst == nil || inst.GIID != d.MIG.GIID {
				complete = false
			}
		}
		rec.State = checkpoint.PrepareCompleted
		if !complete {
			rec.State = checkpoint.PrepareStarted
		}
		logger.Info("Rebuilt claim from its CDI spec", "claim", klog.KRef(rec.Namespace, rec.Name), "state", rec.State)
		p.state.Claims[uid] = &rec
	}
	return nil
}

func (p *Plugin) removeOrphanSpecs(ctx context.Context) error {
	records, broken, err := p.cdi.Claims()
	if err != nil {
		return err
	}
	uids := make([]types.UID, 0, len(records)+len(broken))
	for uid := range records {
		uids = append(uids, uid)
	}
	for uid := range broken {
		uids = append(uids, uid)
	}
	for _, uid := range uids {
		if _, ok := p.state.Claims[uid]; ok {
			continue
		}
		klog.FromContext(ctx).Info("Removing CDI spec of a claim that is not prepared", "claimUID", uid)
		if err := p.cdi.Remove(uid); err != nil {
			return err
		}
		p.metrics.recoveredActions.WithLabelValues("orphan_cdi_removed").Inc()
	}
	return nil
}

func (p *Plugin) stopIdleDaemons(ctx context.Context) error {
	running, err := p.sharing.Daemons()
	if err != nil {
		return err
	}
	for _, uuid := range running {
		if p.otherUser("", func(d *checkpoint.Device) bool { return d.Sharing != nil && d.Sharing.MPSDevice == uuid }) {
			continue
		}
		if err := p.sharing.StopMPS(ctx, uuid); err != nil {
			return err
		}
		p.metrics.recoveredActions.WithLabelValues("mps_stopped").Inc()
	}
	return nil
}

// destroyOrphanMIG destroys GPU instances that no prepared claim owns: all
// of them (DestroyUnowned) or those some record says the plugin made
// (DestroyRecorded). Caller holds mu.
func (p *Plugin) destroyOrphanMIG(ctx context.Context, recorded []checkpoint.Claim) error {
	type key struct {
		gpu            string
		profile, start uint32
	}
	owned := map[key]bool{}
	for _, c := range p.state.Claims {
		for _, d := range c.Devices {
			if d.MIG != nil {
				owned[key{d.MIG.ParentUUID, d.MIG.GIProfileID, d.MIG.Start}] = true
			}
		}
	}
	ours := map[key]bool{}
	for _, c := range recorded {
		for _, d := range c.Devices {
			if d.MIG != nil && !d.MIG.Static {
				ours[key{d.MIG.ParentUUID, d.MIG.GIProfileID, d.MIG.Start}] = true
			}
		}
	}
	for _, gpu := range p.currentNode().GPUs {
		if !gpu.MigCapable {
			continue
		}
		on, err := p.mig.MigEnabled(gpu.UUID)
		if err != nil {
			return err
		}
		if !on {
			continue
		}
		list, err := p.mig.List(gpu.UUID)
		if err != nil {
			return err
		}
		for _, inst := range list {
			k := key{gpu.UUID, inst.GIProfileID, inst.Start}
			if owned[k] || (p.opts.OrphanMIG == DestroyRecorded && !ours[k]) {
				continue
			}
			klog.FromContext(ctx).Info("Destroying MIG instance that no claim owns", "gpu", gpu.UUID, "giID", inst.GIID, "profileID", inst.GIProfileID, "start", inst.Start)
			if err := p.mig.DestroyInstance(gpu.UUID, inst); err != nil {
				return err
			}
			p.metrics.recoveredActions.WithLabelValues("orphan_mig_destroyed").Inc()
		}
	}
	return nil
}
