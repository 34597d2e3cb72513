// Package deviceplugin is tessera's classic kubelet device plugin
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): it offers the GPUs that the
// node config puts in device-plugin mode as extended resources (whole GPUs,
// MIG devices, time-sliced replicas), with NVLink-aware preferred
// allocation, so that a cluster can move from nvidia.com/gpu to DRA node by
// node.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	tesseracdi "github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/nodeagent/health"
)

// registerTimeout bounds one Register call. The kubelet dials the plugin
// back and asks for its options before it answers, allowing itself 10s for
// the dial.
const registerTimeout = 30 * time.Second

// defaultRecheckInterval is how often Run looks for a kubelet restart that
// the file watch missed.
const defaultRecheckInterval = 5 * time.Second

// Plugin serves every resource of the selected GPUs; Run drives it.
type Plugin struct {
	cfg           Config
	resources     []*resource
	kubeletSocket string
	topo          *topology
	// migCaps resolves MIG capability device nodes for envvar Allocate
	// responses (the same table the DRA plugin reads).
	migCaps tesseracdi.MIGCaps
	health  HealthSource
	metrics *pluginMetrics

	// ctx is Run's context, for the loggers of the gRPC handlers.
	ctx     context.Context
	running atomic.Bool
	// recheckInterval is how often Run checks for a kubelet restart that
	// the watch missed; noWatch turns the watch off (tests of that path).
	recheckInterval time.Duration
	noWatch         bool

	mu sync.Mutex
	// unhealthy holds the conditions of each GPU or MIG UUID that has any.
	unhealthy map[string]map[health.Kind]health.Event
	// changed is closed (and replaced) whenever unhealthy changes, which
	// wakes every ListAndWatch stream.
	changed chan struct{}
}

// New validates the options and groups the GPUs into resources. Errors name
// the config field (or the hardware that does not fit it), and nothing has
// been started when New fails.
func New(opts Options) (*Plugin, error) {
	cfg := opts.Config
	// Default fills in fields; work on copies so the caller's config stays
	// as given.
	cfg.DeviceListStrategy = append([]DeviceListStrategy(nil), cfg.DeviceListStrategy...)
	if cfg.TimeSlicing != nil {
		ts := *cfg.TimeSlicing
		cfg.TimeSlicing = &ts
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	gpus, err := opts.gpus()
	if err != nil {
		return nil, err
	}
	resources, err := buildResources(cfg, gpus)
	if err != nil {
		return nil, err
	}
	p := &Plugin{
		cfg:           cfg,
		resources:     resources,
		kubeletSocket: filepath.Join(cfg.PluginDir, cfg.KubeletSocket),
		health:        opts.Health,
		migCaps:       tesseracdi.MIGCaps{MinorsFile: opts.MIGMinorsFile},
		ctx:           context.Background(),
		unhealthy:     map[string]map[health.Kind]health.Event{},
		changed:       make(chan struct{}),
		metrics:       newMetrics(),

		recheckInterval: defaultRecheckInterval,
	}
	p.updateDeviceGaugesLocked() // nothing else sees p yet
	for _, r := range resources {
		if r.whole && !r.replicated && opts.NVML != nil {
			p.topo = newTopology(opts.NVML)
			break
		}
	}
	return p, nil
}

// ResourceNames lists the extended resources the plugin serves, e.g. for
// the node agent's log line or status.
func (p *Plugin) ResourceNames() []string {
	names := make([]string, len(p.resources))
	for i, r := range p.resources {
		names[i] = r.name
	}
	return names
}

// Run serves every resource on its socket, registers it with the kubelet
// (retrying with backoff until the kubelet answers), registers again whenever
// the kubelet restarts (its socket is created anew), and applies health
// events, until ctx ends. It removes its sockets before it returns; it
// returns nil when ctx ends and an error when it cannot serve at all.
func (p *Plugin) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("device plugin: Run called twice")
	}
	logger := klog.FromContext(ctx).WithName("deviceplugin")
	ctx = klog.NewContext(ctx, logger)
	p.ctx = ctx

	// Watch before the first registration so that a kubelet restart between
	// the two is not missed.
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("device plugin: watching for kubelet restarts: %w", err)
	}
	defer func() { _ = watcher.Close() }()
	if err := watcher.Add(p.cfg.PluginDir); err != nil {
		return fmt.Errorf("device plugin: watching %s (config field pluginDir) for kubelet restarts: %w", p.cfg.PluginDir, err)
	}

	var events <-chan health.Event
	if p.health != nil {
		events = p.health.Subscribe(ctx)
	}

	servers := make([]*server, len(p.resources))
	for i, r := range p.resources {
		servers[i] = &server{p: p, res: r, socket: filepath.Join(p.cfg.PluginDir, socketName(r.name))}
	}
	defer func() {
		for _, s := range servers {
			s.stop(ctx)
		}
	}()
	for _, s := range servers {
		if err := s.start(ctx); err != nil {
			return fmt.Errorf("device plugin: %w", err)
		}
	}
	logger.Info("Device plugin serving", "resources", p.ResourceNames(), "kubeletSocket", p.kubeletSocket)
	if p.topo != nil && p.topo.err != nil {
		logger.Info("GPU topology unknown: whole GPUs are preferred in index order", "err", p.topo.err)
	}

	// restart serves anew and registers everything again: a new kubelet
	// wiped the plugin dir (our sockets with it) and forgot every
	// registration.
	backoff := newRegisterBackoff()
	pending := append([]*server(nil), servers...)
	retry := time.NewTimer(0)
	defer retry.Stop()
	restart := func() error {
		for _, s := range servers {
			s.stop(ctx)
			if err := s.start(ctx); err != nil {
				return fmt.Errorf("device plugin: after kubelet restart: %w", err)
			}
		}
		pending = append(pending[:0], servers...)
		backoff = newRegisterBackoff()
		retry.Reset(0)
		return nil
	}
	// The kubelet socket registered with (its identity when the last round
	// of registrations began) and the one a round in progress began with.
	var registeredWith, registering os.FileInfo
	recheck := time.NewTicker(p.recheckInterval)
	defer recheck.Stop()
	watchEvents := watcher.Events
	if p.noWatch {
		watchEvents = nil
	}

	for {
		select {
		case <-ctx.Done():
			logger.Info("Device plugin stopping")
			return nil

		case <-retry.C:
			if len(pending) == len(servers) {
				// Stat before registering: a kubelet that restarts during
				// the round is then seen as a change by the next recheck.
				registering, _ = os.Stat(p.kubeletSocket)
			}
			pending = p.registerAll(ctx, pending)
			if len(pending) > 0 {
				retry.Reset(backoff.Step())
			} else {
				registeredWith = registering
			}

		case ev, ok := <-watchEvents:
			if !ok {
				return errors.New("device plugin: kubelet socket watcher closed")
			}
			if filepath.Clean(ev.Name) != p.kubeletSocket || !ev.Has(fsnotify.Create) {
				continue
			}
			logger.Info("Kubelet socket created, kubelet restarted: registering again", "kubeletSocket", p.kubeletSocket)
			if err := restart(); err != nil {
				return err
			}

		case <-recheck.C:
			// A safety net for missed watch events (inotify queue
			// overflow, the plugin dir replaced): our socket gone or a
			// different kubelet socket than the one registered with.
			// While registrations are pending, a new kubelet socket is
			// being registered with anyway; a missing socket is not.
			with := registeredWith
			if len(pending) > 0 {
				with = nil
			}
			if reason := p.kubeletChanged(servers, with); reason != "" {
				logger.Info("Kubelet restart detected without a watch event: registering again", "reason", reason)
				if err := restart(); err != nil {
					return err
				}
			}

		case err, ok := <-watcher.Errors:
			if ok {
				logger.Error(err, "Watching the kubelet socket")
			}

		case ev, ok := <-events:
			if !ok {
				// The source only closes when ctx ends; don't spin on it.
				events = nil
				continue
			}
			p.applyHealth(ctx, ev)
		}
	}
}

// kubeletChanged says why the registrations may be lost, or "".
func (p *Plugin) kubeletChanged(servers []*server, registeredWith os.FileInfo) string {
	for _, s := range servers {
		if _, err := os.Stat(s.socket); errors.Is(err, os.ErrNotExist) {
			return "socket " + s.socket + " removed"
		}
	}
	fi, err := os.Stat(p.kubeletSocket)
	if err == nil && registeredWith != nil && !os.SameFile(fi, registeredWith) {
		return "kubelet socket " + p.kubeletSocket + " replaced"
	}
	return ""
}

// registerAll registers each pending server and returns those that failed.
func (p *Plugin) registerAll(ctx context.Context, pending []*server) []*server {
	logger := klog.FromContext(ctx)
	var failed []*server
	for _, s := range pending {
		if err := s.register(ctx, p.kubeletSocket); err != nil {
			p.metrics.registrationErrors.WithLabelValues(s.res.name).Inc()
			logger.Error(err, "Registering with kubelet failed, will retry", "resource", s.res.name)
			failed = append(failed, s)
			continue
		}
		p.metrics.registrations.WithLabelValues(s.res.name).Inc()
		logger.Info("Registered with kubelet", "resource", s.res.name, "devices", len(s.res.devices))
	}
	return failed
}

func newRegisterBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}
}

// listDevices returns the resource's devices with their current health and
// the channel that is closed on the next health change.
func (p *Plugin) listDevices(r *resource) ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	devs := make([]*pluginapi.Device, len(r.devices))
	for i, a := range r.devices {
		d := &pluginapi.Device{ID: a.id, Health: pluginapi.Healthy}
		if p.isUnhealthyLocked(a.unit) {
			d.Health = pluginapi.Unhealthy
		}
		if n := a.unit.gpu.NUMANode; n != nil {
			d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(*n)}}}
		}
		devs[i] = d
	}
	return devs, p.changed
}

// isUnhealthyLocked: a MIG device or replica is unhealthy when it or its GPU
// is.
func (p *Plugin) isUnhealthyLocked(u *unit) bool {
	return len(p.unhealthy[u.gpu.UUID]) > 0 || len(p.unhealthy[u.id]) > 0
}
