// Package sandbox runs a local tessera cluster: the real control plane from
// sandbox/cluster (etcd, kube-apiserver, kube-controller-manager), simulated GPU
// nodes — each a simulated kubelet plus tessera-node's agent and kubelet DRA
// plugin on a mock NVML backend, over real sockets — and tessera-scheduler,
// with the CRDs, DeviceClasses and example queues installed. `tessera sandbox
// up` and the demo (`make demo`) drive it.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/deployments/crds"
	"github.com/tessera-gpu/tessera/deployments/deviceclasses"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/sandbox/cluster"
	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
	"github.com/tessera-gpu/tessera/sandbox/operators"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
)

// Options configure a sandbox.
type Options struct {
	// StateDir holds the sandbox's pid file, kubeconfig, control-plane state
	// and the nodes' plugin directories.
	StateDir string
	// Out receives the narration.
	Out io.Writer
	// Nodes is the number of simulated GPU nodes (default 4).
	Nodes int
	// GPU is the mock machine of every node: a100, h100, h200 or b200
	// (default h100: DGX H100, 8 GPUs).
	GPU string
	// MIG offers GPUs 0–3 of the last node as dynamic MIG devices.
	MIG bool
	// Shared offers GPUs 4–7 of the last node as shared GPUs (fractions).
	Shared bool
	// Scenario is "" (none) or "demo".
	Scenario string
	// Keep keeps the sandbox running after the scenario until ctx ends.
	Keep bool
	// Speed divides the scenario's simulated run times (default 1).
	Speed float64
	// Operators are the workload operators to run against the sandbox's API
	// server (package sandbox/operators names them; default none).
	Operators []string
	// RealNode adds one real node (sandbox/realnode: kubelet, containerd, real
	// containers) beside the simulated ones where the machine allows it.
	RealNode bool
	// WebAddress is where the web view and /metrics are served (default
	// 127.0.0.1 on a free port; the narration prints the URL).
	WebAddress string
	// BinDir holds the Kubernetes binaries; default: k8sbin's cache, where
	// Start builds whichever of etcd, kube-apiserver,
	// kube-controller-manager and kubectl is missing.
	BinDir string
}

// DefaultStateDir is where `tessera sandbox up` keeps its state, so that
// `tessera sandbox down` finds it from any working directory.
func DefaultStateDir() string {
	if dir := os.Getenv("TESSERA_SANDBOX_DIR"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "tessera-sandbox")
	}
	return filepath.Join(home, ".tessera", "sandbox")
}

const pidFile = "sandbox.pid"

// Sandbox is a running sandbox.
type Sandbox struct {
	opts       Options
	out        io.Writer
	start      time.Time
	cp         *cluster.ControlPlane
	client     kubernetes.Interface
	config     *rest.Config
	nodes      []*simNode
	scheduler  *runningScheduler
	operators  *operators.Set
	web        *webServer
	kubeconfig string
	realNode   *realnode.Node
}

func (o *Options) defaults() error {
	if o.Nodes == 0 {
		o.Nodes = 4
	}
	if o.Nodes < 1 || o.Nodes > 64 {
		return fmt.Errorf("--nodes %d: must be between 1 and 64", o.Nodes)
	}
	if o.GPU == "" {
		o.GPU = "h100"
	}
	machine := "dgx" + strings.ToLower(o.GPU)
	if _, err := nvmlbackend.ParseSpec("mock:" + machine); err != nil {
		return fmt.Errorf("--gpu %q: want a100, h100, h200 or b200", o.GPU)
	}
	if o.Speed <= 0 {
		o.Speed = 1
	}
	switch o.Scenario {
	case "", "demo":
	default:
		return fmt.Errorf("--scenario %q: the only scenario is demo", o.Scenario)
	}
	if o.Scenario == "demo" {
		// The demo needs MIG and shared GPUs, and room for both teams.
		o.MIG, o.Shared = true, true
		if o.Nodes < 4 {
			return fmt.Errorf("--scenario demo needs at least 4 nodes, got %d", o.Nodes)
		}
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return nil
}

// Up starts the sandbox, runs the scenario if one is chosen, and blocks until
// ctx is cancelled (or, without Keep, until the scenario ends). Then it stops
// everything it started and removes its state.
func Up(ctx context.Context, opts Options) (err error) {
	if err := opts.defaults(); err != nil {
		return err
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return fmt.Errorf("sandbox state dir: %w", err)
	}
	if pid, alive := runningPID(opts.StateDir); alive {
		return fmt.Errorf("a sandbox is already running (pid %d, state in %s); stop it with `tessera sandbox down`", pid, opts.StateDir)
	}
	if err := os.WriteFile(filepath.Join(opts.StateDir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	defer os.Remove(filepath.Join(opts.StateDir, pidFile))

	s, err := Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if stopErr := s.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
	}()
	if opts.Scenario == "demo" {
		res, err := s.RunDemo(ctx)
		if err != nil {
			return err
		}
		if !res.OK() {
			return fmt.Errorf("demo scenario did not end as expected: %s", res.Problems())
		}
		if !opts.Keep {
			return nil
		}
		fmt.Fprintf(s.out, "\n--keep: the sandbox stays up. Press Ctrl-C here, or run `tessera sandbox down`, to stop it.\n")
	}
	<-ctx.Done()
	return nil
}

// Start brings the sandbox up and returns once every node has published its
// GPUs and the scheduler runs.
func Start(ctx context.Context, opts Options) (s *Sandbox, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	sb := &Sandbox{opts: opts, out: opts.Out, start: time.Now()}
	defer func() {
		if err != nil {
			_ = sb.Stop() // the returned Sandbox is nil: clean up what started
		}
	}()
	s = sb
	if opts.BinDir == "" {
		opts.BinDir, err = k8sbin.Ensure(ctx, k8sbin.Options{Out: s.out}, k8sbin.Sandbox...)
		if err != nil {
			return nil, err
		}
		s.opts.BinDir = opts.BinDir
		// The sandbox's own start (and the demo's "first gang bound after")
		// is timed from here: a first run's build has its own lines.
		s.start = time.Now()
	}
	cpDir := filepath.Join(opts.StateDir, "controlplane")
	_ = os.RemoveAll(cpDir) // state of an earlier sandbox that was killed
	s.say("starting the control plane (etcd, kube-apiserver, kube-controller-manager)")
	s.cp, err = cluster.Start(ctx, cluster.Options{
		Dir:                 cpDir,
		BinDir:              opts.BinDir,
		Log:                 func(format string, args ...any) { s.say("  "+format, args...) },
		ExtraAPIServerFlags: realnode.APIServerFlags,
	})
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	s.config = s.cp.Config
	s.kubeconfig = KubeconfigPath(opts.StateDir)
	if err := cluster.WriteKubeconfig(s.config, s.kubeconfig); err != nil {
		return nil, err
	}
	s.client, err = kubernetes.NewForConfig(s.config)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}

	ap, err := newApplier(s.config)
	if err != nil {
		return nil, err
	}
	s.say("installing CRDs (Queue, PodGroup, ShadowReport, WorkloadDefinition) and DeviceClasses")
	if _, err := ap.applyFS(ctx, crds.FS); err != nil {
		return nil, fmt.Errorf("install CRDs: %w", err)
	}
	if _, err := ap.applyFS(ctx, deviceclasses.FS); err != nil {
		return nil, fmt.Errorf("install DeviceClasses: %w", err)
	}

	if err := s.startNodes(ctx); err != nil {
		return nil, err
	}
	if opts.RealNode {
		s.realNode, err = realnode.StartForSandbox(ctx, realnode.SandboxOptions{NodeName: "real-node-0", Kubeconfig: s.kubeconfig,
			Machine: "dgx" + strings.ToLower(opts.GPU), Config: s.partitionConfig(), Labels: map[string]string{partitionLabel: "mixed"}, Log: s.say, Out: s.out})
		if errors.Is(err, realnode.ErrUnavailable) {
			s.say("--real-node: %v; running the simulated nodes only", err)
		} else if err != nil {
			return nil, fmt.Errorf("start the real node: %w", err)
		} else {
			s.say("  real node %s: kubelet and containerd; pods that tolerate %s=%s and use image %s run real containers", s.realNode.Name(), realnode.SandboxTaint.Key, realnode.SandboxTaint.Value, realnode.BusyboxImage)
		}
	}
	s.say("starting tessera-scheduler")
	s.scheduler, err = startScheduler(ctx, s.config)
	if err != nil {
		return nil, err
	}
	if len(opts.Operators) > 0 {
		s.say("starting workload operators: %s", strings.Join(opts.Operators, ", "))
		s.operators, err = operators.Start(ctx, opts.Operators, operators.Options{
			Config: s.config, Kubeconfig: s.kubeconfig, Dir: filepath.Join(opts.StateDir, "operators"),
			Log: func(format string, args ...any) { s.say("  "+format, args...) },
			Out: s.out,
		})
		if err != nil {
			return nil, fmt.Errorf("start operators: %w", err)
		}
	}
	s.say("creating the example queues (research → team-a, team-b) and namespaces")
	if err := s.applyDemoFile(ctx, ap, "00-queues.yaml"); err != nil {
		return nil, err
	}
	addr := opts.WebAddress
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if err := s.startWeb(ctx, addr); err != nil {
		return nil, err
	}

	v, err := s.client.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("server version: %w", err)
	}
	s.say("")
	real := ""
	if s.realNode != nil {
		real = " and 1 real node (" + s.realNode.Name() + ")"
	}
	s.say("tessera sandbox is up in %s: Kubernetes %s at %s, %d simulated %s nodes%s", time.Since(s.start).Round(100*time.Millisecond), v.GitVersion, s.config.Host, len(s.nodes), strings.ToUpper(opts.GPU), real)
	s.say("")
	s.say("  export KUBECONFIG=%s", s.kubeconfig)
	s.say("  tessera top                        # GPUs, queues and gangs, live")
	s.say("  open %s       # the same in a browser (metrics at /metrics)", s.URL())
	s.say("  tessera get gangs -o json          # for scripts")
	kubectl := "kubectl " + k8sbin.KubernetesVersion()
	if path := filepath.Join(opts.BinDir, k8sbin.Kubectl.Name); fileExists(path) {
		kubectl = path
	}
	s.say("  tessera sandbox kubectl get nodes  # %s with this kubeconfig", kubectl)
	s.say("")
	return s, nil
}

func (s *Sandbox) startNodes(ctx context.Context) error {
	machine := "mock:dgx" + strings.ToLower(s.opts.GPU)
	cfg := s.partitionConfig()
	last := fmt.Sprintf("gpu-node-%d", s.opts.Nodes-1)
	for i := range s.opts.Nodes {
		name := fmt.Sprintf("gpu-node-%d", i)
		labels := map[string]string{
			"nvidia.com/gpu.present":    "true",
			"topology.tessera.dev/rack": fmt.Sprintf("rack-%d", i/2),
		}
		if name == last && (s.opts.MIG || s.opts.Shared) {
			labels[partitionLabel] = "mixed"
		}
		n, err := startNode(ctx, s.client, filepath.Join(s.opts.StateDir, "nodes", name), nodeSpec{
			name: name, backend: machine, labels: labels, config: cfg,
			bootID: "sandbox-" + strconv.FormatInt(s.start.UnixNano(), 10),
		})
		if err != nil {
			return err
		}
		s.nodes = append(s.nodes, n)
	}
	desc := "whole GPUs"
	if s.opts.MIG || s.opts.Shared {
		var parts []string
		if s.opts.MIG {
			parts = append(parts, "GPUs 0-3 dynamic MIG")
		}
		if s.opts.Shared {
			parts = append(parts, "GPUs 4-7 shared")
		}
		desc += "; " + last + ": " + strings.Join(parts, ", ")
	}
	s.say("starting %d simulated %s nodes (%s)", s.opts.Nodes, strings.ToUpper(s.opts.GPU), desc)
	deadline := time.Now().Add(90 * time.Second)
	for {
		ready := 0
		for _, n := range s.nodes {
			if err := n.failed(); err != nil {
				return fmt.Errorf("node %s: %w", n.name, err)
			}
			if n.ready() {
				ready++
			}
		}
		if ready == len(s.nodes) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d nodes published their GPUs within 90s", ready, len(s.nodes))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	slices, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ResourceSlices: %w", err)
	}
	devices := 0
	for _, sl := range slices.Items {
		devices += len(sl.Spec.Devices)
	}
	s.say("  %d nodes published %d ResourceSlices with %d devices", len(s.nodes), len(slices.Items), devices)
	return nil
}

// partitionLabel selects the partition config entry of the mixed node.
const partitionLabel = "tessera.dev/sandbox-partition"

func (s *Sandbox) partitionConfig() *partition.Config {
	var rules []partition.GPURule
	if s.opts.MIG {
		rules = append(rules, partition.GPURule{Indices: []int{0, 1, 2, 3}, Mode: partition.ModeDynamicMIG})
	}
	if s.opts.Shared {
		rules = append(rules, partition.GPURule{Indices: []int{4, 5, 6, 7}, Mode: partition.ModeShared})
	}
	if len(rules) == 0 {
		return nil
	}
	return &partition.Config{Nodes: []partition.NodeEntry{{
		Name:         "sandbox-mixed",
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{partitionLabel: "mixed"}},
		NodeConfig:   partition.NodeConfig{GPUs: rules},
	}}}
}

// Operators returns the workload operators the sandbox runs (nil for none).
func (s *Sandbox) Operators() *operators.Set { return s.operators }
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Kubeconfig is the path of the sandbox's kubeconfig file.
func (s *Sandbox) Kubeconfig() string { return s.kubeconfig }

// KubeconfigPath is where a sandbox with this state directory writes its
// kubeconfig while it runs.
func KubeconfigPath(stateDir string) string { return filepath.Join(stateDir, "kubeconfig") }

// Config returns an admin client configuration for the sandbox's API server.
func (s *Sandbox) Config() *rest.Config { return s.config }

// Stop ends the scheduler, the nodes and the control plane, and removes the
// sandbox's state. It is safe to call on a partly started sandbox.
func (s *Sandbox) Stop() error {
	s.say("stopping the sandbox...")
	var errs []error
	if s.web != nil {
		if err := s.web.stop(); err != nil {
			errs = append(errs, fmt.Errorf("web view: %w", err))
		}
	}
	if s.operators != nil {
		if err := s.operators.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("operators: %w", err))
		}
		_ = os.RemoveAll(filepath.Join(s.opts.StateDir, "operators"))
	}
	if s.scheduler != nil {
		if err := s.scheduler.stop(); err != nil {
			errs = append(errs, fmt.Errorf("scheduler: %w", err))
		}
	}
	for _, n := range s.nodes {
		if err := n.stop(); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.name, err))
		}
	}
	if err := s.realNode.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("real node: %w", err))
	}
	s.cp.Stop()
	_ = os.RemoveAll(filepath.Join(s.opts.StateDir, "controlplane"))
	_ = os.RemoveAll(filepath.Join(s.opts.StateDir, "nodes"))
	_ = os.Remove(filepath.Join(s.opts.StateDir, "kubeconfig"))
	s.say("sandbox stopped; nothing left running.")
	return errors.Join(errs...)
}

func (s *Sandbox) say(format string, args ...any) {
	if format == "" {
		fmt.Fprintln(s.out)
		return
	}
	fmt.Fprintf(s.out, format+"\n", args...)
}

// Down stops a sandbox started by Up in another process and waits until it is
// gone.
func Down(ctx context.Context, stateDir string, out io.Writer) error {
	pid, alive := runningPID(stateDir)
	if !alive {
		fmt.Fprintf(out, "no sandbox is running (state dir %s)\n", stateDir)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal sandbox (pid %d): %w", pid, err)
	}
	for {
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			fmt.Fprintf(out, "sandbox (pid %d) stopped\n", pid)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox (pid %d) still running: %w", pid, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func runningPID(stateDir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(stateDir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	err = syscall.Kill(pid, 0)
	return pid, err == nil || errors.Is(err, syscall.EPERM)
}
