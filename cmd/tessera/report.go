package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
)

func newReportCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Reports for evaluating tessera before switching to it",
	}
	cmd.AddCommand(newReportShadowCommand())
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
