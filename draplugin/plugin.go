// Package draplugin is tessera's kubelet DRA plugin for the driver
// gpu.tessera.dev. It prepares the devices that the scheduler allocated in
// ResourceClaims: whole GPUs, MIG devices created on demand at the
// allocated placement, and fractional GPU shares enforced with MPS limits
// or time-slicing. It writes one CDI spec per claim and records every
// prepare in a crash-safe checkpoint (see docs/draplugin.md).
//
// tessera-node starts it with Start and stops it with Plugin.Stop.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/mig"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/gpulock"
)

// Plugin is a running kubelet plugin.
type Plugin struct {
	opts       Options
	node       *discovery.Node
	cdi        *cdi.Writer
	driver     *cdi.Driver
	baseID     string
	mig        mig.Manager
	locks      *gpulock.Locks
	events     record.EventRecorder
	stopEvents func()
	sharing    *sharing.Controller
	gpus       sharing.GPUSettings
	metrics    *pluginMetrics
	helper     *kubeletplugin.Helper
	cancel     context.CancelFunc

	// mu guards state and the checkpoint file. The helper serializes gRPC
	// calls already; mu also covers direct callers and background work.
	mu    sync.Mutex
	state checkpoint.Data
	// written is what the plugin last wrote or read, to notice when the
	// other instance of a rolling update changed the checkpoint.
	written os.FileInfo
	enc     checkpoint.Encoder
}

var _ kubeletplugin.DRAPlugin = (*Plugin)(nil)

// Start reconciles what a previous run left behind and then serves the
// kubelet on the registration and DRA sockets.
func Start(ctx context.Context, opts Options) (*Plugin, error) {
	if err := opts.complete(); err != nil {
		return nil, err
	}
	logger := klog.LoggerWithName(klog.FromContext(ctx), "draplugin")
	ctx = klog.NewContext(ctx, logger)
	p, err := newPlugin(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := p.recover(ctx); err != nil {
		p.stopEvents()
		return nil, fmt.Errorf("reconcile checkpoint: %w", err)
	}
	ctx, p.cancel = context.WithCancel(ctx)
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(opts.KubeClient),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDir),
		kubeletplugin.HealthService(opts.Health != nil),
	}
	if opts.RollingUpdateUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(opts.RollingUpdateUID))
	}
	helper, err := kubeletplugin.Start(ctx, p, helperOpts...)
	if err != nil {
		p.cancel()
		p.stopEvents()
		return nil, fmt.Errorf("start kubelet plugin: %w", err)
	}
	p.helper = helper
	logger.Info("DRA plugin started", "node", opts.NodeName, "pluginDir", opts.PluginDir, "cdiDir", opts.CDIDir, "driverRoot", opts.Roots.Driver, "driverVersion", p.driver.Version(), "gpus", len(p.node.GPUs), "preparedClaims", len(p.state.Claims))
	return p, nil
}

// newPlugin builds a plugin without reconciling or serving.
func newPlugin(ctx context.Context, opts Options) (*Plugin, error) {
	for _, dir := range []string{opts.PluginDir, opts.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
	}
	node := opts.Node
	if node == nil && opts.Discovery != nil {
		node = opts.Discovery()
	}
	if node == nil {
		var err error
		if node, err = discovery.Discover(ctx, opts.NVML); err != nil {
			return nil, fmt.Errorf("discover GPUs: %w", err)
		}
	}
	w, err := cdi.NewWriter(opts.CDIDir)
	if err != nil {
		return nil, err
	}
	// The driver's edits: without the driver's files no spec is written.
	driver, err := cdi.NewDriver(cdi.DriverOptions{
		NVML: opts.NVML, DriverRoot: opts.Roots.Driver, HostDriverRoot: opts.HostDriverRoot,
		DevRoot: opts.Roots.Dev, ProcRoot: opts.Roots.Proc, HookPath: opts.CDIHookPath,
	})
	if err != nil {
		return nil, err
	}
	common, err := driver.Common()
	if err != nil {
		return nil, err
	}
	baseID, err := w.WriteBase(common)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	locks := opts.GPULocks
	if locks == nil {
		locks = gpulock.New()
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: opts.KubeClient.CoreV1().Events("")})
	return &Plugin{
		opts:       opts,
		node:       node,
		cdi:        w,
		driver:     driver,
		baseID:     baseID,
		mig:        mig.Manager{Lib: opts.NVML},
		locks:      locks,
		events:     broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "tessera-node", Host: opts.NodeName}),
		stopEvents: broadcaster.Shutdown,
		sharing:    &sharing.Controller{Exec: opts.Executor, Root: opts.MPSDir, Launcher: opts.MPSLauncher, StartTimeout: opts.MPSStartTimeout},
		gpus:       sharing.GPUSettings{Exec: opts.Executor},
		metrics:    m,
		state:      checkpoint.NewData(),
	}, nil
}

// event records an event on the Node.
func (p *Plugin) event(eventType, reason, format string, args ...any) {
	p.events.Eventf(&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: p.opts.NodeName}, eventType, reason, format, args...)
}

// Stop closes the sockets and waits for the helper's goroutines. Prepared
// claims stay prepared: the next start picks them up from the checkpoint.
func (p *Plugin) Stop() {
	if p == nil {
		return
	}
	p.helper.Stop()
	if p.cancel != nil {
		p.cancel()
	}
	p.stopEvents()
}

// currentNode is the latest discovery snapshot.
func (p *Plugin) currentNode() *discovery.Node {
	if p.opts.Discovery != nil {
		if n := p.opts.Discovery(); n != nil {
			return n
		}
	}
	return p.node
}

// Registry holds the plugin's metrics, for the binary to serve.
func (p *Plugin) Registry() metrics.KubeRegistry { return p.metrics.registry }

// Helper exposes the kubelet plugin helper (registration status, and
// PublishResources for a binary that publishes slices through it).
func (p *Plugin) Helper() *kubeletplugin.Helper { return p.helper }

// HandleError implements kubeletplugin.DRAPlugin.
func (p *Plugin) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && p.opts.FatalError != nil {
		p.opts.FatalError(fmt.Errorf("%s: %w", msg, err))
	}
}

// PreparedClaims returns the UIDs of the claims recorded as prepared.
func (p *Plugin) PreparedClaims() []types.UID {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []types.UID
	for uid, c := range p.state.Claims {
		if c.State == checkpoint.PrepareCompleted {
			out = append(out, uid)
		}
	}
	return out
}

// syncFromDisk reloads the checkpoint when another plugin instance (rolling
// update) wrote it since this one last did. Caller holds mu.
func (p *Plugin) syncFromDisk(ctx context.Context) error {
	st, err := os.Stat(p.opts.checkpointPath())
	if err != nil {
		if os.IsNotExist(err) && p.written == nil {
			return nil
		}
		if os.IsNotExist(err) {
			return fmt.Errorf("checkpoint %s disappeared", p.opts.checkpointPath())
		}
		return fmt.Errorf("stat checkpoint: %w", err)
	}
	if p.written != nil && os.SameFile(st, p.written) && st.Size() == p.written.Size() && st.ModTime().Equal(p.written.ModTime()) {
		return nil
	}
	cp, err := checkpoint.Read(p.opts.checkpointPath())
	if err != nil {
		return err
	}
	if cp.BootID != p.opts.BootID {
		return fmt.Errorf("checkpoint was written in boot %s, this is boot %s", cp.BootID, p.opts.BootID)
	}
	klog.FromContext(ctx).V(2).Info("Reloaded checkpoint written by another plugin instance", "claims", len(cp.Data.Claims))
	p.state = cp.Data
	p.written = st
	return nil
}

// save writes the state. Caller holds mu.
func (p *Plugin) save() error {
	path := p.opts.checkpointPath()
	raw, err := p.enc.Encode(p.opts.BootID, &p.state)
	if err != nil {
		return err
	}
	if err := checkpoint.WriteFileAtomic(path, raw, 0o600); err != nil {
		return err
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("stat checkpoint: %w", err)
	}
	p.written = st
	p.updateGauges()
	return nil
}

func (p *Plugin) updateGauges() {
	counts := map[checkpoint.DeviceKind]int{checkpoint.KindGPU: 0, checkpoint.KindMIG: 0, checkpoint.KindShared: 0}
	for _, c := range p.state.Claims {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		for _, d := range c.Devices {
			counts[d.Kind]++
		}
	}
	for k, n := range counts {
		p.metrics.preparedDevices.WithLabelValues(string(k)).Set(float64(n))
	}
}
