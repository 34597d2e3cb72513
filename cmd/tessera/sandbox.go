package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/sandbox"
	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
	"github.com/tessera-gpu/tessera/sandbox/operators"
)

func newSandboxCommand() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run a local tessera cluster: a real API server with simulated GPU nodes",
	}
	cmd.PersistentFlags().StringVar(&stateDir, "state-dir", sandbox.DefaultStateDir(), "where the sandbox keeps its kubeconfig and state")

	var opts sandbox.Options
	var ops string
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the sandbox (and a scenario) and keep it running until Ctrl-C",
		Long: `up starts etcd, kube-apiserver and kube-controller-manager of Kubernetes
` + k8sbin.KubernetesVersion() + `, simulated DGX nodes — each a simulated kubelet with tessera-node's
agent and kubelet DRA plugin on mock NVML — and tessera-scheduler, with the
CRDs, DeviceClasses and example queues. With --scenario demo it runs the demo
scenario and stops at its end (unless --keep).

The Kubernetes binaries (and kubectl) are built once from the Go module proxy
into ~/.cache/tessera (this needs the Go toolchain; a few minutes, one line
per binary with its build time) and reused afterwards. --operators starts real
workload operators against the sandbox's API server, built the same way at
their pinned versions; --real-node adds one real node — the kubelet,
containerd and NVIDIA's nvidia-cdi-hook, built the same way, and tessera-node
from beside this program or, for an installed tessera, from the module proxy
at its version (root, runc, the CNI plugins, busybox-static and gcc needed).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Operators, err = operators.Parse(ops); err != nil {
				return fmt.Errorf("--operators: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if err := os.MkdirAll(stateDir, 0o755); err != nil {
				return fmt.Errorf("sandbox state dir: %w", err)
			}
			// The in-process components log through klog: into a file, so that
			// the terminal shows the narration.
			logPath := filepath.Join(stateDir, "sandbox.log")
			if err := logToFile(logPath); err != nil {
				return err
			}
			defer klog.Flush()
			fmt.Fprintf(cmd.OutOrStdout(), "component logs: %s\n", logPath)
			opts.StateDir = stateDir
			opts.Out = cmd.OutOrStdout()
			return sandbox.Up(ctx, opts)
		},
	}
	up.Flags().IntVar(&opts.Nodes, "nodes", 4, "number of simulated GPU nodes")
	up.Flags().StringVar(&opts.GPU, "gpu", "h100", "GPU of every node (a DGX with 8): a100, h100, h200 or b200")
	up.Flags().BoolVar(&opts.MIG, "mig", false, "offer GPUs 0-3 of the last node as dynamic MIG devices")
	up.Flags().BoolVar(&opts.Shared, "shared", false, "offer GPUs 4-7 of the last node as shared GPUs (fractions)")
	up.Flags().StringVar(&opts.Scenario, "scenario", "", "scenario to run: demo (implies --mig and --shared)")
	up.Flags().BoolVar(&opts.Keep, "keep", false, "stay up after the scenario ends")
	up.Flags().Float64Var(&opts.Speed, "speed", 1, "divide the scenario's simulated run times by this factor")
	up.Flags().StringVar(&ops, "operators", "", "workload operators to run, comma-separated: "+strings.Join(operators.Known(), ",")+" (trainer starts jobset too; default none)")
	up.Flags().BoolVar(&opts.RealNode, "real-node", false, "add one real node (kubelet, containerd, real containers on mock GPUs; needs root, runc, the CNI plugins and busybox-static) beside the simulated ones")
	up.Flags().StringVar(&opts.WebAddress, "web", "127.0.0.1:0", "address of the web view (as tessera top --web) and of /metrics; port 0 picks a free one")

	down := &cobra.Command{
		Use:   "down",
		Short: "Stop a sandbox started by `tessera sandbox up` in another terminal",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			return sandbox.Down(ctx, stateDir, cmd.OutOrStdout())
		},
	}
	cmd.AddCommand(up, down, newSandboxKubectlCommand())
	return cmd
}

// newSandboxKubectlCommand runs the sandbox's kubectl (the release of its
// API server, built into the cache with the control plane) with the
// sandbox's kubeconfig; every argument passes through to kubectl.
func newSandboxKubectlCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "kubectl [kubectl arguments]",
		Short: "Run kubectl (" + k8sbin.KubernetesVersion() + ", as the sandbox's API server) against the running sandbox",
		Long: `kubectl runs the kubectl of the sandbox's Kubernetes release with the
kubeconfig of the running sandbox; every argument goes to kubectl unchanged
(the sandbox's state directory is $TESSERA_SANDBOX_DIR or ~/.tessera/sandbox).
kubectl is built into ~/.cache/tessera with the control plane on first use.`,
		Example:            "  tessera sandbox kubectl get nodes\n  tessera sandbox kubectl get resourceslices -o wide",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") && len(args) == 1 {
				return cmd.Help()
			}
			stateDir := sandbox.DefaultStateDir()
			kubeconfig := sandbox.KubeconfigPath(stateDir)
			if _, err := os.Stat(kubeconfig); err != nil {
				return fmt.Errorf("no sandbox is running (no kubeconfig in %s); start one with `tessera sandbox up`", stateDir)
			}
			dir, err := k8sbin.Ensure(cmd.Context(), k8sbin.Options{Out: cmd.ErrOrStderr()}, k8sbin.Kubectl)
			if err != nil {
				return err
			}
			kubectl := filepath.Join(dir, k8sbin.Kubectl.Name)
			env := append(os.Environ(), "KUBECONFIG="+kubeconfig)
			// Become kubectl: its exit status, signals and terminal are the user's.
			return syscall.Exec(kubectl, append([]string{"kubectl"}, args...), env)
		},
	}
}

// logToFile sends klog's output to path (truncated) instead of stderr.
func logToFile(path string) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{
		"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL",
		"log_file": path, "one_output": "true",
	} {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("klog flag %s: %w", name, err)
		}
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return fmt.Errorf("sandbox log: %w", err)
	}
	return nil
}
