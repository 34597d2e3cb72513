// Command tessera-scheduler: places whole gangs of pods under hierarchical queue quotas.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/component-base/logs"
	// client-go's metrics on /metrics (rest_client_requests_total, rest_client_rate_limiter_duration_seconds,
	// workqueue_*, leader_election_*), registered as the kube-scheduler registers them.
	_ "k8s.io/component-base/metrics/prometheus/clientgo"

	"github.com/tessera-gpu/tessera/cmd/internal/version"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		logs.FlushLogs()
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	logs.FlushLogs()
}

func newRootCommand() *cobra.Command {
	o := newOptions()
	cmd := &cobra.Command{
		Use:   "tessera-scheduler",
		Short: "tessera-scheduler places whole gangs of pods under hierarchical queue quotas",
		Long: `tessera-scheduler places pods with spec.schedulerName: tessera-scheduler. It maps
them to gangs through the workload catalog (PodGroups), orders gangs by their
queues' quota and over-quota weight, finds a placement for a whole gang at once
(allocating its ResourceClaims with the structured DRA allocator, backtracking
across pods), and binds it, or binds nothing and says why in the PodGroup.`,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return o.applyLogging()
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return run(ctx, o)
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}
