// Package agent is the tessera node agent as a library: it discovers the
// node's GPUs, resolves the partition config, prepares MIG state, publishes
// ResourceSlices and keeps them current with health and configuration. The
// tessera-node binary is a thin wrapper; tests and the sandbox run many agents
// in one process.
package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/gpulock"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"

	"github.com/tessera-gpu/tessera/contract"
)

// Component is something that runs beside the agent for as long as it runs
// (the DRA kubelet plugin, the device plugin). It gets the agent to read the
// current discovery and subscribe to health. When a component returns an
// error, the agent stops and Run returns that error.
type Component func(ctx context.Context, a *Agent) error

// Options configure an agent.
type Options struct {
	// KubeClient talks to the API server; required.
	KubeClient kubernetes.Interface
	// NodeName is the Node this agent runs on; required. The Node must exist:
	// it owns the ResourceSlices and its labels select the partition config.
	NodeName string
	// NVML is the initialised NVML backend (nvmlbackend.Open); required.
	NVML nvml.Interface
	// Config is the partition config; nil offers every GPU whole.
	Config *partition.Config
	// ConfigPath, if set, is read at start (replacing Config) and again at
	// every resync; a file that turns invalid later keeps the last good
	// config and is reported through an event.
	ConfigPath string
	// Health is the broadcaster the agent taints devices from; nil creates
	// one. Other components subscribe to it through Agent.Health.
	Health *health.Broadcaster
	// Monitor, if non-nil, runs an NVML health monitor with these options
	// (its GPUs are filled in from discovery).
	Monitor *health.MonitorOptions
	// Features, if non-nil, skips detection of the DRA features the cluster
	// serves (tests that want a degraded agent on a full cluster).
	Features *slices.Features
	// ResyncPeriod is how often GPUs and config are read again (default 1m).
	ResyncPeriod time.Duration
	// StartupTimeout bounds how long Run waits for the API server and the
	// Node at start before it gives up with an error (default 30s).
	StartupTimeout time.Duration
	// Components run beside the agent once it has published.
	Components []Component
	// GPULocks serializes one GPU's MIG changes between the agent and the
	// kubelet plugin; nil makes one (components get it from GPULocks()).
	GPULocks *gpulock.Locks
	// StatePath, if set, is a file where the agent keeps the last
	// description of every GPU and the GPUs' XID/ECC conditions, so that a
	// GPU lost while the agent restarts is still published (tainted) and a
	// restart does not clear a broken GPU's taint.
	StatePath string
	// Roots of the driver installation (sysfs is read for PCIe roots);
	// nil: nvmlbackend.RootsOf(NVML).
	Roots *nvmlbackend.Roots
}

// Agent is one node agent.
type Agent struct {
	opts    Options
	health  *health.Broadcaster
	trigger chan struct{}
	ready   atomic.Bool

	mu       sync.RWMutex
	node     *discovery.Node
	plan     *partition.Plan
	config   *partition.Config
	features slices.Features
	counts   slices.Counts
	nodeObj  *v1.Node
	recorder record.EventRecorder
	// reasons explain why the plan was degraded; degraded remembers which
	// were reported, so each is logged and sent as an event once.
	reasons  []string
	degraded map[string]bool
	// notices are unavailable GPUs found by the last discovery (event
	// GPUUnavailable, once each).
	notices []string
	// known is the last description of every GPU seen (persisted).
	known []discovery.GPU
	// withdrawn are device types of GPUs that are not published for now.
	withdrawn map[string]map[contract.DeviceType]string
	locks     *gpulock.Locks
	roots     nvmlbackend.Roots
	// stateMu serializes writes of the state file.
	stateMu sync.Mutex
}

// New checks the options and returns an agent; Run starts it.
func New(opts Options) (*Agent, error) {
	switch {
	case opts.KubeClient == nil:
		return nil, errors.New("node agent: KubeClient is required")
	case opts.NodeName == "":
		return nil, errors.New("node agent: NodeName is required")
	case opts.NVML == nil:
		return nil, errors.New("node agent: NVML is required")
	}
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = time.Minute
	}
	if opts.StartupTimeout <= 0 {
		opts.StartupTimeout = 30 * time.Second
	}
	b := opts.Health
	if b == nil {
		b = health.NewBroadcaster()
	}
	cfg := opts.Config
	if cfg == nil {
		cfg = &partition.Config{}
	}
	RegisterMetrics()
	// The error counter exists at 0 from the start: an alert on increase() (the chart's
	// PrometheusRule) cannot see the first error of a series that appears with it.
	publishErrors.WithLabelValues(opts.NodeName)
	locks := opts.GPULocks
	if locks == nil {
		locks = gpulock.New()
	}
	return &Agent{opts: opts, health: b, config: cfg, trigger: make(chan struct{}, 1), degraded: map[string]bool{},
		withdrawn: map[string]map[contract.DeviceType]string{}, locks: locks}, nil
}

// GPULocks are the per-GPU locks the agent takes for MIG changes; the
// kubelet plugin takes the same ones.
func (a *Agent) GPULocks() *gpulock.Locks { return a.locks }

// Roots are the driver installation's roots the agent uses.
func (a *Agent) Roots() nvmlbackend.Roots {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.roots
}

// Withdraw stops publishing the devices of these types of a GPU, with a
// Node event giving the reason, until the agent restarts. The kubelet
// plugin calls it when a GPU's MIG mode cannot change without a reset, so
// that the scheduler stops choosing devices that cannot be prepared.
func (a *Agent) Withdraw(gpuUUID string, types []contract.DeviceType, reason string) {
	a.mu.Lock()
	if a.withdrawn[gpuUUID] == nil {
		a.withdrawn[gpuUUID] = map[contract.DeviceType]string{}
	}
	for _, t := range types {
		a.withdrawn[gpuUUID][t] = reason
	}
	a.mu.Unlock()
	a.event(v1.EventTypeWarning, "DevicesWithdrawn", "GPU %s: %v devices are not offered until tessera-node restarts: %s", gpuUUID, types, reason)
	a.Resync()
}

// Health is the broadcaster of GPU health events.
func (a *Agent) Health() *health.Broadcaster { return a.health }

// NVML is the backend the agent uses.
func (a *Agent) NVML() nvml.Interface { return a.opts.NVML }

// NodeName is the node the agent serves.
func (a *Agent) NodeName() string { return a.opts.NodeName }

// Snapshot returns the latest discovery and plan (nil before Run discovered).
// Callers must not modify them.
func (a *Agent) Snapshot() (*discovery.Node, *partition.Plan) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.node, a.plan
}

// Features returns the DRA features the agent publishes for.
func (a *Agent) Features() slices.Features {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.features
}

// Counts returns the devices of the last published pool by type.
func (a *Agent) Counts() slices.Counts {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.counts
}

// Ready reports whether the agent has published its pool and the last
// publish attempt succeeded.
func (a *Agent) Ready() bool { return a.ready.Load() }

// Resync asks the agent to read GPUs and config again and republish now.
func (a *Agent) Resync() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Run starts the agent and blocks until ctx is done or a component fails.
// Start-up problems (API server unreachable, Node missing, invalid config,
// MIG state that cannot be reached) are returned as errors.
func (a *Agent) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("node", a.opts.NodeName)
	ctx = klog.NewContext(ctx, logger)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(errors.New("node agent stopped"))

	nodeObj, err := a.waitForNode(ctx)
	if err != nil {
		return err
	}
	if a.opts.ConfigPath != "" {
		cfg, err := partition.Load(a.opts.ConfigPath)
		if err != nil {
			return err
		}
		a.config = cfg
	}
	var roots nvmlbackend.Roots
	if a.opts.Roots != nil {
		roots = *a.opts.Roots
	} else if roots, err = nvmlbackend.RootsOf(a.opts.NVML); err != nil {
		return err
	}
	a.mu.Lock()
	a.roots = roots
	a.mu.Unlock()
	if a.opts.StatePath != "" {
		st, err := readState(a.opts.StatePath)
		if err != nil {
			logger.Error(err, "Starting without the node state")
		}
		a.known = st.GPUs
		for _, ev := range st.Conditions {
			// Conditions of a GPU that is still broken survive the restart;
			// XID recovery counts from the original time.
			a.health.Publish(ev)
		}
		if len(st.Conditions) > 0 {
			logger.Info("Restored GPU health conditions", "conditions", len(st.Conditions))
		}
	}
	features := slices.AllFeatures
	if a.opts.Features != nil {
		features = *a.opts.Features
	} else if features, err = DetectFeatures(ctx, a.opts.KubeClient, a.opts.NodeName); err != nil {
		return err
	}
	logger.Info("Cluster DRA features", "partitionableDevices", features.PartitionableDevices, "consumableCapacity", features.ConsumableCapacity, "deviceTaints", features.DeviceTaints)
	node, plan, reasons, err := a.prepare(ctx, a.config, nodeObj.Labels, features)
	if err != nil {
		return err
	}
	a.saveState(ctx)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.opts.KubeClient.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	a.mu.Lock()
	a.node, a.plan, a.features, a.nodeObj, a.reasons = node, plan, features, nodeObj, reasons
	a.recorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "tessera-node", Host: a.opts.NodeName})
	a.mu.Unlock()

	var wg sync.WaitGroup
	defer wg.Wait()
	// Cancel before waiting: deferred calls run last-in first-out.
	defer cancel(errors.New("node agent stopped"))

	if a.opts.Monitor != nil {
		mopts := *a.opts.Monitor
		mopts.GPUs = nil
		for _, g := range node.GPUs {
			// Lost GPUs too: the monitor reports them and watches them
			// once they answer again.
			mopts.GPUs = append(mopts.GPUs, g.UUID)
		}
		mon := health.NewMonitor(a.opts.NVML, a.health, mopts)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := mon.Run(ctx); err != nil {
				logger.Error(err, "GPU health monitor stopped; health is not watched")
				a.event(v1.EventTypeWarning, "HealthMonitorFailed", "GPU health monitor stopped: %v", err)
			}
		}()
	}
	healthCh := a.health.Subscribe(ctx)

	controller, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName:   contract.DriverName,
		KubeClient:   a.opts.KubeClient,
		Owner:        &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: nodeObj.Name, UID: nodeObj.UID},
		ErrorHandler: a.handlePublishError,
	})
	if err != nil {
		return fmt.Errorf("start ResourceSlice controller: %w", err)
	}
	defer controller.Stop()
	a.publish(ctx, controller)

	// Node labels select the config entry: a label change resyncs.
	factory := informers.NewSharedInformerFactoryWithOptions(a.opts.KubeClient, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", a.opts.NodeName).String()
	}))
	nodeInformer := factory.Core().V1().Nodes().Informer()
	_, _ = nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, n := oldObj.(*v1.Node), newObj.(*v1.Node)
			if !equalLabels(o.Labels, n.Labels) {
				a.mu.Lock()
				a.nodeObj = n
				a.mu.Unlock()
				a.Resync()
			}
		},
	})
	factory.Start(ctx.Done())
	defer func() {
		// The informers stop with ctx: cancel first, or a return on a
		// component's error waits for them forever.
		cancel(errors.New("node agent stopped"))
		factory.Shutdown()
	}()

	compErr := make(chan error, len(a.opts.Components))
	for _, c := range a.opts.Components {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c(ctx, a); err != nil && ctx.Err() == nil {
				compErr <- err
			}
		}()
	}

	ticker := time.NewTicker(a.opts.ResyncPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-compErr:
			return fmt.Errorf("node agent component failed: %w", err)
		case ev, ok := <-healthCh:
			if !ok {
				return nil
			}
			healthEvents.WithLabelValues(a.opts.NodeName, string(ev.Kind), strconv.FormatBool(ev.Healthy)).Inc()
			if ev.Healthy {
				logger.Info("GPU healthy again", "gpu", ev.UUID, "kind", ev.Kind, "message", ev.Message)
				a.event(v1.EventTypeNormal, "GPUHealthy", "%s: %s", ev, ev.Message)
			} else {
				logger.Info("GPU unhealthy", "gpu", ev.UUID, "kind", ev.Kind, "xid", ev.XID, "message", ev.Message)
				a.event(v1.EventTypeWarning, "GPUUnhealthy", "%s: %s", ev, ev.Message)
			}
			a.drainHealth(healthCh)
			a.saveState(ctx)
			a.publish(ctx, controller)
		case <-ticker.C:
			a.resync(ctx, controller)
		case <-a.trigger:
			a.resync(ctx, controller)
		}
	}
}

// drainHealth takes events that are already queued, so that a burst of
// events leads to one republish; their metrics are still counted.
func (a *Agent) drainHealth(ch <-chan health.Event) {
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return
			}
			healthEvents.WithLabelValues(a.opts.NodeName, string(ev.Kind), strconv.FormatBool(ev.Healthy)).Inc()
		default:
			return
		}
	}
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// waitForNode gets the Node, retrying while the API server is unreachable,
// for at most StartupTimeout.
func (a *Agent) waitForNode(ctx context.Context) (*v1.Node, error) {
	logger := klog.FromContext(ctx)
	deadline := time.Now().Add(a.opts.StartupTimeout)
	for {
		// Each attempt is bounded by the deadline but runs on the parent
		// context, so that the error kept is the API server's, not a
		// client-side deadline error of the last attempt.
		attemptCtx, cancel := context.WithTimeout(ctx, max(time.Until(deadline), time.Second))
		n, err := a.opts.KubeClient.CoreV1().Nodes().Get(attemptCtx, a.opts.NodeName, metav1.GetOptions{})
		cancel()
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("get Node %q: %w", a.opts.NodeName, context.Cause(ctx))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("get Node %q from the API server (gave up after %s): %w", a.opts.NodeName, a.opts.StartupTimeout, err)
		}
		logger.V(2).Info("Waiting for the API server and the Node", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// prepare discovers the GPUs, resolves the plan and brings MIG state in line.
func (a *Agent) prepare(ctx context.Context, cfg *partition.Config, nodeLabels map[string]string, features slices.Features) (*discovery.Node, *partition.Plan, []string, error) {
	node, err := a.discover(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	plan, err := partition.Resolve(cfg, nodeLabels, node)
	if err != nil {
		return nil, nil, nil, err
	}
	// Degrade before touching MIG state: a dynamic-MIG GPU offered whole on
	// an older cluster must not be switched into MIG mode.
	plan, reasons := slices.Degrade(node, plan, features)
	changed, err := partition.Apply(ctx, a.opts.NVML, node, plan, a.locks)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("partition config entry %q: %w", plan.Entry, err)
	}
	if changed {
		if node, err = a.discover(ctx); err != nil {
			return nil, nil, nil, fmt.Errorf("after changing MIG state: %w", err)
		}
		if plan, err = partition.Resolve(cfg, nodeLabels, node); err != nil {
			return nil, nil, nil, err
		}
		plan, reasons = slices.Degrade(node, plan, features)
	}
	return node, plan, reasons, nil
}

// discover reads the GPUs; those that do not answer are added back from
// their last description (Lost, with a gpu-lost condition) or reported.
func (a *Agent) discover(ctx context.Context) (*discovery.Node, error) {
	a.mu.RLock()
	sys, known := a.roots.Sys, a.known
	a.mu.RUnlock()
	node, err := discovery.DiscoverWith(ctx, a.opts.NVML, discovery.Options{SysRoot: sys})
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	notes := mergeLost(node, known)
	for _, g := range node.GPUs {
		if !g.Lost {
			continue
		}
		lost := false
		for _, c := range a.health.Conditions(g.UUID) {
			lost = lost || c.Kind == health.KindLost
		}
		if !lost {
			a.health.Publish(health.Event{UUID: g.UUID, Kind: health.KindLost, Message: "GPU does not answer NVML at discovery"})
		}
	}
	a.mu.Lock()
	a.notices = notes
	a.known = rememberGPUs(known, node)
	a.mu.Unlock()
	return node, nil
}

// saveState writes the known GPUs and the persistent health conditions.
func (a *Agent) saveState(ctx context.Context) {
	if a.opts.StatePath == "" {
		return
	}
	a.stateMu.Lock()
	defer a.stateMu.Unlock()
	a.mu.RLock()
	st := &nodeState{Version: stateVersion, GPUs: a.known, Conditions: persistentConditions(a.health.Unhealthy())}
	a.mu.RUnlock()
	if err := writeState(a.opts.StatePath, st); err != nil {
		klog.FromContext(ctx).Error(err, "Node state not saved; a restart may forget GPU health")
	}
}

// resync reads config and GPUs again; problems keep the last good state.
func (a *Agent) resync(ctx context.Context, controller *resourceslice.Controller) {
	logger := klog.FromContext(ctx)
	a.mu.RLock()
	cfg, labels, features := a.config, a.nodeObj.Labels, a.features
	a.mu.RUnlock()
	if a.opts.ConfigPath != "" {
		newCfg, err := partition.Load(a.opts.ConfigPath)
		if err != nil {
			publishErrors.WithLabelValues(a.opts.NodeName).Inc()
			logger.Error(err, "Keeping the last good partition config")
			a.event(v1.EventTypeWarning, "InvalidPartitionConfig", "keeping the last good partition config: %v", err)
		} else {
			cfg = newCfg
		}
	}
	node, plan, reasons, err := a.prepare(ctx, cfg, labels, features)
	if err != nil {
		publishErrors.WithLabelValues(a.opts.NodeName).Inc()
		logger.Error(err, "Keeping the last published devices")
		a.event(v1.EventTypeWarning, "PartitionFailed", "keeping the last published devices: %v", err)
		return
	}
	a.mu.Lock()
	a.config, a.node, a.plan, a.reasons = cfg, node, plan, reasons
	a.mu.Unlock()
	a.saveState(ctx)
	a.publish(ctx, controller)
}

// publish builds the pool from the current state and hands it to the
// controller, which writes only what changed.
func (a *Agent) publish(ctx context.Context, controller *resourceslice.Controller) {
	logger := klog.FromContext(ctx)
	a.mu.Lock()
	withdrawn := map[string][]contract.DeviceType{}
	for uuid, types := range a.withdrawn {
		for t := range types {
			withdrawn[uuid] = append(withdrawn[uuid], t)
		}
	}
	res := slices.Build(slices.Input{Node: a.node, Plan: a.plan, Features: a.features, Unhealthy: a.health.Unhealthy(), Withdrawn: withdrawn})
	a.counts = res.Counts
	var newlyDegraded, newNotices []string
	for _, d := range append(append([]string(nil), a.reasons...), res.Degraded...) {
		if !a.degraded[d] {
			a.degraded[d] = true
			newlyDegraded = append(newlyDegraded, d)
		}
	}
	for _, n := range a.notices {
		if !a.degraded[n] {
			a.degraded[n] = true
			newNotices = append(newNotices, n)
		}
	}
	a.mu.Unlock()
	for _, d := range newlyDegraded {
		logger.Info("Degraded: " + d)
		a.event(v1.EventTypeWarning, "DRAFeatureMissing", "%s", d)
	}
	for _, n := range newNotices {
		logger.Info("GPU unavailable: " + n)
		a.event(v1.EventTypeWarning, "GPUUnavailable", "%s", n)
	}
	controller.Update(&resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{a.opts.NodeName: res.Pool}})
	devicesPublished.WithLabelValues(a.opts.NodeName, string(contract.TypeGPU)).Set(float64(res.Counts.Whole))
	devicesPublished.WithLabelValues(a.opts.NodeName, string(contract.TypeMIG)).Set(float64(res.Counts.MIG))
	devicesPublished.WithLabelValues(a.opts.NodeName, string(contract.TypeShared)).Set(float64(res.Counts.Shared))
	slicesPublished.WithLabelValues(a.opts.NodeName).Set(float64(len(res.Pool.Slices)))
	logger.V(2).Info("Published", "slices", len(res.Pool.Slices), "whole", res.Counts.Whole, "mig", res.Counts.MIG, "shared", res.Counts.Shared)
	a.ready.Store(true)
}

// handlePublishError is the controller's error handler. A slice whose fields
// the API server dropped means the cluster lacks a feature the detection did
// not catch: the agent degrades and republishes instead of retrying forever.
func (a *Agent) handlePublishError(ctx context.Context, err error, msg string) {
	logger := klog.FromContext(ctx)
	publishErrors.WithLabelValues(a.opts.NodeName).Inc()
	a.ready.Store(false)
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		a.mu.Lock()
		before := a.features
		for _, f := range dropped.DisabledFeatures() {
			a.features = a.features.Without(f)
		}
		changed := before != a.features
		a.mu.Unlock()
		logger.Info("API server dropped ResourceSlice fields", "disabledFeatures", dropped.DisabledFeatures())
		if changed {
			a.Resync()
		}
		return
	}
	logger.Error(err, msg)
}

// event records an event on the Node.
func (a *Agent) event(eventType, reason, format string, args ...any) {
	a.mu.RLock()
	rec, node := a.recorder, a.nodeObj
	a.mu.RUnlock()
	if rec == nil || node == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID}
	rec.Eventf(ref, eventType, reason, format, args...)
}
