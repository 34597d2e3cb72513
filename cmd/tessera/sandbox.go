package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/sandbox"
)

func newSandboxCommand() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run a local tessera cluster: a real API server with simulated GPU nodes",
	}
	cmd.PersistentFlags().StringVar(&stateDir, "state-dir", sandbox.DefaultStateDir(), "where the sandbox keeps its kubeconfig and state")

	var opts sandbox.Options
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the sandbox (and a scenario) and keep it running until Ctrl-C",
		Long: `up starts etcd, kube-apiserver and kube-controller-manager (built from the Go
module proxy by hack/build-k8s.sh), simulated DGX nodes — each a simulated kubelet
with tessera-node's agent and kubelet DRA plugin on mock NVML — and
tessera-scheduler, with the CRDs, DeviceClasses and example queues. With
--scenario demo it runs the demo scenario and stops at its end (unless --keep).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
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

	down := &cobra.Command{
		Use:   "down",
		Short: "Stop a sandbox started by `tessera sandbox up` in another terminal",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			return sandbox.Down(ctx, stateDir, cmd.OutOrStdout())
		},
	}
	cmd.AddCommand(up, down)
	return cmd
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
