// Command tessera-node: discovers the GPUs of one node and publishes them through DRA.
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
	// workqueue_*, leader_election_*), registered as the kubelet registers them.
	_ "k8s.io/component-base/metrics/prometheus/clientgo"

	"github.com/tessera-gpu/tessera/cmd/internal/version"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
)

func main() {
	// The kubelet DRA plugin and the device plugin are added by run, from
	// their flags; tests add more components here.
	var components []agent.Component
	if err := newRootCommand(components).Execute(); err != nil {
		logs.FlushLogs()
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	logs.FlushLogs()
}

func newRootCommand(components []agent.Component) *cobra.Command {
	o := newOptions()
	cmd := &cobra.Command{
		Use:   "tessera-node",
		Short: "tessera-node discovers the GPUs of one node and publishes them through DRA",
		Long: `tessera-node discovers the GPUs of one node through NVML, carves them into whole
GPUs, MIG devices and shared fractions as its partition config says, and
publishes them as DRA ResourceSlices of the driver gpu.tessera.dev. It also
serves the kubelet DRA plugin that prepares allocated devices (MIG instances
created on demand, MPS limits or time-slicing for fractions, CDI specs, a
crash-safe checkpoint), and the classic device plugin for GPUs the partition
config puts in devicePlugin mode.`,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return o.applyLogging()
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return run(ctx, o, components)
		},
	}
	o.addFlags(cmd.Flags())
	cmd.AddCommand(newDiscoverCommand(), newMPSDaemonCommand())
	return cmd
}
