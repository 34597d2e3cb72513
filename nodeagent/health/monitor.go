package health

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// DefaultBenignXIDs are XIDs caused by the application, not the GPU
// (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 video processor exception,
// 109 context switch timeout): they do not make a GPU unhealthy.
var DefaultBenignXIDs = []uint64{13, 31, 43, 45, 68, 109}

// LostXIDs mean the GPU is gone until it is reset: 79 fallen off the bus.
var LostXIDs = []uint64{79}

// MonitorOptions configure a Monitor.
type MonitorOptions struct {
	// GPUs are the UUIDs of the GPUs to watch.
	GPUs []string
	// ExtraBenignXIDs are ignored in addition to DefaultBenignXIDs.
	ExtraBenignXIDs []uint64
	// ProbeInterval is how often every GPU is probed (default 10s): a GPU
	// that answers ERROR_GPU_IS_LOST is lost, one that answers again is back.
	ProbeInterval time.Duration
	// XIDRecovery is how long after its last critical XID or ECC error a GPU
	// that still answers probes is considered healthy again. Zero keeps the
	// condition until the agent restarts (or a healthy event is injected).
	XIDRecovery time.Duration
	// WaitTimeout bounds one NVML event wait, so that Run notices ctx
	// cancellation (default 500ms).
	WaitTimeout time.Duration
}

// Monitor watches NVML for XID and ECC events and probes GPUs, publishing
// health events to a Broadcaster.
type Monitor struct {
	lib    nvml.Interface
	b      *Broadcaster
	opts   MonitorOptions
	benign map[uint64]bool

	mu  sync.Mutex
	set nvml.EventSet
	// byDevice maps a registered handle to its UUID: an event of a GPU that
	// just fell off the bus cannot be asked for its UUID any more.
	byDevice map[nvml.Device]string
	// registered says which GPUs' events are registered since they last
	// came back (a GPU reset drops the driver's registrations).
	registered map[string]bool
}

// NewMonitor returns a monitor; call Run to start it.
func NewMonitor(lib nvml.Interface, b *Broadcaster, opts MonitorOptions) *Monitor {
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 10 * time.Second
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = 500 * time.Millisecond
	}
	benign := map[uint64]bool{}
	for _, x := range append(slices.Clone(DefaultBenignXIDs), opts.ExtraBenignXIDs...) {
		benign[x] = true
	}
	return &Monitor{lib: lib, b: b, opts: opts, benign: benign, byDevice: map[nvml.Device]string{}, registered: map[string]bool{}}
}

// IsBenign reports whether the monitor ignores this XID.
func (m *Monitor) IsBenign(xid uint64) bool { return m.benign[xid] }

// Run watches until ctx is done. It returns an error only if NVML cannot
// deliver events at all: a monitor that silently sees nothing is worse than
// one that says so. A GPU that is lost at start is reported lost, and its
// events are registered once it answers again.
func (m *Monitor) Run(ctx context.Context) error {
	set, ret := m.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("create NVML event set: %w", ret)
	}
	defer set.Free()
	m.mu.Lock()
	m.set = set
	m.mu.Unlock()
	for _, id := range m.opts.GPUs {
		if err := m.register(ctx, id); err != nil {
			return err
		}
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		m.probeLoop(ctx)
	}()
	defer func() { <-done }()

	logger := klog.FromContext(ctx)
	timeout := uint32(m.opts.WaitTimeout / time.Millisecond)
	for ctx.Err() == nil {
		data, ret := set.Wait(timeout)
		switch ret {
		case nvml.SUCCESS:
			m.handle(ctx, data)
		case nvml.ERROR_TIMEOUT:
		default:
			// A transient failure (e.g. a GPU lost mid-wait): the probe
			// loop reports GPUs that stay gone; back off briefly.
			logger.V(2).Info("NVML event wait failed", "ret", ret.Error())
			select {
			case <-ctx.Done():
			case <-time.After(m.opts.WaitTimeout):
			}
		}
	}
	return nil
}

// register registers the GPU's XID and ECC events. A lost GPU is reported
// and registered later (see probe); other failures are errors.
func (m *Monitor) register(ctx context.Context, id string) error {
	logger := klog.FromContext(ctx)
	dev, ret := m.lib.DeviceGetHandleByUUID(id)
	if ret == nvml.ERROR_GPU_IS_LOST {
		if !m.has(id, KindLost) {
			m.b.Publish(Event{UUID: id, Kind: KindLost, Message: "GPU does not answer: " + ret.Error()})
		}
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: %w", id, ret)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byDevice[dev] = id
	m.registered[id] = true
	supported, ret := dev.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		logger.Info("GPU does not report supported events; health relies on probes", "gpu", id, "ret", ret.Error())
		return nil
	}
	mask := supported & (nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
	if mask == 0 {
		logger.Info("GPU supports neither XID nor ECC events; health relies on probes", "gpu", id)
		return nil
	}
	if ret := dev.RegisterEvents(mask, m.set); ret != nvml.SUCCESS {
		m.registered[id] = false
		return fmt.Errorf("register events of GPU %s: %w", id, ret)
	}
	return nil
}

func (m *Monitor) has(id string, k Kind) bool {
	for _, c := range m.b.Conditions(id) {
		if c.Kind == k {
			return true
		}
	}
	return false
}

func (m *Monitor) handle(ctx context.Context, data nvml.EventData) {
	logger := klog.FromContext(ctx)
	if data.Device == nil {
		return
	}
	m.mu.Lock()
	id, ok := m.byDevice[data.Device]
	m.mu.Unlock()
	if !ok {
		var ret nvml.Return
		if id, ret = data.Device.GetUUID(); ret != nvml.SUCCESS {
			logger.Info("Event for a GPU without UUID", "ret", ret.Error())
			return
		}
	}
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		xid := data.EventData
		if m.benign[xid] {
			logger.V(2).Info("Ignoring benign XID", "gpu", id, "xid", xid)
			return
		}
		kind := KindXID
		if slices.Contains(LostXIDs, xid) {
			kind = KindLost
		}
		m.b.Publish(Event{UUID: id, Kind: kind, XID: xid, Message: fmt.Sprintf("XID %d", xid)})
	case nvml.EventTypeDoubleBitEccError:
		m.b.Publish(Event{UUID: id, Kind: KindECC, Message: "uncorrectable ECC error"})
	}
}

func (m *Monitor) probeLoop(ctx context.Context) {
	ticker := time.NewTicker(m.opts.ProbeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			for _, id := range m.opts.GPUs {
				m.probe(ctx, id)
			}
		}
	}
}

// probe checks that the GPU answers NVML and clears conditions that have
// passed.
func (m *Monitor) probe(ctx context.Context, id string) {
	logger := klog.FromContext(ctx)
	dev, ret := m.lib.DeviceGetHandleByUUID(id)
	if ret == nvml.SUCCESS {
		_, ret = dev.GetMemoryInfo()
	}
	conds := m.b.Conditions(id)
	has := func(k Kind) (Event, bool) {
		for _, c := range conds {
			if c.Kind == k {
				return c, true
			}
		}
		return Event{}, false
	}
	if ret == nvml.ERROR_GPU_IS_LOST || ret == nvml.ERROR_NOT_FOUND {
		m.mu.Lock()
		m.registered[id] = false
		m.mu.Unlock()
		if _, lost := has(KindLost); !lost {
			m.b.Publish(Event{UUID: id, Kind: KindLost, Message: "GPU does not answer: " + ret.Error()})
		}
		return
	}
	if ret != nvml.SUCCESS {
		logger.V(2).Info("GPU probe inconclusive", "gpu", id, "ret", ret.Error())
		return
	}
	if _, lost := has(KindLost); lost {
		m.b.Publish(Event{UUID: id, Kind: KindLost, Healthy: true, Message: "GPU answers again"})
	}
	m.mu.Lock()
	registered := m.registered[id]
	m.mu.Unlock()
	if !registered || lostBefore(conds) {
		// A GPU that comes back was reset: the driver dropped its event
		// registrations, so they are made again.
		if err := m.register(ctx, id); err != nil {
			logger.Error(err, "Registering events again failed; health of this GPU relies on probes", "gpu", id)
		}
	}
	if m.opts.XIDRecovery <= 0 {
		return
	}
	for _, k := range []Kind{KindXID, KindECC} {
		if c, ok := has(k); ok && time.Since(c.Time) >= m.opts.XIDRecovery {
			m.b.Publish(Event{UUID: id, Kind: k, Healthy: true, Message: fmt.Sprintf("no %s error for %s", k, m.opts.XIDRecovery)})
		}
	}
}

func lostBefore(conds []Event) bool {
	return slices.ContainsFunc(conds, func(e Event) bool { return e.Kind == KindLost })
}
