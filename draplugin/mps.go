package draplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
)

// claimReport collects, for one prepare, what the claim's status and
// Events say beyond the record.
type claimReport struct {
	// notes by device name: limits that were asked for but are not
	// enforced the way asked, and why.
	notes map[string][]string
	// corrected: limits an adopted daemon had changed, set back.
	corrected  []string
	mpsVersion int
}

func (r *claimReport) note(device, format string, args ...any) {
	if r.notes == nil {
		r.notes = map[string][]string{}
	}
	r.notes[device] = append(r.notes[device], fmt.Sprintf(format, args...))
}

func isMPS(d *checkpoint.Device) bool {
	return d.Sharing != nil && !d.AdminAccess && d.Sharing.Strategy == string(configapi.MPSStrategy)
}

// timeSliced says whether d time-slices the GPU gpu.
func timeSliced(d *checkpoint.Device, gpu string) bool {
	return d.GPUUUID == gpu && !d.AdminAccess && d.Sharing != nil && d.Sharing.Strategy == string(configapi.TimeSlicingStrategy)
}

// timeSlicedEarlier says whether a device of rec before index i
// time-slices the same GPU as device i (whose interval it set).
func timeSlicedEarlier(rec *checkpoint.Claim, i int) bool {
	for j := 0; j < i; j++ {
		if timeSliced(&rec.Devices[j], rec.Devices[i].GPUUUID) {
			return true
		}
	}
	return false
}

// timeSliceConflicts refuses a time-slice interval that differs from the
// one another claim (or another device of this claim) holds on the same
// GPU: the interval is the GPU's, so the second claim must fail, never
// change the first one's. Caller holds mu.
func (p *Plugin) timeSliceConflicts(rec *checkpoint.Claim) error {
	for i := range rec.Devices {
		d := &rec.Devices[i]
		if !timeSliced(d, d.GPUUUID) {
			continue
		}
		want := sharing.TimeSlice(d.Sharing.TimeSliceInterval)
		for j := 0; j < i; j++ {
			if o := &rec.Devices[j]; timeSliced(o, d.GPUUUID) && o.Sharing.TimeSliceInterval != d.Sharing.TimeSliceInterval {
				return fmt.Errorf("claim %s/%s: time-slice interval %s of device %s conflicts with interval %s of its device %s on the same GPU %d: the interval is the GPU's",
					rec.Namespace, rec.Name, want, d.Device, sharing.TimeSlice(o.Sharing.TimeSliceInterval), o.Device, d.GPUMinor)
			}
		}
		for _, other := range p.state.Claims {
			if other.UID == rec.UID {
				continue
			}
			for j := range other.Devices {
				o := &other.Devices[j]
				if timeSliced(o, d.GPUUUID) && o.Sharing.TimeSliceInterval != d.Sharing.TimeSliceInterval {
					return fmt.Errorf("time-slice interval %s of device %s for claim %s/%s conflicts with interval %s that claim %s/%s (uid %s) holds on GPU %d (%s) through device %s: the interval is the GPU's, one for all the claims that time-slice it; refusing to prepare",
						want, d.Device, rec.Namespace, rec.Name, sharing.TimeSlice(o.Sharing.TimeSliceInterval), other.Namespace, other.Name, other.UID, d.GPUMinor, d.GPUUUID, o.Device)
				}
			}
		}
	}
	return nil
}

// planMPS gives a claim with an MPS device its own daemon (rec.MPS) and
// decides static SM partitioning: what the installed MPS can do is asked
// of the tool; a Required partition it cannot make fails the claim, a
// Preferred one falls back to the thread percentage with a note. Caller
// holds mu.
func (p *Plugin) planMPS(ctx context.Context, rec *checkpoint.Claim, policies []*configapi.SMPartitionPolicy, report *claimReport) error {
	if !slices.ContainsFunc(rec.Devices, func(d checkpoint.Device) bool { return isMPS(&d) }) {
		return nil
	}
	rec.MPS = &checkpoint.ClaimDaemon{ID: string(rec.UID), Launcher: p.sharing.Launcher.Name()}
	served := map[string]bool{}
	for _, d := range rec.Devices {
		if !d.AdminAccess {
			served[d.Device] = true
		}
	}
	for i, policy := range policies {
		d := &rec.Devices[i]
		if policy == nil || !isMPS(d) {
			continue
		}
		caps := p.sharing.Capabilities(ctx)
		report.mpsVersion = caps.Version
		var reason string
		switch {
		case !caps.StaticPartitioning:
			reason = caps.Reason
		case len(served) != 1:
			reason = fmt.Sprintf("a static SM partition is made for a claim whose MPS daemon serves one device (CUDA_MPS_SM_PARTITION names one partition); this claim's serves %d", len(served))
		case d.Sharing.ActiveThreadPercentage <= 0:
			reason = "a static SM partition needs a compute share (the allocation's compute capacity or sharing.mps.activeThreadPercentage)"
		}
		if reason == "" {
			rec.MPS.StaticPartitioning = true
			continue
		}
		if *policy == configapi.SMPartitionRequired {
			return fmt.Errorf("device %s: sharing.mps.smPartition is Required, but %s", d.Device, reason)
		}
		report.note(d.Device, "static SM partition not made (smPartition Preferred), the compute share is an active thread percentage instead: %s", reason)
	}
	return nil
}

// daemonSpec builds the claim's daemon: every device of the claim that is
// not admin access (a container that reaches an MPS daemon sees only the
// daemon's devices), in the order CUDA enumerates them in a container (GPU
// minor, then MIG GPU and compute instance), each with its memory limit;
// two shares of one GPU are one device whose limit is their sum. MPS has
// one thread percentage per daemon: the smallest the claim's devices ask
// for. It fills rec.MPS and each MPS device's ordinal. Caller holds mu.
func (p *Plugin) daemonSpec(rec *checkpoint.Claim) (sharing.DaemonSpec, error) {
	type member struct {
		uuid     string
		minor    int
		gi, ci   uint32
		mib      int64
		devices  []*checkpoint.Device
		smPct    int32
		mpsInUse bool
	}
	var members []*member
	byUUID := map[string]*member{}
	for i := range rec.Devices {
		d := &rec.Devices[i]
		if d.AdminAccess {
			continue
		}
		uuid, gi, ci := d.GPUUUID, uint32(0), uint32(0)
		if d.Kind == checkpoint.KindMIG {
			var err error
			if uuid, err = p.mig.DeviceUUID(d.MIG.ParentUUID, d.MIG.GIID, d.MIG.CIID); err != nil {
				return sharing.DaemonSpec{}, fmt.Errorf("device %s: %w", d.Device, err)
			}
			gi, ci = d.MIG.GIID, d.MIG.CIID
		}
		m := byUUID[uuid]
		if m == nil {
			m = &member{uuid: uuid, minor: d.GPUMinor, gi: gi, ci: ci}
			byUUID[uuid] = m
			members = append(members, m)
		}
		m.devices = append(m.devices, d)
		if isMPS(d) {
			d.Sharing.MPSDevice = uuid
			m.mpsInUse = true
			if b := d.Sharing.PinnedMemoryLimitBytes; b > 0 {
				m.mib += max(b>>20, 1)
			}
			m.smPct += d.Sharing.ActiveThreadPercentage
		}
	}
	slices.SortStableFunc(members, func(a, b *member) int {
		if a.minor != b.minor {
			return a.minor - b.minor
		}
		if a.gi != b.gi {
			return int(a.gi) - int(b.gi)
		}
		return int(a.ci) - int(b.ci)
	})
	spec := sharing.DaemonSpec{ID: rec.MPS.ID, Claim: rec.Namespace + "/" + rec.Name, StaticPartitioning: rec.MPS.StaticPartitioning}
	var threads int32
	for i, m := range members {
		spec.Devices = append(spec.Devices, m.uuid)
		spec.PinnedMemoryMiB = append(spec.PinnedMemoryMiB, m.mib)
		for _, d := range m.devices {
			if !isMPS(d) {
				continue
			}
			d.Sharing.DeviceIndex = i
			if a := d.Sharing.ActiveThreadPercentage; a > 0 && (threads == 0 || a < threads) {
				threads = a
			}
		}
		if spec.StaticPartitioning {
			spec.SMPercent = min(m.smPct, 100)
		}
	}
	spec.ActiveThreadPercentage = threads
	rec.MPS.Devices, rec.MPS.PinnedMemoryMiB, rec.MPS.ActiveThreadPercentage = spec.Devices, spec.PinnedMemoryMiB, threads
	return spec, spec.Validate()
}

// specOf is the daemon spec a record was prepared with.
func specOf(rec *checkpoint.Claim) sharing.DaemonSpec {
	m := rec.MPS
	spec := sharing.DaemonSpec{ID: m.ID, Claim: rec.Namespace + "/" + rec.Name, Devices: m.Devices, PinnedMemoryMiB: m.PinnedMemoryMiB,
		ActiveThreadPercentage: m.ActiveThreadPercentage, StaticPartitioning: m.StaticPartitioning}
	if m.StaticPartitioning {
		for _, d := range rec.Devices {
			if isMPS(&d) {
				spec.SMPercent = min(spec.SMPercent+d.Sharing.ActiveThreadPercentage, 100)
			}
		}
	}
	return spec
}

// daemonName says where the claim's daemon runs, for its status.
func (p *Plugin) daemonName(id string) string {
	if l, ok := p.sharing.Launcher.(*sharing.PodLauncher); ok {
		return "pod " + l.Namespace + "/" + sharing.PodName(id)
	}
	return p.sharing.Launcher.Name()
}

// sharingStatus is what a device's status.devices[].data says.
func (p *Plugin) sharingStatus(rec *checkpoint.Claim, d *checkpoint.Device, report *claimReport) *configapi.SharingStatus {
	s := d.Sharing
	if s == nil || d.AdminAccess {
		return nil
	}
	st := &configapi.SharingStatus{Strategy: configapi.SharingStrategy(s.Strategy)}
	st.APIVersion, st.Kind = configapi.SchemeGroupVersion.String(), configapi.SharingStatusKind
	switch configapi.SharingStrategy(s.Strategy) {
	case configapi.TimeSlicingStrategy:
		st.TimeSlicing = &configapi.TimeSlicingStatus{Interval: intervalName(s.TimeSliceInterval)}
		if d.Kind == checkpoint.KindShared {
			st.NotEnforced = append(st.NotEnforced, "memory: time-slicing does not limit device memory; the share's memory is accounted by the scheduler only")
		}
	case configapi.MPSStrategy:
		if rec.MPS == nil {
			return nil
		}
		ms := &configapi.MPSStatus{Daemon: p.daemonName(rec.MPS.ID), DeviceOrdinal: s.DeviceIndex, MPSVersion: report.mpsVersion}
		if i := s.DeviceIndex; i < len(rec.MPS.PinnedMemoryMiB) && rec.MPS.PinnedMemoryMiB[i] > 0 {
			ms.PinnedDeviceMemoryLimit = resource.NewQuantity(rec.MPS.PinnedMemoryMiB[i]<<20, resource.BinarySI)
		}
		if rec.MPS.StaticPartitioning && len(rec.MPS.SMPartitions) > 0 {
			ms.SMPartition = &configapi.SMPartitionStatus{ID: rec.MPS.SMPartitions[0], Chunks: rec.MPS.SMPartitionChunks[0]}
		} else if rec.MPS.ActiveThreadPercentage > 0 {
			ms.ActiveThreadPercentage = ptr.To(rec.MPS.ActiveThreadPercentage)
		}
		if s.ExclusiveProcess {
			ms.ComputeMode = string(sharing.ComputeExclusiveProcess)
		}
		st.MPS = ms
		st.NotEnforced = append(st.NotEnforced, "memory is limited per CUDA process (MPS client): several processes of the claim on one device can each use the limit")
		if d.Kind == checkpoint.KindShared {
			st.NotEnforced = append(st.NotEnforced, "a process that avoids MPS (CUDA_MPS_PIPE_DIRECTORY pointed elsewhere) is not limited: the shared GPU stays in DEFAULT compute mode for the daemons of its other claims")
		}
	}
	st.NotEnforced = append(st.NotEnforced, report.notes[d.Device]...)
	return st
}

func intervalName(i int) configapi.TimeSliceInterval {
	for _, n := range []configapi.TimeSliceInterval{configapi.DefaultTimeSlice, configapi.ShortTimeSlice, configapi.MediumTimeSlice, configapi.LongTimeSlice} {
		if idx, _ := n.Index(); idx == i {
			return n
		}
	}
	return configapi.TimeSliceInterval(fmt.Sprint(i))
}

func claimRef(rec *checkpoint.Claim) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: resourceapi.SchemeGroupVersion.String(), Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID}
}

// report writes what was applied to the shared devices of a prepared claim
// into its status.devices (the entries of this driver; the node plugin's
// token may write them for claims allocated on its node) and Events the
// claim for what the user should know: memory a time-sliced share does not
// get enforced, a static partition that fell back, limits set back. A
// status that cannot be written is logged and evented, never a failed
// prepare.
func (p *Plugin) report(ctx context.Context, rec *checkpoint.Claim, report *claimReport) {
	if report == nil {
		report = &claimReport{}
	}
	var entries []resourceapi.AllocatedDeviceStatus
	for i := range rec.Devices {
		d := &rec.Devices[i]
		st := p.sharingStatus(rec, d, report)
		if st == nil {
			continue
		}
		raw, err := json.Marshal(st)
		if err != nil {
			continue
		}
		e := resourceapi.AllocatedDeviceStatus{Driver: DriverName, Pool: d.Pool, Device: d.Device, Data: &runtime.RawExtension{Raw: raw}}
		if d.ShareID != nil {
			e.ShareID = ptr.To(string(*d.ShareID))
		}
		entries = append(entries, e)
		if st.Strategy == configapi.TimeSlicingStrategy && d.Kind == checkpoint.KindShared {
			p.events.Eventf(claimRef(rec), corev1.EventTypeWarning, "MemoryNotEnforced",
				"device %s is time-sliced (interval %s): its memory share is accounted by the scheduler but not enforced on the GPU", d.Device, st.TimeSlicing.Interval)
		}
		for _, n := range report.notes[d.Device] {
			p.events.Eventf(claimRef(rec), corev1.EventTypeWarning, "SMPartitionUnavailable", "device %s: %s", d.Device, n)
		}
	}
	if len(report.corrected) > 0 {
		p.events.Eventf(claimRef(rec), corev1.EventTypeWarning, "MPSLimitsSetBack", "the claim's MPS control daemon ran with changed limits, set back: %s", strings.Join(report.corrected, "; "))
	}
	if len(entries) == 0 {
		return
	}
	if err := p.writeDeviceStatus(ctx, rec, entries); err != nil {
		klog.FromContext(ctx).Error(err, "Could not write the applied sharing limits into the claim's status", "claim", klog.KRef(rec.Namespace, rec.Name))
		p.events.Eventf(claimRef(rec), corev1.EventTypeWarning, "DeviceStatusNotWritten", "the applied sharing limits could not be written into status.devices: %v", err)
	}
}

// writeDeviceStatus replaces this driver's entries of the claim's
// status.devices (other drivers' stay). It reads and updates the claim,
// retrying on conflicts; a claim that is gone or no longer the prepared
// one (another UID) is left alone.
func (p *Plugin) writeDeviceStatus(ctx context.Context, rec *checkpoint.Claim, entries []resourceapi.AllocatedDeviceStatus) error {
	claims := p.opts.KubeClient.ResourceV1().ResourceClaims(rec.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := claims.Get(ctx, rec.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if c.UID != rec.UID {
			return nil
		}
		devices := slices.DeleteFunc(slices.Clone(c.Status.Devices), func(d resourceapi.AllocatedDeviceStatus) bool { return d.Driver == DriverName })
		devices = append(devices, entries...)
		if equality.Semantic.DeepEqual(devices, c.Status.Devices) {
			return nil
		}
		c.Status.Devices = devices
		_, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{FieldManager: DriverName})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// clearReport removes the plugin's status.devices entries of an
// unprepared claim (a claim that is gone is fine).
func (p *Plugin) clearReport(ctx context.Context, rec *checkpoint.Claim) {
	if !slices.ContainsFunc(rec.Devices, func(d checkpoint.Device) bool { return d.Sharing != nil && !d.AdminAccess }) {
		return
	}
	if err := p.writeDeviceStatus(ctx, rec, nil); err != nil {
		klog.FromContext(ctx).V(2).Info("Could not remove the sharing status of an unprepared claim", "claim", klog.KRef(rec.Namespace, rec.Name), "err", err)
	}
}
