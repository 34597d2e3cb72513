package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/contract"
	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/mig"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
)

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
//
// Per call: every claim is planned without side effects (devices looked
// up, configs decoded and validated, the exclusive-device guard checked),
// the plans are written to the checkpoint as PrepareStarted (when a side
// effect needs it, see needsIntent), the side effects run (MIG instances,
// MPS daemons, time slices, CDI specs), and the claims are written as
// PrepareCompleted. At most two checkpoint writes per call, not per claim.
// A claim that fails is rolled back on its own.
func (p *Plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	start := time.Now()
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() {
		p.metrics.duration.WithLabelValues("prepare").Observe(time.Since(start).Seconds())
	}()
	if err := p.syncFromDisk(ctx); err != nil {
		return nil, err
	}

	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	fail := func(uid types.UID, err error) {
		p.metrics.errors.WithLabelValues("prepare").Inc()
		results[uid] = kubeletplugin.PrepareResult{Err: err}
	}
	var planned []*checkpoint.Claim
	reports := map[types.UID]*claimReport{}
	for _, claim := range claims {
		p.metrics.operations.WithLabelValues("prepare").Inc()
		if rec := p.state.Claims[claim.UID]; rec != nil {
			if rec.State == checkpoint.PrepareCompleted {
				// Idempotent: the kubelet asks again after its own restart.
				results[claim.UID] = prepareResult(rec)
				continue
			}
			// A prepare that another instance (rolling update) left half
			// done: undo it, then prepare afresh.
			if err := p.undo(ctx, rec); err != nil {
				fail(claim.UID, fmt.Errorf("roll back earlier attempt to prepare claim %s: %w", klog.KObj(claim), err))
				continue
			}
			delete(p.state.Claims, claim.UID)
		}
		rec, report, err := p.plan(ctx, claim)
		if err != nil {
			fail(claim.UID, err)
			continue
		}
		if len(rec.Devices) == 0 {
			results[claim.UID] = kubeletplugin.PrepareResult{}
			continue
		}
		p.state.Claims[claim.UID] = rec
		planned = append(planned, rec)
		reports[claim.UID] = report
	}
	if len(planned) == 0 {
		return results, nil
	}

	if slices.ContainsFunc(planned, needsIntent) {
		if err := p.save(); err != nil {
			for _, rec := range planned {
				delete(p.state.Claims, rec.UID)
				fail(rec.UID, fmt.Errorf("record prepare of claim %s/%s: %w", rec.Namespace, rec.Name, err))
			}
			return results, nil
		}
		p.opts.crashPoint("checkpoint-started")
	}

	var done []*checkpoint.Claim
	for _, rec := range planned {
		if err := p.apply(ctx, rec, reports[rec.UID]); err != nil {
			logger.Error(err, "Prepare failed, rolling back", "claim", klog.KRef(rec.Namespace, rec.Name))
			if uerr := p.undo(ctx, rec); uerr != nil {
				// Keep the PrepareStarted record: the next start rolls back.
				fail(rec.UID, fmt.Errorf("%w (rollback failed too, retried at restart: %w)", err, uerr))
				continue
			}
			delete(p.state.Claims, rec.UID)
			fail(rec.UID, err)
			continue
		}
		rec.State = checkpoint.PrepareCompleted
		done = append(done, rec)
	}
	if err := p.save(); err != nil {
		// The work is done but not recorded: undo it so that disk and
		// devices agree, and let the kubelet retry.
		for _, rec := range done {
			rec.State = checkpoint.PrepareStarted
			if uerr := p.undo(ctx, rec); uerr == nil {
				delete(p.state.Claims, rec.UID)
			}
			fail(rec.UID, fmt.Errorf("record prepared claim %s/%s: %w", rec.Namespace, rec.Name, err))
		}
		if err := p.save(); err != nil {
			logger.Error(err, "Checkpoint still not writable; restart will reconcile")
		}
		return results, nil
	}
	p.opts.crashPoint("checkpoint-completed")
	for _, rec := range done {
		results[rec.UID] = prepareResult(rec)
		logger.V(2).Info("Prepared claim", "claim", klog.KRef(rec.Namespace, rec.Name), "devices", len(rec.Devices))
		p.report(ctx, rec, reports[rec.UID])
	}
	return results, nil
}

// needsIntent reports whether a planned claim must be recorded as
// PrepareStarted before its side effects. Only a MIG instance (found again
// by its recorded placement), a time slice and a compute mode (reset from
// the record) need it: a CDI spec of an unrecorded claim and an MPS daemon
// without a claim (its directory, its pod) are found and removed by startup
// reconciliation on their own. Skipping
// the record saves one fsync'ed write for whole GPUs and MPS shares.
func needsIntent(rec *checkpoint.Claim) bool {
	for _, d := range rec.Devices {
		if d.Kind == checkpoint.KindMIG && !d.MIG.Static {
			return true
		}
		if d.Sharing != nil && (d.Sharing.Strategy == string(configapi.TimeSlicingStrategy) || d.Sharing.ExclusiveProcess) {
			return true
		}
	}
	return false
}

func prepareResult(rec *checkpoint.Claim) kubeletplugin.PrepareResult {
	var res kubeletplugin.PrepareResult
	for _, d := range rec.Devices {
		res.Devices = append(res.Devices, kubeletplugin.Device{
			Requests:     d.Requests,
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: d.CDIDeviceIDs,
			ShareID:      d.ShareID,
		})
	}
	return res
}

// plan turns an allocated claim into a PrepareStarted record without any
// side effect. Every error names the claim.
func (p *Plugin) plan(ctx context.Context, claim *resourceapi.ResourceClaim) (*checkpoint.Claim, *claimReport, error) {
	ref := klog.KObj(claim).String()
	rec := &checkpoint.Claim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted}
	report := &claimReport{}
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, nil, fmt.Errorf("claim %s is not allocated", ref)
	}
	configs, err := decodeConfigs(alloc.Devices.Config, alloc.Devices.Results)
	if err != nil {
		return nil, nil, fmt.Errorf("claim %s: %w", ref, err)
	}
	used := make([]bool, len(configs))
	var smPolicies []*configapi.SMPartitionPolicy
	for _, r := range alloc.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		d, policy, err := p.planDevice(r, configs, used)
		if err != nil {
			return nil, nil, fmt.Errorf("claim %s: request %q: device %s: %w", ref, r.Request, r.Device, err)
		}
		rec.Devices = append(rec.Devices, d)
		smPolicies = append(smPolicies, policy)
	}
	if err := unusedConfig(configs, used); err != nil {
		return nil, nil, fmt.Errorf("claim %s: %w", ref, err)
	}
	if err := p.guard(rec); err != nil {
		return nil, nil, err
	}
	if err := p.timeSliceConflicts(rec); err != nil {
		return nil, nil, err
	}
	if err := p.planMPS(ctx, rec, smPolicies, report); err != nil {
		return nil, nil, fmt.Errorf("claim %s: %w", ref, err)
	}
	// A MIG device whose instance exists already at exactly the allocated
	// profile and placement and belongs to no claim is a static MIG device:
	// use it, never destroy it.
	for i := range rec.Devices {
		d := &rec.Devices[i]
		if d.Kind != checkpoint.KindMIG {
			continue
		}
		inst, err := p.mig.Find(d.MIG.ParentUUID, d.MIG.GIProfileID, d.MIG.Start)
		if err != nil {
			return nil, nil, fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
		}
		switch {
		case inst != nil && inst.Size == d.MIG.Size && len(inst.CIIDs) > 0 && (d.AdminAccess || !p.migOwned(d.MIG)):
			// Not tessera's: used by its IDs, never destroyed.
			d.MIG.Static = true
			d.MIG.GIID, d.MIG.CIID, d.MIG.BootID = inst.GIID, inst.CIIDs[0], p.opts.BootID
			klog.FromContext(ctx).V(2).Info("Using existing MIG instance", "claim", ref, "device", d.Device, "giID", inst.GIID)
		case d.AdminAccess:
			return nil, nil, fmt.Errorf("claim %s: device %s: admin access to a MIG device that does not exist", ref, d.Device)
		}
	}
	return rec, report, nil
}

// opaqueConfig is one decoded config with the requests it applies to.
type opaqueConfig struct {
	index    int
	source   resourceapi.AllocationConfigSource
	requests []string
	config   configapi.Config
}

func (c opaqueConfig) appliesTo(request string) bool {
	if len(c.requests) == 0 {
		return true
	}
	return slices.Contains(c.requests, request) || slices.Contains(c.requests, resourceclaim.BaseRequestRef(request))
}

// decodeConfigs decodes the driver's opaque configs, class configs first so
// that the claim's own configs override them. A config for NVIDIA's driver
// in a claim that has no device of NVIDIA's driver is a claim ported from
// it whose opaque.driver was not changed: an error, never silently skipped.
func decodeConfigs(in []resourceapi.DeviceAllocationConfiguration, results []resourceapi.DeviceRequestAllocationResult) ([]opaqueConfig, error) {
	nvidiaDevices := slices.ContainsFunc(results, func(r resourceapi.DeviceRequestAllocationResult) bool { return r.Driver == configapi.NVIDIADriverName })
	var out []opaqueConfig
	for i, c := range in {
		if c.Opaque != nil && c.Opaque.Driver == configapi.NVIDIADriverName && !nvidiaDevices {
			return nil, fmt.Errorf("status.allocation.devices.config[%d] (from %s) is for driver %s, but the claim's devices are %s's: set opaque.driver to %s (NVIDIA's %s GpuConfig and MigDeviceConfig are accepted as they are)",
				i, c.Source, configapi.NVIDIADriverName, DriverName, DriverName, configapi.NVIDIAGroupVersion)
		}
		if c.Opaque == nil || c.Opaque.Driver != DriverName {
			continue
		}
		cfg, err := configapi.Decode(c.Opaque.Parameters.Raw)
		if err != nil {
			return nil, fmt.Errorf("status.allocation.devices.config[%d] (from %s) opaque parameters: %w", i, c.Source, err)
		}
		out = append(out, opaqueConfig{index: i, source: c.Source, requests: c.Requests, config: cfg})
	}
	slices.SortStableFunc(out, func(a, b opaqueConfig) int {
		rank := func(s resourceapi.AllocationConfigSource) int {
			if s == resourceapi.AllocationConfigSourceClass {
				return 0
			}
			return 1
		}
		return rank(a.source) - rank(b.source)
	})
	return out, nil
}

// configFor returns the last config of the wanted kind that applies to the
// request, and marks it used.
func configFor(configs []opaqueConfig, used []bool, request, wantKind string) configapi.Config {
	var found configapi.Config
	for i, c := range configs {
		if c.appliesTo(request) && c.config.ConfigKind() == wantKind {
			found = c.config
			used[i] = true
		}
	}
	return found
}

// unusedConfig reports a claim config that configures none of its devices:
// a GpuConfig for a claim without GPUs or shares, a MigDeviceConfig without
// MIG devices. That is a mistake to report, not to ignore. (Whether a config
// names a request explicitly cannot decide it: the allocator drops the
// request list of a config that applies to every request of the claim.)
//
// Class configs are exempt: an administrator may write one class for GPUs
// and MIG devices alike, and its config then fits only some of them.
func unusedConfig(configs []opaqueConfig, used []bool) error {
	for i, c := range configs {
		if !used[i] && c.source != resourceapi.AllocationConfigSourceClass {
			return fmt.Errorf("status.allocation.devices.config[%d] (from %s): the %s configures none of the claim's devices (requests %v); a GpuConfig configures GPUs and shares, a MigDeviceConfig MIG devices",
				c.index, c.source, c.config.ConfigKind(), c.requests)
		}
	}
	return nil
}

func (p *Plugin) planDevice(r resourceapi.DeviceRequestAllocationResult, configs []opaqueConfig, used []bool) (checkpoint.Device, *configapi.SMPartitionPolicy, error) {
	d := checkpoint.Device{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID, AdminAccess: ptr.Deref(r.AdminAccess, false)}
	target, err := p.currentNode().Lookup(r.Device)
	if err != nil {
		return d, nil, err
	}
	d.GPUUUID, d.GPUMinor = target.GPU.UUID, target.GPU.Minor
	if target.GPU.Lost {
		return d, nil, fmt.Errorf("GPU %d (%s) is lost (it does not answer NVML)", target.GPU.Minor, target.GPU.UUID)
	}
	var policy *configapi.SMPartitionPolicy
	switch target.Name.Kind {
	case devicename.KindGPU, devicename.KindShared:
		d.Kind = checkpoint.KindGPU
		if target.Name.Kind == devicename.KindShared {
			d.Kind = checkpoint.KindShared
		}
		if d.AdminAccess {
			// Monitoring access: device nodes only, no sharing setup.
			return d, nil, nil
		}
		cfg := configFor(configs, used, r.Request, configapi.GpuConfigKind)
		var gc *configapi.GpuConfig
		if cfg != nil {
			gc = cfg.(*configapi.GpuConfig)
			if gc.Sharing != nil && gc.Sharing.MPS != nil {
				policy = gc.Sharing.MPS.SMPartition
			}
		}
		var err error
		d.Sharing, err = gpuSharing(d, gc, r.ConsumedCapacity)
		if err != nil {
			return d, nil, err
		}
		if d.Kind == checkpoint.KindGPU && d.Sharing != nil && d.Sharing.Strategy == string(configapi.MPSStrategy) {
			// A whole GPU shared through the claim's MPS daemon: only its
			// server may hold a context, so no process of the claim can
			// use the GPU around the daemon's limits.
			d.Sharing.ExclusiveProcess = true
		}
	case devicename.KindMIG:
		if target.GPU.Lost {
			return d, nil, fmt.Errorf("GPU %d (%s) is lost", target.GPU.Minor, target.GPU.UUID)
		}
		d.Kind = checkpoint.KindMIG
		d.MIG = &checkpoint.MIGInstance{
			ParentUUID:  target.GPU.UUID,
			ParentMinor: target.GPU.Minor,
			Profile:     target.Profile.Name,
			GIProfileID: uint32(target.Profile.GIProfileID),
			CIProfileID: uint32(target.Profile.CIProfileID),
			Start:       uint32(target.Placement.Start),
			Size:        uint32(target.Placement.Size),
		}
		if d.AdminAccess {
			return d, nil, nil
		}
		if cfg := configFor(configs, used, r.Request, configapi.MigDeviceConfigKind); cfg != nil {
			if s := cfg.(*configapi.MigDeviceConfig).Sharing; s != nil {
				d.Sharing = &checkpoint.Sharing{Strategy: string(configapi.MPSStrategy)}
				applyMPSLimits(d.Sharing, s.MPS)
				if s.MPS != nil {
					policy = s.MPS.SMPartition
				}
			}
		}
	default:
		return d, nil, fmt.Errorf("unsupported device kind %s", target.Name.Kind)
	}
	return d, policy, nil
}

func applyMPSLimits(s *checkpoint.Sharing, m *configapi.MPSConfig) {
	if m == nil {
		return
	}
	if m.ActiveThreadPercentage != nil {
		s.ActiveThreadPercentage = *m.ActiveThreadPercentage
	}
	if m.PinnedDeviceMemoryLimit != nil {
		s.PinnedMemoryLimitBytes = m.PinnedDeviceMemoryLimit.Value()
	}
}

// gpuSharing decides how a whole GPU or a fractional share is shared. A
// fractional share defaults to MPS with the consumed memory as pinned
// device memory limit and the consumed compute share as active thread
// percentage; a config may lower those limits but not raise them.
func gpuSharing(d checkpoint.Device, gc *configapi.GpuConfig, consumed map[resourceapi.QualifiedName]resource.Quantity) (*checkpoint.Sharing, error) {
	var cfg *configapi.GpuSharing
	if gc != nil {
		cfg = gc.Sharing
	}
	if d.Kind == checkpoint.KindGPU && cfg == nil {
		return nil, nil // exclusive
	}
	if cfg != nil && cfg.Strategy == configapi.TimeSlicingStrategy {
		interval, _ := cfg.TimeSlicing.Interval.Index()
		return &checkpoint.Sharing{Strategy: string(configapi.TimeSlicingStrategy), TimeSliceInterval: interval}, nil
	}
	s := &checkpoint.Sharing{Strategy: string(configapi.MPSStrategy), MPSDevice: d.GPUUUID}
	if d.Kind == checkpoint.KindShared {
		if q, ok := consumed[contract.CapMemory]; ok {
			s.PinnedMemoryLimitBytes = q.Value()
		}
		if q, ok := consumed[contract.CapCompute]; ok && q.Value() > 0 {
			s.ActiveThreadPercentage = int32(min(q.Value(), 100))
		}
	}
	if cfg != nil && cfg.MPS != nil {
		if m := cfg.MPS.PinnedDeviceMemoryLimit; m != nil {
			if s.PinnedMemoryLimitBytes > 0 && m.Value() > s.PinnedMemoryLimitBytes {
				return nil, fmt.Errorf("GpuConfig sharing.mps.pinnedDeviceMemoryLimit %s exceeds the allocated memory (%d bytes)", m.String(), s.PinnedMemoryLimitBytes)
			}
			s.PinnedMemoryLimitBytes = m.Value()
		}
		if a := cfg.MPS.ActiveThreadPercentage; a != nil {
			if s.ActiveThreadPercentage > 0 && *a > s.ActiveThreadPercentage {
				return nil, fmt.Errorf("GpuConfig sharing.mps.activeThreadPercentage %d exceeds the allocated compute share (%d%%)", *a, s.ActiveThreadPercentage)
			}
			s.ActiveThreadPercentage = *a
		}
	}
	return s, nil
}

// guard is the exclusive-device guard: a device held exclusively by one
// claim is never prepared for another, whatever the API says (two
// schedulers, a stale allocation). Caller holds mu.
func (p *Plugin) guard(rec *checkpoint.Claim) error {
	for _, other := range p.state.Claims {
		if other.UID == rec.UID {
			continue
		}
		for _, a := range rec.Devices {
			for _, b := range other.Devices {
				if !conflict(a, b) {
					continue
				}
				if a.Kind == checkpoint.KindMIG && b.Kind == checkpoint.KindMIG {
					return fmt.Errorf("MIG placement of device %s (GPU %d, memory slices %d..%d) for claim %s/%s is occupied by device %s of claim %s/%s (uid %s)",
						a.Device, a.GPUMinor, a.MIG.Start, a.MIG.Start+a.MIG.Size-1, rec.Namespace, rec.Name, b.Device, other.Namespace, other.Name, other.UID)
				}
				return fmt.Errorf("exclusive-device guard: device %s for claim %s/%s conflicts with device %s (GPU %d) held by claim %s/%s (uid %s); refusing to prepare",
					a.Device, rec.Namespace, rec.Name, b.Device, b.GPUMinor, other.Namespace, other.Name, other.UID)
			}
		}
	}
	return nil
}

// migOwned reports whether a prepared claim holds the MIG instance.
func (p *Plugin) migOwned(m *checkpoint.MIGInstance) bool {
	return p.otherUser("", func(d *checkpoint.Device) bool {
		return d.MIG != nil && !d.AdminAccess && d.MIG.ParentUUID == m.ParentUUID && d.MIG.GIProfileID == m.GIProfileID && d.MIG.Start == m.Start
	})
}

// conflict reports whether two devices cannot be held by two claims at
// once: shares of a GPU coexist, MIG devices coexist when their placements
// do not overlap, admin access (monitoring) coexists with everything,
// everything else on the same GPU excludes.
func conflict(a, b checkpoint.Device) bool {
	if a.GPUUUID != b.GPUUUID || a.AdminAccess || b.AdminAccess {
		return false
	}
	switch {
	case a.Kind == checkpoint.KindShared && b.Kind == checkpoint.KindShared:
		return false
	case a.Kind == checkpoint.KindMIG && b.Kind == checkpoint.KindMIG:
		return a.MIG.Start < b.MIG.Start+b.MIG.Size && b.MIG.Start < a.MIG.Start+a.MIG.Size
	}
	return true
}

// apply runs the side effects of a planned claim and fills in what they
// produced (instance IDs, CDI IDs, the MPS daemon). Caller holds mu.
func (p *Plugin) apply(ctx context.Context, rec *checkpoint.Claim, report *claimReport) error {
	ref := rec.Namespace + "/" + rec.Name
	cdiDevices := make([]cdi.Device, 0, len(rec.Devices))
	for i := range rec.Devices {
		d := &rec.Devices[i]
		cd := cdi.Device{Name: cdiName(d)}
		var err error
		switch d.Kind {
		case checkpoint.KindGPU, checkpoint.KindShared:
			if d.Kind == checkpoint.KindGPU && !d.AdminAccess {
				if err := p.wholeGPUMode(ctx, d); err != nil {
					return fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
				}
			}
			if cd.Edits, err = p.driver.GPU(d.GPUUUID); err != nil {
				return fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
			}
		case checkpoint.KindMIG:
			if err := p.prepareMIG(ctx, d); err != nil {
				return fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
			}
			m := d.MIG
			if cd.Edits, err = p.driver.MIG(m.ParentUUID, m.ParentMinor, m.GIID, m.CIID); err != nil {
				return fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
			}
		}
		if s := d.Sharing; s != nil {
			switch configapi.SharingStrategy(s.Strategy) {
			case configapi.MPSStrategy:
				if s.ExclusiveProcess {
					if err := p.gpus.SetComputeMode(ctx, d.GPUUUID, sharing.ComputeExclusiveProcess); err != nil {
						return fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
					}
				}
			case configapi.TimeSlicingStrategy:
				// The interval is the GPU's: set once for all the claims that
				// time-slice it (timeSliceConflicts made sure they agree).
				if !p.otherUser(rec.UID, func(o *checkpoint.Device) bool { return timeSliced(o, d.GPUUUID) }) && !timeSlicedEarlier(rec, i) {
					if err := p.gpus.SetTimeSlice(ctx, d.GPUUUID, sharing.TimeSlice(s.TimeSliceInterval)); err != nil {
						return fmt.Errorf("claim %s: device %s: %w", ref, d.Device, err)
					}
				}
				p.opts.crashPoint("timeslice-set")
			}
		}
		cdiDevices = append(cdiDevices, cd)
	}
	var claimEdits cdispec.ContainerEdits
	if rec.MPS != nil {
		spec, err := p.daemonSpec(rec)
		if err != nil {
			return fmt.Errorf("claim %s: %w", ref, err)
		}
		daemon, err := p.sharing.Start(ctx, spec)
		if err != nil {
			return fmt.Errorf("claim %s: %w", ref, err)
		}
		p.opts.crashPoint("mps-started")
		if spec.StaticPartitioning {
			rec.MPS.SMPartitions, rec.MPS.SMPartitionChunks = []string{daemon.SMPartition}, []int{daemon.SMPartitionChunks}
		}
		report.corrected = daemon.Corrected
		env, mounts := sharing.ClientEdits(daemon)
		claimEdits.Env = env
		for _, m := range mounts {
			claimEdits.Mounts = append(claimEdits.Mounts, cdi.MountEdit(m))
		}
	}
	// The spec carries the completed record so that a plugin whose
	// checkpoint is lost can rebuild from the specs.
	final := *rec
	final.State = checkpoint.PrepareCompleted
	for i := range rec.Devices {
		// Every device gets its own edits and the driver's common edits
		// (spec-level edits of the base spec, applied once however many
		// devices carry the ID). Its own ID comes first: the kubelet names a
		// device by its first CDI ID in allocatedResourcesStatus, where the
		// common ID would name every device alike.
		rec.Devices[i].CDIDeviceIDs = []string{cdi.DeviceID(rec.UID, cdiDevices[i].Name), p.baseID}
	}
	final.Devices = rec.Devices
	raw, err := json.Marshal(final)
	if err != nil {
		return fmt.Errorf("claim %s: encode record: %w", ref, err)
	}
	if _, err := p.cdi.WriteClaim(rec.UID, raw, cdiDevices, claimEdits); err != nil {
		return err
	}
	p.opts.crashPoint("cdi-written")
	return nil
}

// prepareMIG makes the MIG device of d usable: the existing instance of a
// static device (found by its IDs), or a new instance at exactly the
// allocated placement, with MIG mode turned on first where it is off (a
// dynamic-MIG GPU's mode follows its claims). All under the GPU's lock,
// shared with the node agent.
func (p *Plugin) prepareMIG(ctx context.Context, d *checkpoint.Device) error {
	m := d.MIG
	unlock := p.locks.Lock(m.ParentUUID)
	defer unlock()
	if m.Static {
		inst, err := p.mig.FindByID(m.ParentUUID, m.GIID, m.CIID, m.GIProfileID, m.Start)
		if err != nil {
			return err
		}
		if inst == nil {
			return fmt.Errorf("the existing MIG instance %s at memory slice %d (GPU instance %d, compute instance %d) disappeared", m.Profile, m.Start, m.GIID, m.CIID)
		}
		return nil
	}
	if err := p.setMIGMode(ctx, d, true); err != nil {
		return err
	}
	giID, ciID, err := p.mig.Create(m.ParentUUID, m.GIProfileID, m.Start, m.Size, m.CIProfileID)
	if errors.Is(err, mig.ErrOccupied) {
		return fmt.Errorf("MIG profile %s at memory slice %d: %w (held outside this plugin's records)", m.Profile, m.Start, err)
	}
	if err != nil {
		return err
	}
	m.GIID, m.CIID, m.Created, m.BootID = giID, ciID, true, p.opts.BootID
	p.opts.crashPoint("mig-created")
	return nil
}

// wholeGPUMode turns MIG mode off for a whole GPU of a MIG-capable GPU (a
// dynamic-MIG GPU in MIG mode): CUDA sees no device on a GPU in MIG mode
// without instances. The exclusive-device guard has made sure that no
// other claim holds a device of this GPU; an instance that exists anyway
// (someone else's) is an error, never destroyed.
func (p *Plugin) wholeGPUMode(ctx context.Context, d *checkpoint.Device) error {
	g, ok := p.currentNode().GPUByUUID(d.GPUUUID)
	if !ok || !g.MigCapable {
		return nil
	}
	unlock := p.locks.Lock(d.GPUUUID)
	defer unlock()
	on, err := p.mig.MigEnabled(d.GPUUUID)
	if err != nil || !on {
		return err
	}
	list, err := p.mig.List(d.GPUUUID)
	if err != nil {
		return err
	}
	if len(list) > 0 {
		var in []string
		for _, i := range list {
			in = append(in, fmt.Sprintf("profile %d at %d (GPU instance %d)", i.GIProfileID, i.Start, i.GIID))
		}
		return fmt.Errorf("the whole GPU %d needs MIG mode off, but MIG instances exist that no claim of this plugin holds: %s", d.GPUMinor, strings.Join(in, ", "))
	}
	return p.setMIGMode(ctx, d, false)
}

// setMIGMode sets the MIG mode d needs. A change that would need a GPU
// reset is withdrawn (partition.SetMIGMode) and reported to the agent,
// which stops publishing the devices that need it. Caller holds the GPU's
// lock.
func (p *Plugin) setMIGMode(ctx context.Context, d *checkpoint.Device, enable bool) error {
	on, err := p.mig.MigEnabled(d.GPUUUID)
	if err != nil {
		return err
	}
	if on == enable {
		return nil
	}
	dev, ret := p.opts.NVML.DeviceGetHandleByUUID(d.GPUUUID)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", d.GPUUUID, ret)
	}
	mode, needs := nvml.DEVICE_MIG_DISABLE, contract.TypeGPU
	if enable {
		mode, needs = nvml.DEVICE_MIG_ENABLE, contract.TypeMIG
	}
	if err := partition.SetMIGMode(dev, mode); err != nil {
		err = fmt.Errorf("GPU %d (%s): %w", d.GPUMinor, d.GPUUUID, err)
		if errors.Is(err, partition.ErrResetNeeded) {
			p.event(corev1.EventTypeWarning, "MIGModeNeedsReset", "%v", err)
			if p.opts.Withdraw != nil {
				p.opts.Withdraw(d.GPUUUID, []contract.DeviceType{needs}, err.Error())
			}
		}
		return err
	}
	klog.FromContext(ctx).Info("Changed MIG mode for a claim", "gpu", d.GPUUUID, "migEnabled", enable, "device", d.Device)
	return nil
}

// cdiName is the device's name inside the claim's CDI spec: the DRA device
// name, plus the share ID for a share (a claim may hold two shares of one
// GPU).
func cdiName(d *checkpoint.Device) string {
	if d.ShareID != nil {
		return d.Device + "-" + strings.ReplaceAll(string(*d.ShareID), "/", "-")
	}
	return d.Device
}
