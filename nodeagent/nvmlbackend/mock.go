package nvmlbackend

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// supportedEvents is what the modelled GPUs report from GetSupportedEventTypes.
const supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// Mock is a model of a machine's GPUs as NVML shows them, faithful to the
// NVML semantics tessera relies on:
//
//   - products and their MIG profiles, placements, memory, SMs, engines
//     and instance limits come from NVIDIA's tables (products.go);
//     nvmlGpuInstanceProfileInfo_t.id is the real profile ID (19 for 1g),
//     not the profile index;
//   - MIG mode has a current and a pending value: a change takes effect at
//     once on an idle GPU, and stays pending (needing a GPU reset) while a
//     process holds the GPU (HoldGPU: nvidia-persistenced, DCGM, a CUDA
//     process) — SetMigMode then reports the activation status
//     ERROR_IN_USE; MIG mode cannot be turned off while GPU instances exist;
//   - GPU instances only in MIG mode, only at a placement NVML lists, never
//     over an occupied memory slice and never beyond the profile's instance
//     count (ERROR_INSUFFICIENT_RESOURCES); GPU instance IDs follow the
//     placement (7g → 0; size-4 placements → 1, 2; size 2 → 3..6; size 1 →
//     7..14: the driver's 15 GPU-instance slots), compute instance IDs are
//     the lowest free in their GPU instance; destroying a GPU instance that
//     has compute instances is ERROR_IN_USE;
//   - MIG device handles with their own MIG-<uuid>, found by
//     DeviceGetHandleByUUID and GetMigDeviceHandleByIndex;
//   - a lost GPU (SetLost, XID 79) answers ERROR_GPU_IS_LOST to handle
//     lookups and every query; a GPU reset (ResetGPU, or coming back from
//     lost) applies a pending MIG mode, destroys its MIG instances and drops
//     its event registrations, as the driver does;
//   - an event set into which InjectXID / InjectECC deliver events;
//   - nvmlDeviceGetAttributes answers for MIG device handles only, as
//     documented.
//
// What a container sees given its CDI edits is ContainerView; the driver
// installation (libraries, binaries, device nodes, /proc and /sys) of the
// machine is DriverRoot. Failures the driver can produce are injected with
// FailCall.
//
// A Mock is safe for concurrent use; one mutex guards all of its state.
type Mock struct {
	mock.Interface
	// Machine is the mock machine name, e.g. "dgxh100".
	Machine string

	driverVersion string
	nvmlVersion   string
	cudaVersion   int

	mu        sync.Mutex
	inits     int
	gpus      []*GPU
	eventSets map[*eventSet]struct{}
	faults    []*fault
	root      *driverRoot
	control   []net.Listener       // ServeControl's sockets (tests only)
	holds     map[string]*callHold // armed holds by method (tests only, hold.go)
	statePath string               // the driver state's file (UseStateFile, state.go); "" keeps it in memory
}

var _ nvml.Interface = (*Mock)(nil)

// GPU is one modelled physical GPU. Its exported fields are fixed at
// creation; its state is read through NVML calls.
type GPU struct {
	mock.Device
	m       *Mock
	Product *Product
	Index   int
	Minor   int
	UUID    string
	// PCIBusID as NVML reports it ("00000000:18:00.0").
	PCIBusID string

	// State, guarded by m.mu.
	migCurrent, migPending int
	holders                int
	lost                   bool
	resets                 int
	gis                    map[uint32]*GpuInstance
}

// GpuInstance is one modelled MIG GPU instance.
type GpuInstance struct {
	mock.GpuInstance
	gpu       *GPU
	ID        uint32
	Profile   *Profile
	Placement nvml.GpuInstancePlacement
	cis       map[uint32]*ComputeInstance
	gone      bool
}

// ComputeInstance is one modelled compute instance, which with its GPU
// instance forms a MIG device.
type ComputeInstance struct {
	mock.ComputeInstance
	gi        *GpuInstance
	ID        uint32
	profile   computeProfile
	Placement nvml.ComputeInstancePlacement
	mig       *MigDevice
	gone      bool
}

// machine is one mock machine: its GPU product and driver.
type machine struct {
	product  *Product
	driver   string
	nvmlVer  string
	cuda     int
	busIDs   []string // PCI bus numbers of the first GPUs, as on the real machine
	fallback int      // first bus number of further GPUs
}

// mockMachines maps a mock machine name to its GPUs and driver.
var mockMachines = map[string]machine{
	// DGX A100 (320GB): 8 × A100-SXM4-40GB.
	"dgxa100": {&a100_40gb, "550.54.15", "12.550.54.15", 12040, []string{"07", "0f", "47", "4e", "87", "90", "b7", "bd"}, 0xc0},
	// DGX A100 (640GB): 8 × A100-SXM4-80GB.
	"dgxa100-80gb": {&a100_80gb, "550.54.15", "12.550.54.15", 12040, []string{"07", "0f", "47", "4e", "87", "90", "b7", "bd"}, 0xc0},
	"dgxh100":      {&h100_80gb, "550.54.15", "12.550.54.15", 12040, []string{"18", "2a", "3a", "5d", "9a", "ab", "ba", "db"}, 0xe0},
	"dgxh200":      {&h200_141gb, "550.90.07", "12.550.90.07", 12040, []string{"18", "2a", "3a", "5d", "9a", "ab", "ba", "db"}, 0xe0},
	"dgxb200":      {&b200_180gb, "570.124.06", "12.570.124.06", 12080, []string{"1b", "43", "52", "61", "9d", "c3", "d1", "df"}, 0xe4},
}

// MockMachines lists the machine names a mock spec accepts.
func MockMachines() []string {
	return []string{"dgxa100", "dgxa100-80gb", "dgxh100", "dgxh200", "dgxb200"}
}

// MachineProduct is the GPU product of a mock machine.
func MachineProduct(machine string) (*Product, bool) {
	m, ok := mockMachines[machine]
	return m.product, ok
}

// NewMock builds a mock machine with n GPUs of its product.
func NewMock(machineName string, n int) (*Mock, error) {
	def, ok := mockMachines[machineName]
	if !ok {
		return nil, fmt.Errorf("unknown mock machine %q (want one of %v)", machineName, MockMachines())
	}
	if n < 1 || n > 64 {
		return nil, fmt.Errorf("mock %s: %d GPUs (want 1 to 64)", machineName, n)
	}
	m := &Mock{
		Machine:       machineName,
		driverVersion: def.driver,
		nvmlVersion:   def.nvmlVer,
		cudaVersion:   def.cuda,
		eventSets:     map[*eventSet]struct{}{},
		inits:         1,
	}
	for i := 0; i < n; i++ {
		bus := fmt.Sprintf("%02x", def.fallback+i-len(def.busIDs))
		if i < len(def.busIDs) {
			bus = def.busIDs[i]
		}
		m.addGPU(def.product, i, strings.ToUpper(bus))
	}
	m.setInterfaceFuncs()
	return m, nil
}

// NewMockProducts builds a machine with one GPU of each product key (see
// Products), e.g. a MIG-capable GPU beside one that is not.
func NewMockProducts(driverVersion string, cuda int, keys ...string) (*Mock, error) {
	m := &Mock{Machine: "custom", driverVersion: driverVersion, nvmlVersion: "12." + driverVersion, cudaVersion: cuda, eventSets: map[*eventSet]struct{}{}, inits: 1}
	for i, k := range keys {
		p, ok := Products[k]
		if !ok {
			return nil, fmt.Errorf("unknown product %q", k)
		}
		m.addGPU(p, i, fmt.Sprintf("%02X", 0x10+i*0x10))
	}
	m.setInterfaceFuncs()
	return m, nil
}

func (m *Mock) addGPU(p *Product, i int, bus string) {
	g := &GPU{m: m, Product: p, Index: i, Minor: i, UUID: "GPU-" + uuid.New().String(),
		PCIBusID: "00000000:" + bus + ":00.0", gis: map[uint32]*GpuInstance{}}
	m.gpus = append(m.gpus, g)
}

// setSerial gives the GPUs the UUIDs of the machine named serial: the same
// for every mock of that name (name-based UUIDs, RFC 9562 version 5).
func (m *Mock) setSerial(serial string) {
	for _, g := range m.gpus {
		g.UUID = "GPU-" + uuid.NewSHA1(uuid.NameSpaceOID, []byte(serial+"/"+strconv.Itoa(g.Index))).String()
	}
}

// GPUs returns the machine's GPUs in index order.
func (m *Mock) GPUs() []*GPU { return slices.Clone(m.gpus) }

// GPU returns the GPU with this UUID.
func (m *Mock) GPU(uuid string) (*GPU, error) {
	for _, g := range m.gpus {
		if g.UUID == uuid {
			return g, nil
		}
	}
	return nil, fmt.Errorf("mock %s has no GPU %q", m.Machine, uuid)
}

// DriverVersion is the modelled driver version ("550.54.15").
func (m *Mock) DriverVersion() string { return m.driverVersion }

func (m *Mock) setInterfaceFuncs() {
	m.InitFunc = func() nvml.Return {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.inits++
		return nvml.SUCCESS
	}
	m.ShutdownFunc = func() nvml.Return {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.inits == 0 {
			return nvml.ERROR_UNINITIALIZED
		}
		m.inits--
		if m.inits == 0 && m.root != nil {
			m.root.remove()
			m.root = nil
		}
		if m.inits == 0 {
			m.closeControlLocked()
			m.releaseAllLocked()
		}
		return nvml.SUCCESS
	}
	m.ExtensionsFunc = func() nvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
	}
	m.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return m.driverVersion, nvml.SUCCESS }
	m.SystemGetNVMLVersionFunc = func() (string, nvml.Return) { return m.nvmlVersion, nvml.SUCCESS }
	m.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return m.cudaVersion, nvml.SUCCESS }
	m.SystemGetCudaDriverVersion_v2Func = m.SystemGetCudaDriverVersionFunc
	m.DeviceGetCountFunc = func() (int, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.inits == 0 {
			return 0, nvml.ERROR_UNINITIALIZED
		}
		// A lost GPU is still counted; its handle is not available.
		return len(m.gpus), nvml.SUCCESS
	}
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.inits == 0 {
			return nil, nvml.ERROR_UNINITIALIZED
		}
		if i < 0 || i >= len(m.gpus) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if m.gpus[i].lost {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return m.gpus[i], nvml.SUCCESS
	}
	m.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.inits == 0 {
			return nil, nvml.ERROR_UNINITIALIZED
		}
		for _, g := range m.gpus {
			if g.UUID == id {
				if g.lost {
					return nil, nvml.ERROR_GPU_IS_LOST
				}
				return g, nvml.SUCCESS
			}
			for _, gi := range g.gis {
				for _, ci := range gi.cis {
					if ci.mig != nil && ci.mig.UUID == id {
						if g.lost {
							return nil, nvml.ERROR_GPU_IS_LOST
						}
						return ci.mig, nvml.SUCCESS
					}
				}
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.DeviceGetHandleByPciBusIdFunc = func(busID string) (nvml.Device, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, g := range m.gpus {
			if strings.EqualFold(g.PCIBusID, busID) || strings.EqualFold(strings.TrimPrefix(g.PCIBusID, "0000"), busID) {
				if g.lost {
					return nil, nvml.ERROR_GPU_IS_LOST
				}
				return g, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		es := &eventSet{mock: m, events: make(chan nvml.EventData, 64), registered: map[*GPU]registration{}, done: make(chan struct{})}
		m.mu.Lock()
		m.eventSets[es] = struct{}{}
		m.mu.Unlock()
		return es, nvml.SUCCESS
	}
	m.EventSetWaitFunc = func(set nvml.EventSet, timeoutms uint32) (nvml.EventData, nvml.Return) {
		return set.Wait(timeoutms)
	}
	m.EventSetFreeFunc = func(set nvml.EventSet) nvml.Return { return set.Free() }
	m.ErrorStringFunc = func(r nvml.Return) string { return r.Error() }
}

// --- test seams: the things that happen to real GPUs ---

// HoldGPU sets how many processes (nvidia-persistenced, DCGM, CUDA
// applications) hold the GPU open. While one does, a MIG mode change stays
// pending until a GPU reset, and a reset is refused.
func (m *Mock) HoldGPU(gpuUUID string, processes int) error {
	g, err := m.GPU(gpuUUID)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.holders = processes
	return nil
}

// ResetGPU resets the GPU as `nvidia-smi -r` does: a pending MIG mode takes
// effect, every MIG instance is destroyed and NVML event registrations of
// the GPU are dropped. It fails with ERROR_IN_USE while processes hold the
// GPU.
func (m *Mock) ResetGPU(gpuUUID string) nvml.Return {
	g, err := m.GPU(gpuUUID)
	if err != nil {
		return nvml.ERROR_NOT_FOUND
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if g.holders > 0 {
		return nvml.ERROR_IN_USE
	}
	g.resetLocked()
	return nvml.SUCCESS
}

func (g *GPU) resetLocked() {
	g.migCurrent = g.migPending
	for id, gi := range g.gis {
		for _, ci := range gi.cis {
			ci.gone = true
		}
		gi.gone = true
		delete(g.gis, id)
		g.m.capsChangedLocked(g, gi, nil, false)
	}
	g.resets++
	g.m.stateChangedLocked()
}

// SetLost makes the GPU fall off the bus (ERROR_GPU_IS_LOST everywhere) or
// come back. Coming back is a GPU reset: pending MIG mode applies, MIG
// instances and event registrations are gone.
func (m *Mock) SetLost(gpuUUID string, lost bool) error {
	g, err := m.GPU(gpuUUID)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if g.lost && !lost {
		g.resetLocked()
	}
	g.lost = lost
	return nil
}

// InjectXID delivers an XID critical error event for the GPU to every event
// set that registered XID events on it since its last reset. XID 79 (fallen
// off the bus) also makes the GPU lost.
func (m *Mock) InjectXID(gpuUUID string, xid uint64) error {
	if err := m.inject(gpuUUID, nvml.EventTypeXidCriticalError, xid); err != nil {
		return err
	}
	if xid == 79 {
		return m.SetLost(gpuUUID, true)
	}
	return nil
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
	g, err := m.GPU(gpuUUID)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delivered := 0
	for es := range m.eventSets {
		r, ok := es.registered[g]
		if !ok || r.mask&typ == 0 || r.resets != g.resets {
			continue // not registered, or registered before the last reset
		}
		select {
		case es.events <- nvml.EventData{Device: g, EventType: typ, EventData: data, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}:
			delivered++
		default:
			return fmt.Errorf("event set of GPU %s is full", gpuUUID)
		}
	}
	if delivered == 0 {
		return fmt.Errorf("no event set is registered for event type %#x on GPU %s (since its last reset)", typ, gpuUUID)
	}
	return nil
}

// fault makes the n-th next call of a method on a GPU fail.
type fault struct {
	gpu    string
	method string
	skip   int
	ret    nvml.Return
}

// FailCall makes the call of method ("CreateGpuInstanceWithPlacement",
// "SetMigMode", "CreateComputeInstance", "Destroy" …) on the GPU fail with
// ret after skip successful calls, once — a driver error at exactly that
// point.
func (m *Mock) FailCall(gpuUUID, method string, skip int, ret nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = append(m.faults, &fault{gpu: gpuUUID, method: method, skip: skip, ret: ret})
}

// failLocked reports an injected failure for the call. Caller holds mu.
func (m *Mock) failLocked(g *GPU, method string) nvml.Return {
	for i, f := range m.faults {
		if f.gpu != g.UUID || f.method != method {
			continue
		}
		if f.skip > 0 {
			f.skip--
			return nvml.SUCCESS
		}
		m.faults = append(m.faults[:i], m.faults[i+1:]...)
		return f.ret
	}
	return nvml.SUCCESS
}

// --- the GPU's NVML methods ---

// check is the common prologue: the GPU must answer. Caller holds mu.
func (g *GPU) check() nvml.Return {
	if g.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

func (g *GPU) lock() func() { g.m.mu.Lock(); return g.m.mu.Unlock }

func (g *GPU) GetIndex() (int, nvml.Return) {
	defer g.lock()()
	return g.Index, g.check()
}

func (g *GPU) GetMinorNumber() (int, nvml.Return) {
	defer g.lock()()
	return g.Minor, g.check()
}

func (g *GPU) GetUUID() (string, nvml.Return) {
	defer g.lock()()
	return g.UUID, g.check()
}

func (g *GPU) GetName() (string, nvml.Return) {
	defer g.lock()()
	return g.Product.Name, g.check()
}

func (g *GPU) GetBrand() (nvml.BrandType, nvml.Return) {
	defer g.lock()()
	return g.Product.Brand, g.check()
}

func (g *GPU) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	defer g.lock()()
	return g.Product.Architecture, g.check()
}

func (g *GPU) GetCudaComputeCapability() (int, int, nvml.Return) {
	defer g.lock()()
	return g.Product.CudaMajor, g.Product.CudaMinor, g.check()
}

func (g *GPU) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	defer g.lock()()
	total := g.Product.MemoryMiB << 20
	return nvml.Memory{Total: total, Free: total}, g.check()
}

func (g *GPU) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	defer g.lock()()
	p := nvml.PciInfo{PciDeviceId: g.Product.PCIDeviceID}
	for i := 0; i < len(g.PCIBusID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(g.PCIBusID[i])
	}
	legacy := strings.TrimPrefix(g.PCIBusID, "0000")
	for i := 0; i < len(legacy) && i < len(p.BusIdLegacy)-1; i++ {
		p.BusIdLegacy[i] = int8(legacy[i])
	}
	var bus uint32
	_, _ = fmt.Sscanf(g.PCIBusID, "00000000:%02X", &bus)
	p.Bus = bus
	return p, g.check()
}

func (g *GPU) GetComputeMode() (nvml.ComputeMode, nvml.Return) {
	defer g.lock()()
	return nvml.COMPUTEMODE_DEFAULT, g.check()
}

func (g *GPU) IsMigDeviceHandle() (bool, nvml.Return) { return false, nvml.SUCCESS }

// GetAttributes is documented for MIG device handles only.
func (g *GPU) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED
}

func (g *GPU) migCapable() bool { return len(g.Product.Profiles) > 0 }

func (g *GPU) GetMigMode() (int, int, nvml.Return) {
	g.m.park(g, "GetMigMode")
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return 0, 0, ret
	}
	if !g.migCapable() {
		return 0, 0, nvml.ERROR_NOT_SUPPORTED
	}
	return g.migCurrent, g.migPending, nvml.SUCCESS
}

// SetMigMode returns (ret, activationStatus) as nvmlDeviceSetMigMode does:
// ret is the request, activationStatus whether the change took effect (a
// reset was performed) or stays pending (ERROR_IN_USE: processes hold the
// GPU; reset it).
func (g *GPU) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return ret, ret
	}
	if !g.migCapable() {
		return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
	}
	if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}
	if ret := g.m.failLocked(g, "SetMigMode"); ret != nvml.SUCCESS {
		return ret, ret
	}
	if mode == nvml.DEVICE_MIG_DISABLE && len(g.gis) > 0 {
		return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
	}
	g.migPending = mode
	defer g.m.stateChangedLocked()
	if g.migCurrent == mode {
		return nvml.SUCCESS, nvml.SUCCESS
	}
	if g.holders > 0 || !g.Product.ResetFreeMIGChange {
		return nvml.SUCCESS, nvml.ERROR_IN_USE
	}
	g.migCurrent = mode
	return nvml.SUCCESS, nvml.SUCCESS
}

func (g *GPU) profileLocked(index int) (*Profile, nvml.Return) {
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p, ok := g.Product.Profile(index)
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	return p, nvml.SUCCESS
}

func (g *GPU) profileByIDLocked(id uint32) *Profile {
	for i := range g.Product.Profiles {
		if g.Product.Profiles[i].ID == id {
			return &g.Product.Profiles[i]
		}
	}
	return nil
}

// GetGpuInstanceProfileInfo answers whatever the MIG mode (the profiles are
// a property of the product); creating instances needs MIG mode on.
func (g *GPU) GetGpuInstanceProfileInfo(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	defer g.lock()()
	p, ret := g.profileLocked(index)
	if ret != nvml.SUCCESS {
		return nvml.GpuInstanceProfileInfo{}, ret
	}
	return p.info(), nvml.SUCCESS
}

func (g *GPU) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p := g.profileByIDLocked(info.Id)
	if p == nil {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	return slices.Clone(p.Placements), nvml.SUCCESS
}

func (g *GPU) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if g.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	var out []nvml.GpuInstance
	for _, gi := range g.sortedGIsLocked() {
		if gi.Profile.ID == info.Id {
			out = append(out, gi)
		}
	}
	return out, nvml.SUCCESS
}

func (g *GPU) sortedGIsLocked() []*GpuInstance {
	out := make([]*GpuInstance, 0, len(g.gis))
	for _, gi := range g.gis {
		out = append(out, gi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (g *GPU) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if g.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if gi, ok := g.gis[uint32(id)]; ok {
		return gi, nvml.SUCCESS
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// giID is the GPU instance ID of a placement: the driver numbers the 15
// GPU-instance slots of an 8-slice GPU as a binary tree of memory ranges.
func giID(p nvml.GpuInstancePlacement) uint32 {
	return 8/p.Size - 1 + p.Start/p.Size
}

// placementFreeLocked says whether a GPU instance of the profile can be
// created at the placement.
func (g *GPU) placementFreeLocked(p *Profile, pl nvml.GpuInstancePlacement) nvml.Return {
	if g.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	if !slices.Contains(p.Placements, pl) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	same := 0
	for _, gi := range g.gis {
		q := gi.Placement
		if pl.Start < q.Start+q.Size && q.Start < pl.Start+pl.Size {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if gi.Profile.ID == p.ID {
			same++
		}
	}
	if same >= p.Instances {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

func (g *GPU) GetGpuInstanceRemainingCapacity(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return 0, ret
	}
	if info == nil {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	p := g.profileByIDLocked(info.Id)
	if p == nil {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	if g.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	// Instances that fit together: greedily, as placements of one profile
	// never overlap each other except for size-1 ones, which do not either.
	n := 0
	for _, pl := range p.Placements {
		if g.placementFreeLocked(p, pl) == nvml.SUCCESS {
			n++
		}
	}
	return min(n, p.Instances-g.countLocked(p)), nvml.SUCCESS
}

func (g *GPU) countLocked(p *Profile) int {
	n := 0
	for _, gi := range g.gis {
		if gi.Profile.ID == p.ID {
			n++
		}
	}
	return n
}

func (g *GPU) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	g.m.park(g, "CreateGpuInstanceWithPlacement")
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if info == nil || pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p := g.profileByIDLocked(info.Id)
	if p == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if ret := g.m.failLocked(g, "CreateGpuInstanceWithPlacement"); ret != nvml.SUCCESS {
		return nil, ret
	}
	if ret := g.placementFreeLocked(p, *pl); ret != nvml.SUCCESS {
		return nil, ret
	}
	return g.createLocked(p, *pl), nvml.SUCCESS
}

// CreateGpuInstance places the instance at the first free placement (the
// driver's choice; tessera always passes a placement).
func (g *GPU) CreateGpuInstance(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
	g.m.park(g, "CreateGpuInstance")
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p := g.profileByIDLocked(info.Id)
	if p == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if ret := g.m.failLocked(g, "CreateGpuInstance"); ret != nvml.SUCCESS {
		return nil, ret
	}
	last := nvml.ERROR_INSUFFICIENT_RESOURCES
	for _, pl := range p.Placements {
		if last = g.placementFreeLocked(p, pl); last == nvml.SUCCESS {
			return g.createLocked(p, pl), nvml.SUCCESS
		}
	}
	return nil, last
}

func (g *GPU) createLocked(p *Profile, pl nvml.GpuInstancePlacement) *GpuInstance {
	gi := &GpuInstance{gpu: g, ID: giID(pl), Profile: p, Placement: pl, cis: map[uint32]*ComputeInstance{}}
	g.gis[gi.ID] = gi
	g.m.capsChangedLocked(g, gi, nil, true)
	g.m.stateChangedLocked()
	return gi
}

func (g *GPU) GetMaxMigDeviceCount() (int, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return 0, ret
	}
	if !g.migCapable() {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return 7, nvml.SUCCESS
}

// migDevicesLocked lists the MIG devices by GPU instance and compute
// instance ID, creating handles for new compute instances.
func (g *GPU) migDevicesLocked() []*MigDevice {
	var out []*MigDevice
	for _, gi := range g.sortedGIsLocked() {
		for _, ci := range gi.sortedCIsLocked() {
			out = append(out, ci.mig)
		}
	}
	return out
}

func (g *GPU) GetMigDeviceHandleByIndex(index int) (nvml.Device, nvml.Return) {
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if g.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_FOUND
	}
	migs := g.migDevicesLocked()
	if index < 0 || index >= 7 {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if index >= len(migs) {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return migs[index], nvml.SUCCESS
}

func (g *GPU) GetSupportedEventTypes() (uint64, nvml.Return) {
	defer g.lock()()
	return supportedEvents, g.check()
}

func (g *GPU) RegisterEvents(mask uint64, set nvml.EventSet) nvml.Return {
	es, ok := set.(*eventSet)
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	defer g.lock()()
	if ret := g.check(); ret != nvml.SUCCESS {
		return ret
	}
	if mask&^supportedEvents != 0 {
		return nvml.ERROR_NOT_SUPPORTED
	}
	r := es.registered[g]
	if r.resets != g.resets {
		r.mask = 0 // the registration before the reset is gone
	}
	es.registered[g] = registration{mask: r.mask | mask, resets: g.resets}
	return nvml.SUCCESS
}

// --- GPU instances ---

func (gi *GpuInstance) lock() func() { return gi.gpu.lock() }

func (gi *GpuInstance) alive() nvml.Return {
	if gi.gpu.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	if gi.gone {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.SUCCESS
}

func (gi *GpuInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nvml.GpuInstanceInfo{}, ret
	}
	return nvml.GpuInstanceInfo{Device: gi.gpu, Id: gi.ID, ProfileId: gi.Profile.ID, Placement: gi.Placement}, nvml.SUCCESS
}

func (gi *GpuInstance) GetComputeInstanceProfileInfo(index, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nvml.ComputeInstanceProfileInfo{}, ret
	}
	if index < 0 || index >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	if engProfile != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	c, ok := gi.Profile.computeProfile(index)
	if !ok {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return gi.ciInfo(c), nvml.SUCCESS
}

func (gi *GpuInstance) ciInfo(c computeProfile) nvml.ComputeInstanceProfileInfo {
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(c.index), SliceCount: uint32(c.slices), InstanceCount: uint32(c.count), MultiprocessorCount: uint32(c.sms),
		SharedCopyEngineCount: uint32(gi.Profile.CopyEngines), SharedDecoderCount: uint32(gi.Profile.Decoders),
		SharedEncoderCount: uint32(gi.Profile.Encoders), SharedJpegCount: uint32(gi.Profile.JPEGs), SharedOfaCount: uint32(gi.Profile.OFAs),
	}
}

// ciPlacements are the compute instance placements of a size in a GPU
// instance: consecutive compute slices starting at a multiple of the size.
func (gi *GpuInstance) ciPlacements(c computeProfile) []nvml.ComputeInstancePlacement {
	var out []nvml.ComputeInstancePlacement
	for s := 0; s+c.slices <= gi.Profile.ComputeSlices; s += c.slices {
		out = append(out, nvml.ComputeInstancePlacement{Start: uint32(s), Size: uint32(c.slices)})
	}
	return out
}

func (gi *GpuInstance) GetComputeInstancePossiblePlacements(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nil, ret
	}
	c, ok := gi.Profile.computeProfile(int(info.Id))
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	return gi.ciPlacements(c), nvml.SUCCESS
}

func (gi *GpuInstance) ciFreeLocked(c computeProfile, pl nvml.ComputeInstancePlacement) bool {
	n := 0
	for _, ci := range gi.cis {
		q := ci.Placement
		if pl.Start < q.Start+q.Size && q.Start < pl.Start+pl.Size {
			return false
		}
		if ci.profile.index == c.index {
			n++
		}
	}
	return n < c.count
}

func (gi *GpuInstance) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	gi.gpu.m.park(gi.gpu, "CreateComputeInstance")
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	c, ok := gi.Profile.computeProfile(int(info.Id))
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if ret := gi.gpu.m.failLocked(gi.gpu, "CreateComputeInstance"); ret != nvml.SUCCESS {
		return nil, ret
	}
	for _, pl := range gi.ciPlacements(c) {
		if gi.ciFreeLocked(c, pl) {
			return gi.createCILocked(c, pl), nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
}

func (gi *GpuInstance) CreateComputeInstanceWithPlacement(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if info == nil || pl == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	c, ok := gi.Profile.computeProfile(int(info.Id))
	if !ok || !slices.Contains(gi.ciPlacements(c), *pl) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if !gi.ciFreeLocked(c, *pl) {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return gi.createCILocked(c, *pl), nvml.SUCCESS
}

func (gi *GpuInstance) createCILocked(c computeProfile, pl nvml.ComputeInstancePlacement) *ComputeInstance {
	id := uint32(0)
	for gi.cis[id] != nil {
		id++
	}
	ci := &ComputeInstance{gi: gi, ID: id, profile: c, Placement: pl}
	ci.mig = newMigDevice(ci)
	gi.cis[id] = ci
	gi.gpu.m.capsChangedLocked(gi.gpu, gi, ci, true)
	gi.gpu.m.stateChangedLocked()
	return ci
}

func (gi *GpuInstance) sortedCIsLocked() []*ComputeInstance {
	out := make([]*ComputeInstance, 0, len(gi.cis))
	for _, ci := range gi.cis {
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (gi *GpuInstance) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nil, ret
	}
	var out []nvml.ComputeInstance
	for _, ci := range gi.sortedCIsLocked() {
		if uint32(ci.profile.index) == info.Id {
			out = append(out, ci)
		}
	}
	return out, nvml.SUCCESS
}

func (gi *GpuInstance) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return nil, ret
	}
	if ci, ok := gi.cis[uint32(id)]; ok {
		return ci, nvml.SUCCESS
	}
	return nil, nvml.ERROR_NOT_FOUND
}

func (gi *GpuInstance) GetComputeInstanceRemainingCapacity(info *nvml.ComputeInstanceProfileInfo) (int, nvml.Return) {
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return 0, ret
	}
	c, ok := gi.Profile.computeProfile(int(info.Id))
	if !ok {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	n := 0
	for _, pl := range gi.ciPlacements(c) {
		if gi.ciFreeLocked(c, pl) {
			n++
		}
	}
	return n, nvml.SUCCESS
}

// Destroy removes the GPU instance; one with compute instances is in use.
func (gi *GpuInstance) Destroy() nvml.Return {
	gi.gpu.m.park(gi.gpu, "DestroyGpuInstance")
	defer gi.lock()()
	if ret := gi.alive(); ret != nvml.SUCCESS {
		return ret
	}
	if len(gi.cis) > 0 {
		return nvml.ERROR_IN_USE
	}
	if ret := gi.gpu.m.failLocked(gi.gpu, "DestroyGpuInstance"); ret != nvml.SUCCESS {
		return ret
	}
	gi.gone = true
	delete(gi.gpu.gis, gi.ID)
	gi.gpu.m.capsChangedLocked(gi.gpu, gi, nil, false)
	gi.gpu.m.stateChangedLocked()
	return nvml.SUCCESS
}

// --- compute instances ---

func (ci *ComputeInstance) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	defer ci.gi.lock()()
	if ci.gi.gpu.lost {
		return nvml.ComputeInstanceInfo{}, nvml.ERROR_GPU_IS_LOST
	}
	if ci.gone {
		return nvml.ComputeInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.ComputeInstanceInfo{Device: ci.gi.gpu, GpuInstance: ci.gi, Id: ci.ID, ProfileId: uint32(ci.profile.index), Placement: ci.Placement}, nvml.SUCCESS
}

func (ci *ComputeInstance) Destroy() nvml.Return {
	ci.gi.gpu.m.park(ci.gi.gpu, "DestroyComputeInstance")
	defer ci.gi.lock()()
	if ci.gi.gpu.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	if ci.gone {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if ret := ci.gi.gpu.m.failLocked(ci.gi.gpu, "DestroyComputeInstance"); ret != nvml.SUCCESS {
		return ret
	}
	ci.gone = true
	delete(ci.gi.cis, ci.ID)
	ci.gi.gpu.m.capsChangedLocked(ci.gi.gpu, ci.gi, ci, false)
	ci.gi.gpu.m.stateChangedLocked()
	return nvml.SUCCESS
}

// --- MIG device handles ---

// MigDevice is the device handle of one MIG device (a compute instance in a
// GPU instance).
type MigDevice struct {
	mock.Device
	ci   *ComputeInstance
	UUID string
}

func newMigDevice(ci *ComputeInstance) *MigDevice {
	return &MigDevice{ci: ci, UUID: "MIG-" + uuid.New().String()}
}

// Parent is the MIG device's GPU.
func (d *MigDevice) Parent() *GPU { return d.ci.gi.gpu }

func (d *MigDevice) lock() func() { return d.ci.gi.lock() }

func (d *MigDevice) alive() nvml.Return {
	if d.ci.gi.gpu.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	if d.ci.gone {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.SUCCESS
}

func (d *MigDevice) IsMigDeviceHandle() (bool, nvml.Return) { return true, nvml.SUCCESS }
func (d *MigDevice) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	defer d.lock()()
	return d.ci.gi.gpu, d.alive()
}
func (d *MigDevice) GetUUID() (string, nvml.Return) { defer d.lock()(); return d.UUID, d.alive() }
func (d *MigDevice) GetName() (string, nvml.Return) {
	defer d.lock()()
	return d.ci.gi.gpu.Product.Name + " MIG " + d.ci.gi.Profile.Name, d.alive()
}
func (d *MigDevice) GetGpuInstanceId() (int, nvml.Return) {
	defer d.lock()()
	return int(d.ci.gi.ID), d.alive()
}
func (d *MigDevice) GetComputeInstanceId() (int, nvml.Return) {
	defer d.lock()()
	return int(d.ci.ID), d.alive()
}

// GetIndex is the MIG device's index within its GPU.
func (d *MigDevice) GetIndex() (int, nvml.Return) {
	defer d.lock()()
	if ret := d.alive(); ret != nvml.SUCCESS {
		return 0, ret
	}
	return slices.Index(d.ci.gi.gpu.migDevicesLocked(), d), nvml.SUCCESS
}
func (d *MigDevice) GetMinorNumber() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
func (d *MigDevice) GetMigMode() (int, int, nvml.Return) {
	return 0, 0, nvml.ERROR_NOT_SUPPORTED
}
func (d *MigDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) { return d.ci.gi.gpu.GetPciInfo() }
func (d *MigDevice) GetBrand() (nvml.BrandType, nvml.Return) { return d.ci.gi.gpu.GetBrand() }
func (d *MigDevice) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return d.ci.gi.gpu.GetArchitecture()
}
func (d *MigDevice) GetCudaComputeCapability() (int, int, nvml.Return) {
	return d.ci.gi.gpu.GetCudaComputeCapability()
}
func (d *MigDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	defer d.lock()()
	total := d.ci.gi.Profile.MemoryMiB << 20
	return nvml.Memory{Total: total, Free: total}, d.alive()
}
func (d *MigDevice) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	defer d.lock()()
	if ret := d.alive(); ret != nvml.SUCCESS {
		return nvml.DeviceAttributes{}, ret
	}
	p := d.ci.gi.Profile
	return nvml.DeviceAttributes{
		MultiprocessorCount:       uint32(d.ci.profile.sms),
		SharedCopyEngineCount:     uint32(p.CopyEngines),
		SharedDecoderCount:        uint32(p.Decoders),
		SharedEncoderCount:        uint32(p.Encoders),
		SharedJpegCount:           uint32(p.JPEGs),
		SharedOfaCount:            uint32(p.OFAs),
		GpuInstanceSliceCount:     uint32(p.ComputeSlices),
		ComputeInstanceSliceCount: uint32(d.ci.profile.slices),
		MemorySizeMB:              p.MemoryMiB,
	}, nvml.SUCCESS
}

// --- event sets ---

type registration struct {
	mask   uint64
	resets int // the GPU's reset count when registered
}

// eventSet is an nvml.EventSet fed by Mock.inject.
type eventSet struct {
	mock.EventSet
	mock     *Mock
	events   chan nvml.EventData
	done     chan struct{}
	freeOnce sync.Once
	// registered is guarded by mock.mu.
	registered map[*GPU]registration
}

func (es *eventSet) Wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
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

func (es *eventSet) Free() nvml.Return {
	es.freeOnce.Do(func() {
		es.mock.mu.Lock()
		delete(es.mock.eventSets, es)
		es.mock.mu.Unlock()
		close(es.done)
	})
	return nvml.SUCCESS
}

// --- inspection for tests ---

// MIGState is a GPU's MIG mode as NVML reports it.
type MIGState struct {
	Current, Pending bool
}

// MIGMode returns the GPU's current and pending MIG mode.
func (g *GPU) MIGMode() MIGState {
	defer g.lock()()
	return MIGState{Current: g.migCurrent == nvml.DEVICE_MIG_ENABLE, Pending: g.migPending == nvml.DEVICE_MIG_ENABLE}
}

// Instance describes one existing MIG device.
type Instance struct {
	GIID, CIID uint32
	Profile    string
	// ProfileIndex is the nvml.GPU_INSTANCE_PROFILE_* index.
	ProfileIndex int
	Start, Size  uint32
	UUID         string
}

// String is "1g.10gb@3(gi10/ci0)".
func (i Instance) String() string {
	return fmt.Sprintf("%s@%d(gi%d/ci%d)", i.Profile, i.Start, i.GIID, i.CIID)
}

// Instances lists the GPU's MIG devices by GPU and compute instance ID
// (and GPU instances without compute instances, with CIID ^0).
func (g *GPU) Instances() []Instance {
	defer g.lock()()
	var out []Instance
	for _, gi := range g.sortedGIsLocked() {
		cis := gi.sortedCIsLocked()
		if len(cis) == 0 {
			out = append(out, Instance{GIID: gi.ID, CIID: ^uint32(0), Profile: gi.Profile.Name, ProfileIndex: gi.Profile.Index, Start: gi.Placement.Start, Size: gi.Placement.Size})
		}
		for _, ci := range cis {
			out = append(out, Instance{GIID: gi.ID, CIID: ci.ID, Profile: gi.Profile.Name, ProfileIndex: gi.Profile.Index, Start: gi.Placement.Start, Size: gi.Placement.Size, UUID: ci.mig.UUID})
		}
	}
	return out
}

// CreateInstance makes a MIG device (GPU instance at the placement start of
// the named profile with one full compute instance) the way an
// administrator does with `nvidia-smi mig -cgi <profile> -C`.
func (g *GPU) CreateInstance(profile string, start uint32) (Instance, error) {
	var p *Profile
	for i := range g.Product.Profiles {
		if g.Product.Profiles[i].Name == profile {
			p = &g.Product.Profiles[i]
		}
	}
	if p == nil {
		return Instance{}, fmt.Errorf("%s has no MIG profile %s", g.Product.Name, profile)
	}
	var pl *nvml.GpuInstancePlacement
	for i := range p.Placements {
		if p.Placements[i].Start == start {
			pl = &p.Placements[i]
		}
	}
	if pl == nil {
		return Instance{}, fmt.Errorf("profile %s cannot start at %d", profile, start)
	}
	info := p.info()
	gi, ret := g.CreateGpuInstanceWithPlacement(&info, pl)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("create %s at %d: %w", profile, start, ret)
	}
	full := p.computeProfiles()[len(p.computeProfiles())-1]
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(full.index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return Instance{}, ret
	}
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		return Instance{}, ret
	}
	c := ci.(*ComputeInstance)
	return Instance{GIID: c.gi.ID, CIID: c.ID, Profile: p.Name, ProfileIndex: p.Index, Start: pl.Start, Size: pl.Size, UUID: c.mig.UUID}, nil
}

// EnableMIG turns MIG mode on as an administrator would before a test.
func (g *GPU) EnableMIG() error {
	ret, act := g.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if ret != nvml.SUCCESS {
		return ret
	}
	if act != nvml.SUCCESS {
		return fmt.Errorf("MIG mode pending: %w", act)
	}
	return nil
}

// devicesAreFiles tells nvcdi, once, that device nodes are regular files
// (DriverRoot without CAP_MKNOD). It is nvcdi's own test switch and
// process-wide.
var devicesAreFiles sync.Once
