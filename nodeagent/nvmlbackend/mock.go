package nvmlbackend

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// supportedEvents is what the mock GPUs report from GetSupportedEventTypes.
const supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// Mock is a go-nvml mock DGX server whose gaps (go-nvml v0.13.4-1) are filled
// so that every node-side path of tessera runs on it:
//   - GPU instances are created only in MIG mode, only at a placement NVML
//     lists for the profile, and never over an occupied one
//     (ERROR_INSUFFICIENT_RESOURCES, as the real library does);
//     destroying a GPU instance that still has compute instances is ERROR_IN_USE;
//   - GetGpuInstanceById, GetComputeInstanceById, GetMaxMigDeviceCount and
//     GetMigDeviceHandleByIndex exist, the latter returning MIG device handles
//     with their own MIG-<uuid> so that go-nvlib's GetMigDevices works;
//   - GetPciInfo fills BusId, GetAttributes answers for whole GPUs;
//   - EventSetCreate returns an event set into which InjectXID / InjectECC
//     deliver events, and SetLost makes a GPU answer ERROR_GPU_IS_LOST.
//
// A Mock is safe for concurrent use.
type Mock struct {
	*server.Server
	// Machine is the mock machine name, e.g. "dgxh100".
	Machine string

	mu        sync.Mutex
	eventSets map[*eventSet]struct{}
	lost      map[*server.Device]bool
	migs      map[*server.ComputeInstance]*MigDevice
}

var _ nvml.Interface = (*Mock)(nil)

// NewMock builds a mock machine ("dgxa100", "dgxh100", "dgxh200", "dgxb200")
// with n GPUs of its model.
func NewMock(machine string, n int) (*Mock, error) {
	def, ok := mockMachines[machine]
	if !ok {
		return nil, fmt.Errorf("unknown mock machine %q (want one of %v)", machine, MockMachines())
	}
	srv, err := server.New(
		server.WithGPUs(gpus.Multiple(n, def.gpu)...),
		server.WithDriverVersion(def.driver),
		server.WithNVMLVersion(def.nvmlVer),
		server.WithCUDADriverVersion(def.cuda),
	)
	if err != nil {
		return nil, fmt.Errorf("build mock %s: %w", machine, err)
	}
	m := &Mock{
		Server:    srv,
		Machine:   machine,
		eventSets: map[*eventSet]struct{}{},
		lost:      map[*server.Device]bool{},
		migs:      map[*server.ComputeInstance]*MigDevice{},
	}
	m.fillServer()
	for _, d := range srv.Devices {
		m.fillDevice(d.(*server.Device))
	}
	return m, nil
}

// GPUs returns the mock's GPU devices in index order.
func (m *Mock) GPUs() []*server.Device {
	out := make([]*server.Device, 0, len(m.Devices))
	for _, d := range m.Devices {
		out = append(out, d.(*server.Device))
	}
	return out
}

func (m *Mock) device(uuid string) (*server.Device, error) {
	for _, d := range m.Devices {
		if d.(*server.Device).UUID == uuid {
			return d.(*server.Device), nil
		}
	}
	return nil, fmt.Errorf("mock %s has no GPU %q", m.Machine, uuid)
}

// InjectXID delivers an XID critical error event for the GPU with this UUID to
// every event set registered for XID events on it. It is the test seam for the
// health path, since the go-nvml mock has no event source.
func (m *Mock) InjectXID(gpuUUID string, xid uint64) error {
	return m.inject(gpuUUID, nvml.EventTypeXidCriticalError, xid)
}

// InjectECC delivers a double-bit (or single-bit) ECC error event.
func (m *Mock) InjectECC(gpuUUID string, doubleBit bool) error {
	typ := uint64(nvml.EventTypeSingleBitEccError)
	if doubleBit {
		typ = nvml.EventTypeDoubleBitEccError
	}
	return m.inject(gpuUUID, typ, 0)
}

func (m *Mock) inject(gpuUUID string, typ, data uint64) error {
	d, err := m.device(gpuUUID)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delivered := 0
	for es := range m.eventSets {
		es.mu.Lock()
		mask := es.registered[d]
		es.mu.Unlock()
		if mask&typ == 0 {
			continue
		}
		select {
		case es.events <- nvml.EventData{Device: d, EventType: typ, EventData: data, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}:
			delivered++
		default:
			return fmt.Errorf("event set of GPU %s is full", gpuUUID)
		}
	}
	if delivered == 0 {
		return fmt.Errorf("no event set is registered for event type %#x on GPU %s", typ, gpuUUID)
	}
	return nil
}

// SetLost makes the GPU answer ERROR_GPU_IS_LOST (lost=true) or work again.
func (m *Mock) SetLost(gpuUUID string, lost bool) error {
	d, err := m.device(gpuUUID)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost[d] = lost
	return nil
}

func (m *Mock) isLost(d *server.Device) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost[d]
}

func (m *Mock) fillServer() {
	byUUID := m.DeviceGetHandleByUUIDFunc
	m.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		if d, ret := byUUID(id); ret == nvml.SUCCESS {
			return d, ret
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, mig := range m.migs {
			if mig.UUID == id {
				return mig, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		es := &eventSet{mock: m, events: make(chan nvml.EventData, 64), registered: map[*server.Device]uint64{}, done: make(chan struct{})}
		es.WaitFunc = es.wait
		es.FreeFunc = es.free
		m.mu.Lock()
		m.eventSets[es] = struct{}{}
		m.mu.Unlock()
		return es, nvml.SUCCESS
	}
	m.EventSetWaitFunc = func(set nvml.EventSet, timeoutms uint32) (nvml.EventData, nvml.Return) {
		return set.Wait(timeoutms)
	}
	m.EventSetFreeFunc = func(set nvml.EventSet) nvml.Return { return set.Free() }
}

// fullProfile is the GPU instance profile that spans the whole GPU (most slices).
func fullProfile(cfg gpus.Config) (nvml.GpuInstanceProfileInfo, bool) {
	var best nvml.GpuInstanceProfileInfo
	found := false
	for _, p := range cfg.MIGProfiles.GpuInstanceProfiles {
		if !found || p.SliceCount > best.SliceCount || (p.SliceCount == best.SliceCount && p.MultiprocessorCount > best.MultiprocessorCount) {
			best, found = p, true
		}
	}
	return best, found
}

func (m *Mock) fillDevice(d *server.Device) {
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{PciDeviceId: d.Config.PciDeviceId, Bus: uint32(d.Index)}
		for i := 0; i < len(d.PciBusID) && i < len(p.BusId)-1; i++ {
			p.BusId[i] = int8(d.PciBusID[i])
		}
		return p, nvml.SUCCESS
	}
	memInfo := d.GetMemoryInfoFunc
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if m.isLost(d) {
			return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
		}
		return memInfo()
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		full, ok := fullProfile(d.Config)
		if !ok {
			return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.DeviceAttributes{
			MultiprocessorCount:   full.MultiprocessorCount,
			SharedCopyEngineCount: full.CopyEngineCount,
			SharedDecoderCount:    full.DecoderCount,
			SharedEncoderCount:    full.EncoderCount,
			SharedJpegCount:       full.JpegCount,
			SharedOfaCount:        full.OfaCount,
			MemorySizeMB:          d.Config.MemoryMB,
		}, nvml.SUCCESS
	}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return supportedEvents, nvml.SUCCESS }
	d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		es, ok := set.(*eventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if mask&^supportedEvents != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		es.mu.Lock()
		es.registered[d] |= mask
		es.mu.Unlock()
		return nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		d.Lock()
		defer d.Unlock()
		if mode == nvml.DEVICE_MIG_DISABLE && len(d.GpuInstances) > 0 {
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		d.MigMode = mode
		return nvml.SUCCESS, nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		max := 0
		for _, p := range d.Config.MIGProfiles.GpuInstanceProfiles {
			max = maxInt(max, int(p.InstanceCount))
		}
		return max, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		for gi := range d.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.GetMigDeviceHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
		migs := m.migDevices(d)
		if index < 0 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if index >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[index], nvml.SUCCESS
	}
	d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		n := 0
		for _, p := range d.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)] {
			if m.placementFreeLocked(d, info, p) == nvml.SUCCESS {
				n++
			}
		}
		return n, nvml.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, placement *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if info == nil || placement == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		d.Lock()
		defer d.Unlock()
		if ret := m.placementFreeLocked(d, info, *placement); ret != nvml.SUCCESS {
			return nil, ret
		}
		return m.createGpuInstanceLocked(d, info, *placement), nvml.SUCCESS
	}
	d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		d.Lock()
		defer d.Unlock()
		var last nvml.Return = nvml.ERROR_INSUFFICIENT_RESOURCES
		for _, p := range d.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)] {
			if last = m.placementFreeLocked(d, info, p); last == nvml.SUCCESS {
				return m.createGpuInstanceLocked(d, info, p), nvml.SUCCESS
			}
		}
		return nil, last
	}
}

// placementFreeLocked reports whether a GPU instance of the profile can be
// created at the placement; the caller holds d's lock.
func (m *Mock) placementFreeLocked(d *server.Device, info *nvml.GpuInstanceProfileInfo, p nvml.GpuInstancePlacement) nvml.Return {
	if d.MigMode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	profile, ok := d.Config.MIGProfiles.GpuInstanceProfiles[int(info.Id)]
	if !ok {
		return nvml.ERROR_NOT_SUPPORTED
	}
	if !slices.Contains(d.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)], p) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	same := 0
	for gi := range d.GpuInstances {
		q := gi.Info.Placement
		if p.Start < q.Start+q.Size && q.Start < p.Start+p.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if gi.Info.ProfileId == info.Id {
			same++
		}
	}
	if same >= int(profile.InstanceCount) {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

func (m *Mock) createGpuInstanceLocked(d *server.Device, info *nvml.GpuInstanceProfileInfo, p nvml.GpuInstancePlacement) *server.GpuInstance {
	gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{
		Device:    d,
		Id:        d.GpuInstanceCounter,
		ProfileId: info.Id,
		Placement: p,
	}, d.Config.MIGProfiles)
	d.GpuInstanceCounter++
	d.GpuInstances[gi] = struct{}{}

	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		gi.RLock()
		defer gi.RUnlock()
		for ci := range gi.ComputeInstances {
			if int(ci.Info.Id) == id {
				return ci, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	createCI := gi.CreateComputeInstanceFunc
	gi.CreateComputeInstanceFunc = func(ciInfo *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		if ciInfo == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		// The real library refuses compute instances that exceed the GPU
		// instance's slices; tessera creates one full-size CI per GI.
		gi.RLock()
		used := uint32(0)
		for ci := range gi.ComputeInstances {
			if p, ok := gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(ci.Info.ProfileId)]; ok {
				used += p.SliceCount
			}
		}
		gi.RUnlock()
		giProfile := gi.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
		if used+ciInfo.SliceCount > giProfile.SliceCount {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		ci, ret := createCI(ciInfo)
		if ret != nvml.SUCCESS {
			return ci, ret
		}
		sci := ci.(*server.ComputeInstance)
		destroyCI := sci.DestroyFunc
		sci.DestroyFunc = func() nvml.Return {
			ret := destroyCI()
			if ret == nvml.SUCCESS {
				m.mu.Lock()
				delete(m.migs, sci)
				m.mu.Unlock()
			}
			return ret
		}
		return ci, nvml.SUCCESS
	}
	gi.DestroyFunc = func() nvml.Return {
		gi.RLock()
		busy := len(gi.ComputeInstances) > 0
		gi.RUnlock()
		if busy {
			return nvml.ERROR_IN_USE
		}
		d.Lock()
		defer d.Unlock()
		if _, ok := d.GpuInstances[gi]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		delete(d.GpuInstances, gi)
		return nvml.SUCCESS
	}
	return gi
}

// migDevices returns the MIG device handles of a GPU, ordered by GPU instance
// and compute instance ID, creating handles for new compute instances.
func (m *Mock) migDevices(d *server.Device) []*MigDevice {
	type pair struct {
		gi *server.GpuInstance
		ci *server.ComputeInstance
	}
	var pairs []pair
	d.RLock()
	for gi := range d.GpuInstances {
		gi.RLock()
		for ci := range gi.ComputeInstances {
			pairs = append(pairs, pair{gi, ci})
		}
		gi.RUnlock()
	}
	d.RUnlock()
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].gi.Info.Id != pairs[j].gi.Info.Id {
			return pairs[i].gi.Info.Id < pairs[j].gi.Info.Id
		}
		return pairs[i].ci.Info.Id < pairs[j].ci.Info.Id
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*MigDevice, 0, len(pairs))
	for _, p := range pairs {
		mig, ok := m.migs[p.ci]
		if !ok {
			mig = newMigDevice(d, p.gi, p.ci)
			m.migs[p.ci] = mig
		}
		out = append(out, mig)
	}
	return out
}

// MigDevice is the device handle of one MIG device (a compute instance inside
// a GPU instance) of a Mock.
type MigDevice struct {
	mock.Device
	Parent *server.Device
	GI     *server.GpuInstance
	CI     *server.ComputeInstance
	UUID   string
}

func newMigDevice(parent *server.Device, gi *server.GpuInstance, ci *server.ComputeInstance) *MigDevice {
	mig := &MigDevice{Parent: parent, GI: gi, CI: ci, UUID: "MIG-" + uuid.New().String()}
	giProfile := gi.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
	ciProfile := gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(ci.Info.ProfileId)]
	mig.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	mig.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	mig.GetUUIDFunc = func() (string, nvml.Return) { return mig.UUID, nvml.SUCCESS }
	mig.GetNameFunc = func() (string, nvml.Return) { return parent.Config.Name, nvml.SUCCESS }
	mig.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(gi.Info.Id), nvml.SUCCESS }
	mig.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(ci.Info.Id), nvml.SUCCESS }
	mig.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := giProfile.MemorySizeMB * 1024 * 1024
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	mig.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount:       ciProfile.MultiprocessorCount,
			SharedCopyEngineCount:     ciProfile.SharedCopyEngineCount,
			SharedDecoderCount:        ciProfile.SharedDecoderCount,
			SharedEncoderCount:        ciProfile.SharedEncoderCount,
			SharedJpegCount:           ciProfile.SharedJpegCount,
			SharedOfaCount:            ciProfile.SharedOfaCount,
			GpuInstanceSliceCount:     giProfile.SliceCount,
			ComputeInstanceSliceCount: ciProfile.SliceCount,
			MemorySizeMB:              giProfile.MemorySizeMB,
		}, nvml.SUCCESS
	}
	return mig
}

// eventSet is a mock nvml.EventSet fed by Mock.inject.
type eventSet struct {
	mock.EventSet
	mock       *Mock
	events     chan nvml.EventData
	done       chan struct{}
	freeOnce   sync.Once
	mu         sync.Mutex
	registered map[*server.Device]uint64
}

func (es *eventSet) wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
	timer := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer timer.Stop()
	select {
	case ev := <-es.events:
		return ev, nvml.SUCCESS
	case <-es.done:
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	case <-timer.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (es *eventSet) free() nvml.Return {
	es.freeOnce.Do(func() {
		es.mock.mu.Lock()
		delete(es.mock.eventSets, es)
		es.mock.mu.Unlock()
		close(es.done)
	})
	return nvml.SUCCESS
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
