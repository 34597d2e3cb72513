package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/controlplane/baseline"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
)

func newReportCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Reports for evaluating tessera before switching to it",
	}
	cmd.AddCommand(newReportShadowCommand(), newReportBaselineCommand(), newReportDiffCommand())
	return cmd
}

func newReportBaselineCommand() *cobra.Command {
	var (
		f        catalogFlags
		window   time.Duration
		interval time.Duration
		output   string
		save     string
		dcgmURLs []string
	)
	cmd := &cobra.Command{
		Use:   "baseline",
		Short: "Record the cluster's baseline: GPUs, their use per node and queue, waits, catalog coverage, mapping errors",
		Long: `baseline reads the live cluster (only reads) and reports what the evaluation
checklist asks to record before switching schedulers: GPU nodes and GPU types
with their memory; allocatable against allocated GPU units per node and per
queue; MIG and shared GPUs and how many are in use; pending pods now and the
waits (p50/p99/max) of every pod seen pending while it samples for --window;
the installed CRDs' served versions with and without a catalog definition; and
the objects the catalog could not map (tessera's PodGroups, shadow reports).
With --dcgm-url it also scrapes dcgm-exporter at every sample and reports the
measured GPU utilisation (DCGM_FI_DEV_GPU_UTIL, matched to nodes by GPU UUID);
without it, "utilisation" is allocation (GPU units allocated over GPUs).
An interrupt (Ctrl-C, SIGTERM) ends the window early: the report covers the
samples taken until then. --save writes the report as JSON for ` + "`tessera report diff`" + `.`,
		Example: "  tessera report baseline --window 10m --save before.json\n  tessera report baseline --window 10m --dcgm-url http://10.0.0.7:9400/metrics,http://10.0.0.8:9400/metrics\n  tessera report diff before.json after.json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			if window < 0 || interval <= 0 {
				return fmt.Errorf("--window must not be negative and --interval must be positive")
			}
			cfg, err := f.restConfig()
			if err != nil {
				return err
			}
			dc, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("dynamic client: %w", err)
			}
			cat, err := f.clusterCatalog(cmd.Context(), dc)
			if err != nil {
				return err
			}
			// The first interrupt ends the window early (the report covers what was
			// sampled); a second one stops the command.
			stop := make(chan struct{})
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			ctx, cancel := context.WithCancel(cmd.Context())
			defer func() {
				signal.Stop(sigs)
				cancel()
			}()
			go func() {
				select {
				case <-sigs:
					close(stop)
				case <-ctx.Done():
					return
				}
				select {
				case <-sigs:
					cancel()
				case <-ctx.Done():
				}
			}()
			r, err := baseline.Collect(ctx, cfg, baseline.Options{Window: window, Interval: interval, Stop: stop, DCGMURLs: dcgmURLs, Definition: func(gvk schema.GroupVersionKind) string {
				if d, ok := cat.Definition(gvk); ok {
					return d.Name
				}
				return ""
			}})
			if err != nil {
				return err
			}
			if save != "" {
				var buf bytes.Buffer
				if err := baseline.WriteJSON(&buf, r); err != nil {
					return err
				}
				if err := os.WriteFile(save, buf.Bytes(), 0o644); err != nil {
					return fmt.Errorf("--save: %w", err)
				}
			}
			if output == "json" {
				return baseline.WriteJSON(cmd.OutOrStdout(), r)
			}
			return baseline.WriteTable(cmd.OutOrStdout(), r)
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&window, "window", 0, "sample pending pods over this long (0: one sample)")
	cmd.Flags().DurationVar(&interval, "interval", 10*time.Second, "time between samples within --window")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	cmd.Flags().StringVar(&save, "save", "", "also write the report as JSON to this file")
	cmd.Flags().StringSliceVar(&dcgmURLs, "dcgm-url", nil, "dcgm-exporter /metrics URL (repeat, or comma-separate, one per GPU node): measure GPU utilisation from DCGM_FI_DEV_GPU_UTIL at every sample; without it utilisation is allocation only")
	return cmd
}

func newReportDiffCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "diff BEFORE.json AFTER.json",
		Short:   "Show, field by field, what changed between two saved baselines",
		Example: "  tessera report diff before.json after.json",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			var reports [2]baseline.Report
			for i, path := range args {
				file, err := os.Open(path)
				if err != nil {
					return err
				}
				reports[i], err = baseline.ReadJSON(file)
				file.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
			}
			changes := baseline.Diff(reports[0], reports[1])
			if output == "json" {
				if changes == nil {
					changes = []baseline.Change{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(changes)
			}
			return baseline.WriteDiff(cmd.OutOrStdout(), changes)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func newReportShadowCommand() *cobra.Command {
	var (
		kube      kubeFlags
		namespace string
		output    string
	)
	cmd := &cobra.Command{
		Use:   "shadow",
		Short: "Compare what tessera would have decided with what the scheduler in use did",
		Long: `shadow reads the ShadowReports that tessera-scheduler --shadow writes (one per
gang, see docs/shadow.md) and prints, per gang, how many pods the scheduler in
use bound and how long from the gang being ready to fully bound, how long it sat
partly placed, and what tessera would have decided (Placed, or Waiting with the
reason) after how many cycles; then the totals: gangs placed by both, by only
one, by neither, wait distributions (p50/p99), partial placement, deadlocks,
quota violations the other scheduler allowed, GPU fragmentation and mapping
errors (pods the catalog could not map). It only reads.`,
		Example: "  tessera report shadow\n  tessera report shadow -n tessera-system -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			cfg, err := kube.config()
			if err != nil {
				return err
			}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("dynamic client: %w", err)
			}
			reports, err := shadowreport.Load(cmd.Context(), dyn, namespace)
			if err != nil {
				return err
			}
			s := shadowreport.Summarize(reports, time.Now())
			if output == "json" {
				return shadowreport.WriteJSON(cmd.OutOrStdout(), s)
			}
			return shadowreport.WriteTable(cmd.OutOrStdout(), s)
		},
	}
	kube.register(cmd)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the reports (tessera's release namespace); default all namespaces")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}
