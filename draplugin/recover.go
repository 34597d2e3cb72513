package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
)

// recover makes devices, CDI specs, MPS daemons and the checkpoint agree
// before the plugin serves the kubelet:
//
//   - a checkpoint of a newer format this version cannot read fails the
//     start, untouched (a downgrade never loses prepared claims);
//   - a checkpoint from another boot is discarded with its CDI specs; its
//     MIG instances died with the boot, and whatever instances exist now
//     are not tessera's, so nothing is destroyed;
//   - a corrupt checkpoint is moved aside and the state rebuilt from the CDI
//     specs on disk (each carries its claim's record) checked against the
//     MIG instances NVML reports, by their IDs;
//   - PrepareStarted claims (a prepare cut short) are rolled back;
//   - CDI specs of unknown claims are removed, MPS daemons without clients
//     stopped, and MIG instances this plugin created that no claim holds are
//     handled as OrphanMIG says, with an Event each. Instances tessera did
//     not create are never destroyed.
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
	var recorded []checkpoint.Claim // every claim any record of this boot mentions
	switch {
	case errors.Is(err, checkpoint.ErrNewerVersion):
		return err
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
		// MIG instances, MPS daemons and time slices did not survive the
		// reboot; instances that exist now were made in this boot by someone
		// else (the agent's static layout, an administrator) and must not be
		// destroyed. Only the specs are left to remove (below).
		logger.Info("Checkpoint is from another boot; discarding its records, destroying nothing", "checkpointBootID", cp.BootID, "bootID", p.opts.BootID, "claims", len(cp.Data.Claims))
		p.metrics.recoveredActions.WithLabelValues("checkpoint_foreign_boot").Inc()
		p.state = checkpoint.NewData()
	default:
		if cp.ReadVersion != checkpoint.Version {
			logger.Info("Read a checkpoint of another format; it is written back as "+checkpoint.Version, "version", cp.ReadVersion)
		}
		p.state = cp.Data
	}

	for uid, rec := range p.state.Claims {
		recorded = append(recorded, *rec)
		if rec.State == checkpoint.PrepareCompleted {
			continue
		}
		logger.Info("Rolling back a prepare that did not complete", "claim", klog.KRef(rec.Namespace, rec.Name))
		if err := p.undo(ctx, rec); err != nil {
			// Never a crash loop: the record stays PrepareStarted, the
			// kubelet's next prepare of the claim (or the next start)
			// rolls it back again.
			logger.Error(err, "Rolling back failed; keeping the record to retry", "claim", klog.KRef(rec.Namespace, rec.Name))
			p.event(corev1.EventTypeWarning, "RollbackFailed", "rolling back the unfinished prepare of claim %s/%s failed, retried later: %v", rec.Namespace, rec.Name, err)
			continue
		}
		delete(p.state.Claims, uid)
		p.metrics.recoveredActions.WithLabelValues("rolled_back").Inc()
	}

	orphans, err := p.removeOrphanSpecs(ctx)
	if err != nil {
		return err
	}
	recorded = append(recorded, orphans...)
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
			m := d.MIG
			if m.BootID != p.opts.BootID && (m.Created || m.Static) {
				// A spec left from another (or an unknown) boot: its instance is gone.
				complete = false
				m.Created, m.Static = false, true // nothing of it to destroy
				continue
			}
			inst, err := p.mig.FindByID(m.ParentUUID, m.GIID, m.CIID, m.GIProfileID, m.Start)
			if err != nil {
				return err
			}
			if inst == nil {
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

// removeOrphanSpecs removes the CDI specs of claims that are not prepared
// and returns the records they carried (their MIG instances are tessera's).
func (p *Plugin) removeOrphanSpecs(ctx context.Context) ([]checkpoint.Claim, error) {
	records, broken, err := p.cdi.Claims()
	if err != nil {
		return nil, err
	}
	var recorded []checkpoint.Claim
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
		var rec checkpoint.Claim
		if json.Unmarshal(records[uid], &rec) == nil {
			recorded = append(recorded, rec)
		}
		if err := p.cdi.Remove(uid); err != nil {
			return nil, err
		}
		p.metrics.recoveredActions.WithLabelValues("orphan_cdi_removed").Inc()
	}
	return recorded, nil
}

// stopIdleDaemons stops the MPS daemons no claim of the state has (a
// daemon started just before a crash, a pod of a claim unprepared while
// the plugin was down), v2 per-device daemons whose claims are gone, and
// adopts the daemons of the prepared claims (Controller.Adopt). Nothing
// here fails the start: what cannot be done is logged, evented and done
// again at the next start. Caller holds mu.
func (p *Plugin) stopIdleDaemons(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ids, err := p.sharing.Daemons(ctx)
	if err != nil {
		logger.Error(err, "Cannot list MPS daemons; idle ones are stopped at the next start")
		p.event(corev1.EventTypeWarning, "MPSReconcileFailed", "listing MPS control daemons failed: %v", err)
		ids = nil
	}
	owner := map[string]*checkpoint.Claim{}
	legacy := map[string]bool{}
	for _, c := range p.state.Claims {
		if c.MPS != nil {
			owner[c.MPS.ID] = c
			continue
		}
		for i := range c.Devices {
			if d := &c.Devices[i]; isMPS(d) && d.Sharing.MPSDevice != "" {
				legacy[d.Sharing.MPSDevice] = true
			}
		}
	}
	for _, id := range ids {
		if owner[id] != nil {
			continue
		}
		if err := p.sharing.Stop(ctx, id); err != nil {
			logger.Error(err, "Cannot stop an MPS daemon no claim has", "daemon", id)
			p.event(corev1.EventTypeWarning, "MPSReconcileFailed", "stopping the MPS control daemon %s, which no claim has, failed: %v", id, err)
			continue
		}
		logger.Info("Stopped an MPS control daemon no prepared claim has", "daemon", id)
		p.metrics.recoveredActions.WithLabelValues("mps_stopped").Inc()
	}
	devices, err := p.sharing.LegacyDaemons()
	if err != nil {
		logger.Error(err, "Cannot list per-device MPS daemons")
	}
	for _, uuid := range devices {
		if legacy[uuid] {
			continue
		}
		if err := p.sharing.StopLegacy(ctx, uuid); err != nil {
			logger.Error(err, "Cannot stop a per-device MPS daemon no claim has", "device", uuid)
			continue
		}
		p.metrics.recoveredActions.WithLabelValues("mps_stopped").Inc()
	}
	specs, brokenSpecs, specErr := p.cdi.Claims()
	for id, c := range owner {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		if _, ok := specs[c.UID]; specErr == nil && !ok && brokenSpecs[c.UID] == nil {
			// A completed prepare always wrote the claim's CDI spec, a checkpoint of
			// another boot was discarded above, and only undo removes a spec (its first
			// step): this claim's unprepare was cut short. Launching its daemon again
			// would race the kubelet's retried unprepare, which may stop it before the
			// new daemon starts and leave that daemon (and its directory) behind. The
			// retry stops whatever is left of it.
			logger.Info("The CDI spec of a prepared claim is gone: its unprepare was cut short; not launching its MPS daemon again", "claim", klog.KRef(c.Namespace, c.Name), "daemon", id)
			continue
		}
		up, corrected, err := p.sharing.Adopt(ctx, specOf(c))
		switch {
		case err != nil:
			logger.Error(err, "Cannot adopt the MPS daemon of a prepared claim", "claim", klog.KRef(c.Namespace, c.Name), "daemon", id)
			p.events.Eventf(claimRef(c), corev1.EventTypeWarning, "MPSDaemonNotAdopted", "tessera-node restarted and could not take over the claim's MPS control daemon: %v", err)
		case !up:
			logger.Info("The MPS daemon of a prepared claim does not answer; launched again", "claim", klog.KRef(c.Namespace, c.Name), "daemon", id)
			p.events.Eventf(claimRef(c), corev1.EventTypeWarning, "MPSDaemonRestarted", "the claim's MPS control daemon did not answer when tessera-node restarted; it was launched again with the same limits")
			p.metrics.recoveredActions.WithLabelValues("mps_relaunched").Inc()
		default:
			p.metrics.recoveredActions.WithLabelValues("mps_adopted").Inc()
			if len(corrected) > 0 {
				p.events.Eventf(claimRef(c), corev1.EventTypeWarning, "MPSLimitsSetBack", "the claim's MPS control daemon ran with changed limits, set back: %s", strings.Join(corrected, "; "))
			}
		}
	}
	return nil
}

// destroyOrphanMIG handles the MIG instances that no prepared claim holds:
// those the records of this boot say the plugin created get OrphanMIG
// (destroyed by default), with an Event each; under OrphanReport every
// other unheld instance is reported too. Instances tessera did not create
// are never destroyed. Caller holds mu.
func (p *Plugin) destroyOrphanMIG(ctx context.Context, recorded []checkpoint.Claim) error {
	logger := klog.FromContext(ctx)
	type key struct {
		gpu        string
		gi, ci     uint32
		profile, s uint32
	}
	held := map[key]bool{}
	for _, c := range p.state.Claims {
		for _, d := range c.Devices {
			if m := d.MIG; m != nil {
				held[key{m.ParentUUID, m.GIID, m.CIID, m.GIProfileID, m.Start}] = true
			}
		}
	}
	ours := map[key]bool{}
	for _, c := range recorded {
		for _, d := range c.Devices {
			if m := d.MIG; m != nil && m.Created && m.BootID == p.opts.BootID {
				ours[key{m.ParentUUID, m.GIID, m.CIID, m.GIProfileID, m.Start}] = true
			}
		}
	}
	for _, gpu := range p.currentNode().GPUs {
		if !gpu.MigCapable || gpu.Lost {
			continue
		}
		on, err := p.mig.MigEnabled(gpu.UUID)
		if err != nil {
			return err
		}
		if !on {
			continue
		}
		unlock := p.locks.Lock(gpu.UUID)
		list, err := p.mig.List(gpu.UUID)
		if err != nil {
			unlock()
			return err
		}
		for _, inst := range list {
			ciID := ^uint32(0)
			if len(inst.CIIDs) > 0 {
				ciID = inst.CIIDs[0]
			}
			k := key{gpu.UUID, inst.GIID, ciID, inst.GIProfileID, inst.Start}
			what := fmt.Sprintf("MIG instance on GPU %d (%s): GPU instance %d, compute instance %d, profile %d at memory slice %d", gpu.Minor, gpu.UUID, inst.GIID, ciID, inst.GIProfileID, inst.Start)
			switch {
			case held[k]:
			case ours[k] && p.opts.OrphanMIG == OrphanDestroy:
				logger.Info("Destroying a MIG instance this plugin created that no claim holds", "gpu", gpu.UUID, "giID", inst.GIID, "profileID", inst.GIProfileID, "start", inst.Start)
				if err := p.mig.DestroyInstance(gpu.UUID, inst); err != nil {
					unlock()
					return err
				}
				p.metrics.recoveredActions.WithLabelValues("orphan_mig_destroyed").Inc()
				p.event(corev1.EventTypeNormal, "OrphanMIGDestroyed", "%s: created by tessera for a claim that is gone; destroyed", what)
			case ours[k]:
				p.metrics.recoveredActions.WithLabelValues("orphan_mig_kept").Inc()
				p.event(corev1.EventTypeWarning, "OrphanMIGKept", "%s: created by tessera for a claim that is gone; kept (--orphan-mig=%s)", what, p.opts.OrphanMIG)
			case p.opts.OrphanMIG == OrphanReport:
				p.event(corev1.EventTypeNormal, "ForeignMIGFound", "%s: not created by tessera and held by no claim; kept", what)
			}
		}
		unlock()
	}
	return nil
}
