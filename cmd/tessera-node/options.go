package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/cmd/internal/gomemlimit"
	"github.com/tessera-gpu/tessera/cmd/internal/kubeconfig"
	"github.com/tessera-gpu/tessera/draplugin"
	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/internal/metricsconv"
	"github.com/tessera-gpu/tessera/internal/secureserve"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
)

type options struct {
	// memoryLimitRatio: the Go runtime's soft memory limit as a share of the
	// container's (cmd/internal/gomemlimit).
	memoryLimitRatio float64
	nodeName         string
	kubeconfig       string
	backend          string
	configPath       string
	resyncPeriod     time.Duration
	startupTimeout   time.Duration
	benignXIDs       []uint
	xidRecovery      time.Duration
	probeInterval    time.Duration

	// The kubelet DRA plugin.
	registrarDir string
	pluginDir    string
	cdiDir       string
	mpsDir       string
	podUID       string
	orphanMIG    string
	// The driver installation: on the host, and as mounted into tessera-node.
	driverRoot          string
	containerDriverRoot string
	cdiHookPath         string
	stateFile           string
	// The classic device plugin, for GPUs in devicePlugin mode.
	devicePluginConfig string
	// Where the claims' MPS control daemons run.
	mpsDaemon              string
	mpsDaemonImage         string
	mpsDaemonPullPolicy    string
	mpsDaemonNamespace     string
	mpsDaemonRuntimeClass  string
	mpsDaemonPriorityClass string
	mpsStartTimeout        time.Duration

	logging     *logsapi.LoggingConfiguration
	featureGate featuregate.MutableVersionedFeatureGate

	// serving: /healthz, /readyz, /livez and /metrics over HTTPS with
	// delegated authentication and authorization (the kube-scheduler's
	// flags), plain HTTP only with --http-address.
	serving *secureserve.Options
}

// DefaultSecurePort is where the HTTPS endpoint listens by default.
const DefaultSecurePort = 10358

func newOptions() *options {
	o := &options{
		nodeName:            os.Getenv("NODE_NAME"),
		memoryLimitRatio:    gomemlimit.DefaultRatio,
		backend:             nvmlbackend.Real,
		resyncPeriod:        time.Minute,
		startupTimeout:      30 * time.Second,
		probeInterval:       10 * time.Second,
		registrarDir:        draplugin.DefaultRegistrarDir,
		pluginDir:           draplugin.DefaultPluginDir,
		cdiDir:              draplugin.DefaultCDIDir,
		mpsDir:              draplugin.DefaultMPSDir,
		podUID:              os.Getenv("POD_UID"),
		orphanMIG:           string(draplugin.OrphanDestroy),
		mpsDaemon:           mpsDaemonPod,
		mpsDaemonNamespace:  os.Getenv("POD_NAMESPACE"),
		mpsDaemonPullPolicy: string(corev1.PullIfNotPresent),
		mpsStartTimeout:     40 * time.Second,
		driverRoot:          "/",
		cdiHookPath:         cdi.DefaultHookPath,
		logging:             logsapi.NewLoggingConfiguration(),
		featureGate:         featuregate.NewFeatureGate(),
		serving:             secureserve.NewOptions("tessera-node", DefaultSecurePort),
	}
	// Logging features (contextual logging, JSON options) are the only
	// feature gates so far; tessera's own would be added to the same gate.
	if err := logsapi.AddFeatureGates(o.featureGate); err != nil {
		panic(fmt.Sprintf("register logging feature gates: %v", err)) // programming error, at init
	}
	return o
}

func (o *options) addPluginFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.registrarDir, "kubelet-registry-dir", o.registrarDir, "Directory where the kubelet watches for plugin registration sockets.")
	fs.StringVar(&o.pluginDir, "kubelet-plugin-dir", o.pluginDir, "Directory for the DRA plugin's socket and its checkpoint (keep it on the host: the checkpoint must survive restarts).")
	fs.StringVar(&o.cdiDir, "cdi-dir", o.cdiDir, "Directory the container runtime reads CDI specs from; one transient spec per prepared claim is written there.")
	fs.StringVar(&o.mpsDir, "mps-dir", o.mpsDir, "Host directory for the MPS control daemons' pipe and log directories (short: MPS creates unix sockets under it).")
	fs.StringVar(&o.podUID, "pod-uid", o.podUID, "UID of this pod (default $POD_UID, from the downward API); enables seamless rolling updates of the kubelet plugin.")
	fs.StringVar(&o.devicePluginConfig, "device-plugin-config", "", "Device plugin config (YAML, see docs/deviceplugin.md) for GPUs the partition config puts in devicePlugin mode; empty uses the defaults (tessera.dev/gpu).")
	fs.StringVar(&o.orphanMIG, "orphan-mig", o.orphanMIG, fmt.Sprintf("What startup does with MIG instances tessera created that no claim holds: %v. Instances tessera did not create are never destroyed; report also lists them as events.", draplugin.OrphanMIGPolicies))
	fs.StringVar(&o.driverRoot, "driver-root", o.driverRoot, "Host directory where the NVIDIA driver is installed: / for a driver on the host, /run/nvidia/driver for the GPU operator's driver container. CDI specs mount the driver's libraries and binaries from there. A mock --backend uses its own driver installation unless this names another directory than /.")
	fs.StringVar(&o.containerDriverRoot, "container-driver-root", "", "Where --driver-root is mounted inside this container (default: the same path).")
	fs.StringVar(&o.cdiHookPath, "nvidia-cdi-hook-path", o.cdiHookPath, "Host path of nvidia-cdi-hook (NVIDIA container toolkit), which the container runtime runs to create the driver libraries' links and update the ldcache; the GPU operator installs it as /usr/local/nvidia/toolkit/nvidia-cdi-hook.")
	fs.StringVar(&o.stateFile, "state-file", "", "File where the agent keeps the last description of every GPU and their XID/ECC conditions over restarts (default: node-state.json in --kubelet-plugin-dir); it must be on the host.")
	fs.StringVar(&o.mpsDaemon, "mps-daemon", o.mpsDaemon, "Where each claim's MPS control daemon runs: pod (a pod of its own, bound to this node in --mps-daemon-namespace: it outlives restarts and upgrades of tessera-node) or process (a child of tessera-node, which dies with it: simulated nodes and tessera-node outside a container).")
	fs.StringVar(&o.mpsDaemonImage, "mps-daemon-image", "", "Image of the MPS daemon pods: tessera's (they run tessera-node mps-daemon). Without it, MPS claims fail to prepare with that reason.")
	fs.StringVar(&o.mpsDaemonPullPolicy, "mps-daemon-image-pull-policy", o.mpsDaemonPullPolicy, "Pull policy of the MPS daemon pods' image.")
	fs.StringVar(&o.mpsDaemonNamespace, "mps-daemon-namespace", o.mpsDaemonNamespace, "Namespace of the MPS daemon pods (default $POD_NAMESPACE: tessera-node's own).")
	fs.StringVar(&o.mpsDaemonRuntimeClass, "mps-daemon-runtime-class", "", "RuntimeClass of the MPS daemon pods (the NVIDIA runtime: it gives a pod exactly its claim's devices and the driver's tools, unprivileged). Empty: the pods are privileged and run the tools chrooted into --driver-root.")
	fs.StringVar(&o.mpsDaemonPriorityClass, "mps-daemon-priority-class", "", "PriorityClass of the MPS daemon pods (evicting one stops its claim's workloads).")
	fs.DurationVar(&o.mpsStartTimeout, "mps-start-timeout", o.mpsStartTimeout, "How long a prepare waits for a new MPS daemon to answer.")
}

// The values of --mps-daemon.
const (
	mpsDaemonPod     = "pod"
	mpsDaemonProcess = "process"
)

// mpsLauncher is where the claims' MPS daemons start (--mps-daemon).
func (o *options) mpsLauncher(client kubernetes.Interface) (sharing.Launcher, error) {
	switch o.mpsDaemon {
	case mpsDaemonProcess:
		return sharing.ProcessLauncher{Exec: executor.OS{}}, nil
	case mpsDaemonPod:
	default:
		return nil, fmt.Errorf("--mps-daemon must be %s or %s, got %q", mpsDaemonPod, mpsDaemonProcess, o.mpsDaemon)
	}
	var missing []string
	if o.mpsDaemonImage == "" {
		missing = append(missing, "--mps-daemon-image")
	}
	if o.mpsDaemonNamespace == "" {
		missing = append(missing, "--mps-daemon-namespace (or $POD_NAMESPACE)")
	}
	if len(missing) > 0 {
		return unconfiguredLauncher{reason: fmt.Sprintf("tessera-node runs with --mps-daemon=pod but without %s: MPS claims cannot be prepared", strings.Join(missing, " and "))}, nil
	}
	return &sharing.PodLauncher{
		Client: client, Namespace: o.mpsDaemonNamespace, NodeName: o.nodeName,
		Image: o.mpsDaemonImage, PullPolicy: corev1.PullPolicy(o.mpsDaemonPullPolicy),
		MPSDir: o.mpsDir, RuntimeClassName: o.mpsDaemonRuntimeClass, HostDriverRoot: o.driverRoot,
		PriorityClassName: o.mpsDaemonPriorityClass,
		Resources:         corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
	}, nil
}

// unconfiguredLauncher fails every MPS prepare with the reason; it has
// nothing to list or remove.
type unconfiguredLauncher struct{ reason string }

func (u unconfiguredLauncher) Name() string { return mpsDaemonPod }
func (u unconfiguredLauncher) Launch(context.Context, sharing.DaemonSpec, sharing.Dirs) error {
	return errors.New(u.reason)
}
func (u unconfiguredLauncher) Remove(context.Context, string) error       { return nil }
func (u unconfiguredLauncher) Launched(context.Context) ([]string, error) { return nil, nil }
func (u unconfiguredLauncher) Describe(context.Context, string) string    { return u.reason }

func (o *options) addFlags(fs *pflag.FlagSet) {
	o.addPluginFlags(fs)
	fs.Float64Var(&o.memoryLimitRatio, "memory-limit-ratio", o.memoryLimitRatio, gomemlimit.FlagUsage)
	fs.StringVar(&o.nodeName, "node-name", o.nodeName, "Name of the Node this agent runs on (default $NODE_NAME).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty: $KUBECONFIG, else the in-cluster service account.")
	fs.StringVar(&o.backend, "backend", o.backend, fmt.Sprintf("NVML backend: %q (libnvidia-ml.so.1), %q, or %q<machine>[?gpus=N] with machine one of %s.", nvmlbackend.Real, nvmlbackend.Real+":<library path>", nvmlbackend.MockPrefix, strings.Join(nvmlbackend.MockMachines(), ", ")))
	fs.StringVar(&o.configPath, "config", "", "Partition config file (YAML, see docs/nodeagent.md); empty offers every GPU whole. Read again at every resync.")
	o.serving.AddFlags(fs, "http-address", "/healthz, /readyz, /livez and /metrics")
	fs.DurationVar(&o.resyncPeriod, "resync-period", o.resyncPeriod, "How often GPUs and the partition config are read again.")
	fs.DurationVar(&o.startupTimeout, "startup-timeout", o.startupTimeout, "How long to wait for the API server and the Node at start before exiting with an error.")
	fs.UintSliceVar(&o.benignXIDs, "benign-xids", nil, fmt.Sprintf("XIDs to ignore in addition to the built-in %v.", health.DefaultBenignXIDs))
	fs.DurationVar(&o.xidRecovery, "xid-recovery-period", 0, "A GPU that answers NVML this long after its last critical XID or ECC error loses its taint; 0 keeps the taint until restart.")
	fs.DurationVar(&o.probeInterval, "health-probe-interval", o.probeInterval, "How often each GPU is probed for being lost or back.")
	logsapi.AddFlags(o.logging, fs)
	o.featureGate.AddFlag(fs)
}

func (o *options) applyLogging() error {
	if err := logsapi.ValidateAndApply(o.logging, o.featureGate); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	return nil
}

// validate checks what can be checked before anything is started, so that a
// bad flag or config file exits at once with a message naming it.
func (o *options) validate() (*partition.Config, error) {
	if o.nodeName == "" {
		return nil, errors.New("--node-name (or $NODE_NAME) is required")
	}
	if err := gomemlimit.Validate(o.memoryLimitRatio); err != nil {
		return nil, err
	}
	if o.resyncPeriod <= 0 {
		return nil, fmt.Errorf("--resync-period must be positive, got %s", o.resyncPeriod)
	}
	if o.startupTimeout <= 0 {
		return nil, fmt.Errorf("--startup-timeout must be positive, got %s", o.startupTimeout)
	}
	if o.probeInterval <= 0 {
		return nil, fmt.Errorf("--health-probe-interval must be positive, got %s", o.probeInterval)
	}
	if errs := o.serving.Validate(); len(errs) > 0 {
		return nil, utilerrors.NewAggregate(errs)
	}
	if _, err := nvmlbackend.ParseSpec(o.backend); err != nil {
		return nil, fmt.Errorf("--backend: %w", err)
	}
	if o.mpsDaemon != mpsDaemonPod && o.mpsDaemon != mpsDaemonProcess {
		return nil, fmt.Errorf("--mps-daemon must be %s or %s, got %q", mpsDaemonPod, mpsDaemonProcess, o.mpsDaemon)
	}
	if !slices.Contains(draplugin.OrphanMIGPolicies, draplugin.OrphanMIGPolicy(o.orphanMIG)) {
		return nil, fmt.Errorf("--orphan-mig must be one of %v, got %q", draplugin.OrphanMIGPolicies, o.orphanMIG)
	}
	// Before anything is started: the kernel refuses a socket path that is
	// too long with a bare EINVAL, after the node has been published.
	if err := draplugin.CheckSocketPaths(o.registrarDir, o.pluginDir, types.UID(o.podUID)); err != nil {
		return nil, err
	}
	for flag, v := range map[string]string{"--driver-root": o.driverRoot, "--container-driver-root": o.containerDriverRoot, "--nvidia-cdi-hook-path": o.cdiHookPath} {
		if v != "" && !filepath.IsAbs(v) {
			return nil, fmt.Errorf("%s must be an absolute path, got %q", flag, v)
		}
	}
	if _, err := o.loadDevicePluginConfig(); err != nil {
		return nil, err
	}
	if o.configPath == "" {
		return nil, nil
	}
	return partition.Load(o.configPath)
}

func (o *options) loadDevicePluginConfig() (deviceplugin.Config, error) {
	if o.devicePluginConfig == "" {
		return deviceplugin.Config{}, nil
	}
	data, err := os.ReadFile(o.devicePluginConfig)
	if err != nil {
		return deviceplugin.Config{}, fmt.Errorf("--device-plugin-config: %w", err)
	}
	cfg, err := deviceplugin.ParseConfig(data)
	if err != nil {
		return deviceplugin.Config{}, fmt.Errorf("--device-plugin-config %s: %w", o.devicePluginConfig, err)
	}
	return cfg, nil
}

// pluginComponents are the kubelet-facing parts that run beside the agent:
// the DRA plugin for GPUs published through DRA, and the device plugin for
// GPUs in devicePlugin mode (idle while there are none).
// Their metrics are served on /metrics beside the agent's (pluginMetrics);
// a fatal error of the DRA plugin's gRPC servers ends the process so that
// the DaemonSet restarts it, rather than leaving a node the kubelet cannot
// reach.
func (o *options) pluginComponents(client kubernetes.Interface, fatal func(error)) ([]agent.Component, prometheus.Gatherers, error) {
	dpConfig, err := o.loadDevicePluginConfig()
	if err != nil {
		return nil, nil, err
	}
	launcher, err := o.mpsLauncher(client)
	if err != nil {
		return nil, nil, err
	}
	if u, ok := launcher.(unconfiguredLauncher); ok {
		klog.Background().Info("MPS claims cannot be prepared", "reason", u.reason)
	}
	draMetrics := metrics.NewKubeRegistry()
	dpMetrics := &deviceplugin.Gatherer{}
	return []agent.Component{
		draplugin.Component(draplugin.Options{
			KubeClient:       client,
			MPSLauncher:      launcher,
			MPSStartTimeout:  o.mpsStartTimeout,
			RegistrarDir:     o.registrarDir,
			PluginDir:        o.pluginDir,
			CDIDir:           o.cdiDir,
			MPSDir:           o.mpsDir,
			RollingUpdateUID: types.UID(o.podUID),
			OrphanMIG:        draplugin.OrphanMIGPolicy(o.orphanMIG),
			HostDriverRoot:   o.driverRoot,
			CDIHookPath:      o.cdiHookPath,
			Registry:         draMetrics,
			FatalError:       fatal,
		}),
		deviceplugin.AgentComponent(dpConfig, 0, dpMetrics),
	}, prometheus.Gatherers{draMetrics, dpMetrics}, nil
}

func (o *options) restConfig() (*rest.Config, error) {
	return kubeconfig.Load(kubeconfig.Options{Path: o.kubeconfig, UserAgent: "tessera-node"})
}

// run is the whole binary: check, open NVML, connect, serve endpoints, run
// the agent (and the extra components) until ctx is done.
func run(ctx context.Context, o *options, components []agent.Component) error {
	logger := klog.FromContext(ctx)
	cfg, err := o.validate()
	if err != nil {
		return err
	}
	gomemlimit.Apply(logger, o.memoryLimitRatio)
	lib, err := nvmlbackend.Open(o.backend)
	if err != nil {
		return err
	}
	defer lib.Shutdown()
	restCfg, err := o.restConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}

	roots, err := o.roots(lib)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	plugins, pluginMetrics, err := o.pluginComponents(client, func(err error) {
		logger.Error(err, "Kubelet plugin failed; stopping so that tessera-node is restarted")
		cancel(fmt.Errorf("kubelet plugin: %w", err))
	})
	if err != nil {
		return err
	}
	components = append(plugins, components...)

	var benign []uint64
	for _, x := range o.benignXIDs {
		benign = append(benign, uint64(x))
	}
	stateFile := o.stateFile
	if stateFile == "" {
		stateFile = filepath.Join(o.pluginDir, "node-state.json")
	}
	a, err := agent.New(agent.Options{
		KubeClient:     client,
		NodeName:       o.nodeName,
		NVML:           lib,
		Roots:          roots,
		StatePath:      stateFile,
		Config:         cfg,
		ConfigPath:     o.configPath,
		Monitor:        &health.MonitorOptions{ExtraBenignXIDs: benign, ProbeInterval: o.probeInterval, XIDRecovery: o.xidRecovery},
		ResyncPeriod:   o.resyncPeriod,
		StartupTimeout: o.startupTimeout,
		Components:     components,
	})
	if err != nil {
		return err
	}

	// HTTPS with delegated authentication and authorization, plain HTTP
	// only with --http-address (internal/secureserve).
	o.serving.DefaultKubeconfig(o.kubeconfig)
	srv, err := o.serving.Serve(ctx, endpoints(a, pluginMetrics))
	if err != nil {
		return err
	}
	defer srv.Stop()
	logger.Info("Starting", "node", o.nodeName, "backend", o.backend, "config", o.configPath)
	if err := a.Run(ctx); err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // a fatal plugin error, not a signal
	}
	return nil
}

// roots says where the driver installation is as this process sees it: a
// mock backend's own unless --driver-root names another directory than /
// (the chart always passes --container-driver-root), else the container's
// mount of --driver-root.
func (o *options) roots(lib nvml.Interface) (*nvmlbackend.Roots, error) {
	if _, mock := lib.(*nvmlbackend.Mock); mock && o.driverRoot == "/" {
		r, err := nvmlbackend.RootsOf(lib)
		if err != nil {
			return nil, err
		}
		o.driverRoot = r.Driver // its files are where this process sees them
		return &r, nil
	}
	r := nvmlbackend.HostRoots
	r.Driver = o.driverRoot
	if o.containerDriverRoot != "" {
		r.Driver = o.containerDriverRoot
	}
	r.Dev = "/"
	if _, err := os.Stat(filepath.Join(r.Driver, "dev", "nvidiactl")); err == nil {
		r.Dev = r.Driver
	}
	return &r, nil
}

func endpoints(a *agent.Agent, pluginMetrics prometheus.Gatherers) http.Handler {
	mux := http.NewServeMux()
	for _, path := range []string{"/healthz", "/livez"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("ok\n"))
		})
	}
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Ready() {
			http.Error(w, "not published yet", http.StatusServiceUnavailable)
			return
		}
		c := a.Counts()
		_, _ = w.Write([]byte("ok: " + strconv.Itoa(c.Whole) + " whole, " + strconv.Itoa(c.MIG) + " MIG, " + strconv.Itoa(c.Shared) + " shared\n"))
	})
	// The agent's metrics live in the legacy registry; each plugin keeps a
	// registry of its own (internal/metricsconv).
	mux.Handle("/metrics", metricsconv.Handler(pluginMetrics...))
	return mux
}
