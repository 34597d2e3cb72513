package draplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/gpulock"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"

	"github.com/tessera-gpu/tessera/contract"
)

// DriverName is the DRA driver the plugin serves.
const DriverName = contract.DriverName

// Default directories.
const (
	DefaultRegistrarDir = kubeletplugin.KubeletRegistryDir
	DefaultPluginDir    = kubeletplugin.KubeletPluginsDir + "/" + DriverName
	DefaultCDIDir       = cdi.DefaultDir
	// DefaultMPSDir is short on purpose: MPS creates unix sockets in the
	// pipe directory, and socket paths are limited to 108 bytes.
	DefaultMPSDir = "/run/tessera/mps"
)

// OrphanMIGPolicy says what startup reconciliation does with MIG instances
// that no prepared claim holds. Instances tessera did not create (static
// layouts, an administrator's) are never destroyed under any policy.
type OrphanMIGPolicy string

const (
	// OrphanDestroy (the default) destroys the instances the plugin's
	// records say it created in this boot and no prepared claim holds, with
	// an OrphanMIGDestroyed event each.
	OrphanDestroy OrphanMIGPolicy = "destroy"
	// OrphanKeep keeps them, with an OrphanMIGKept event each.
	OrphanKeep OrphanMIGPolicy = "keep"
	// OrphanReport keeps them and also reports every instance no claim
	// holds that tessera did not create (ForeignMIGFound), for an operator
	// taking over a node.
	OrphanReport OrphanMIGPolicy = "report"
)

// OrphanMIGPolicies lists the policies, for flags.
var OrphanMIGPolicies = []OrphanMIGPolicy{OrphanDestroy, OrphanKeep, OrphanReport}

// Options configure the plugin.
type Options struct {
	// KubeClient reads ResourceClaims (required).
	KubeClient kubernetes.Interface
	// NodeName is the node the plugin serves (required).
	NodeName string
	// NVML is the initialised NVML library: real or a mock (required).
	NVML nvml.Interface
	// Node is the discovered node; discovered from NVML at Start when nil.
	Node *discovery.Node
	// Discovery, when set, returns the current discovery snapshot (the node
	// agent's, refreshed at its resyncs) and is used instead of Node for
	// every prepare, so that a GPU the agent switched to MIG after the
	// plugin started is known with its profiles.
	Discovery func() *discovery.Node

	// RegistrarDir is where the kubelet watches for registration sockets
	// (default /var/lib/kubelet/plugins_registry).
	RegistrarDir string
	// PluginDir holds the DRA socket and the checkpoint (default
	// /var/lib/kubelet/plugins/gpu.tessera.dev).
	PluginDir string
	// CDIDir receives the per-claim CDI specs (default /var/run/cdi).
	CDIDir string
	// MPSDir holds the MPS daemons' pipe and log directories (default
	// /run/tessera/mps).
	MPSDir string
	// Roots are where the driver installation is, as tessera-node sees it
	// (nil: nvmlbackend.RootsOf(NVML): the host's, or a mock machine's own):
	// nvcdi finds libraries and binaries under Roots.Driver and device nodes
	// under Roots.Dev; /proc/devices and the MIG capability table are read
	// under Roots.Proc.
	Roots *nvmlbackend.Roots
	// HostDriverRoot is Roots.Driver as the container runtime on the host
	// sees it (default Roots.Driver): spec host paths are written for it.
	HostDriverRoot string
	// CDIHookPath is nvidia-cdi-hook on the host (default /usr/bin/nvidia-cdi-hook).
	CDIHookPath string
	// GPULocks are shared with the node agent so that the agent's MIG
	// changes and the plugin's never interleave on one GPU (nil: own locks).
	GPULocks *gpulock.Locks
	// Withdraw, when set, is told that a GPU's devices of some types cannot
	// be prepared until a GPU reset (its MIG mode cannot change); the node
	// agent then stops publishing them.
	Withdraw func(gpuUUID string, types []contract.DeviceType, reason string)

	// Executor runs nvidia-smi and nvidia-cuda-mps-control (default: child
	// processes found on PATH).
	Executor executor.Executor
	// MPSLauncher starts each claim's MPS control daemon. tessera-node uses
	// a sharing.PodLauncher (a pod per daemon, which outlives tessera-node);
	// default: sharing.ProcessLauncher, a child of this process, which dies
	// with it on a real node (simulated nodes, tests).
	MPSLauncher sharing.Launcher
	// MPSStartTimeout bounds how long a prepare waits for a new daemon to
	// answer (default 40s).
	MPSStartTimeout time.Duration
	// Health, when set, feeds device health to the kubelet
	// (WatchHealthStatus). Without it the plugin declines health reporting.
	Health HealthSource
	// HealthResend is how often the full health report is re-sent so that
	// the kubelet does not mark devices unknown (default 20s, below the
	// kubelet's 30s timeout).
	HealthResend time.Duration

	// RollingUpdateUID enables seamless upgrades: the pod UID (downward
	// API) of this plugin instance. Old and new instance then share
	// PluginDir; gRPC calls are serialized across both with a file lock and
	// every call reloads the checkpoint.
	RollingUpdateUID types.UID
	// BootID of this node boot (default: read from /proc).
	BootID string
	// OrphanMIG is what reconciliation does with MIG instances the plugin
	// created that no claim holds (default OrphanDestroy).
	OrphanMIG OrphanMIGPolicy
	// Registry receives the plugin's metrics (one plugin per registry);
	// default: a registry of its own, see Plugin.Registry.
	Registry metrics.KubeRegistry
	// FatalError is called for errors the helper reports as fatal (a gRPC
	// server died). Default: log only.
	FatalError func(error)

	// crash, set by tests, is called after each side effect with its name.
	crash func(point string)
}

func (o *Options) complete() error {
	var errs []error
	if o.KubeClient == nil {
		errs = append(errs, errors.New("KubeClient is required"))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("NodeName is required"))
	}
	if o.NVML == nil {
		errs = append(errs, errors.New("NVML is required"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("draplugin options: %w", errors.Join(errs...))
	}
	if o.RegistrarDir == "" {
		o.RegistrarDir = DefaultRegistrarDir
	}
	if o.PluginDir == "" {
		o.PluginDir = DefaultPluginDir
	}
	if o.CDIDir == "" {
		o.CDIDir = DefaultCDIDir
	}
	if o.MPSDir == "" {
		o.MPSDir = DefaultMPSDir
	}
	if err := CheckSocketPaths(o.RegistrarDir, o.PluginDir, o.RollingUpdateUID); err != nil {
		return fmt.Errorf("draplugin options: %w", err)
	}
	if o.Executor == nil {
		o.Executor = executor.OS{}
	}
	if o.MPSLauncher == nil {
		o.MPSLauncher = sharing.ProcessLauncher{Exec: o.Executor}
	}
	if o.HealthResend <= 0 {
		o.HealthResend = 20 * time.Second
	}
	switch o.OrphanMIG {
	case "":
		o.OrphanMIG = OrphanDestroy
	case OrphanDestroy, OrphanKeep, OrphanReport:
	default:
		return fmt.Errorf("draplugin options: OrphanMIG %q is not one of %v", o.OrphanMIG, OrphanMIGPolicies)
	}
	if o.Roots == nil {
		roots, err := nvmlbackend.RootsOf(o.NVML)
		if err != nil {
			return fmt.Errorf("draplugin options: %w", err)
		}
		o.Roots = &roots
	}
	if o.BootID == "" {
		id, err := checkpoint.BootID()
		if err != nil {
			return err
		}
		o.BootID = id
	}
	return nil
}

// MaxSocketPath is the longest unix socket path Linux can bind: sun_path
// holds 108 bytes, the terminating NUL included.
const MaxSocketPath = 107

// CheckSocketPaths fails, naming the path and the limit, when a socket the
// kubelet plugin helper would create under registrarDir or pluginDir (with
// rollingUpdateUID, as kubeletplugin names them) is too long to bind; the
// kernel would refuse it with a bare EINVAL once the node is half started.
func CheckSocketPaths(registrarDir, pluginDir string, rollingUpdateUID types.UID) error {
	registration, dra := DriverName+"-reg.sock", "dra.sock"
	if rollingUpdateUID != "" {
		// The helper shortens the registration socket's name to fit where it
		// can; the DRA socket always carries the whole UID.
		registration = kubeletplugin.RollingUpdateRegistrarSocketFile(registrarDir, DriverName, rollingUpdateUID)
		dra = "dra-" + string(rollingUpdateUID) + ".sock"
	}
	var errs []error
	for _, s := range []struct{ path, flag string }{
		{filepath.Join(registrarDir, registration), "--kubelet-registry-dir"},
		{filepath.Join(pluginDir, dra), "--kubelet-plugin-dir"},
	} {
		if len(s.path) > MaxSocketPath {
			errs = append(errs, fmt.Errorf("socket path %s is %d bytes, longer than the %d a unix socket path may have (sun_path holds 108 with the terminating NUL): choose a shorter %s", s.path, len(s.path), MaxSocketPath, s.flag))
		}
	}
	return errors.Join(errs...)
}

func (o *Options) checkpointPath() string { return filepath.Join(o.PluginDir, "checkpoint.json") }

func (o *Options) crashPoint(name string) {
	if o.crash != nil {
		o.crash(name)
	}
}

// HealthSource delivers GPU health events; the node agent's
// *health.Broadcaster is one.
type HealthSource interface {
	// Subscribe returns a channel that first carries every unhealthy
	// condition that holds now and then every change, until ctx is done.
	Subscribe(ctx context.Context) <-chan health.Event
}
