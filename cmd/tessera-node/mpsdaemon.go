package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
)

// newMPSDaemonCommand is what a claim's MPS control daemon pod runs
// (sharing.PodLauncher): it starts the claim's daemon with its limits,
// exits with an error when the daemon stops answering (the kubelet then
// restarts the container, and with it a daemon with the same limits), and
// quits the daemon on SIGTERM (the pod is deleted at unprepare).
func newMPSDaemonCommand() *cobra.Command {
	var flags sharing.DaemonFlags
	var poll time.Duration
	cmd := &cobra.Command{
		Use:    "mps-daemon",
		Short:  "Run one claim's MPS control daemon (what tessera-node's MPS daemon pods run)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flags.Validate(); err != nil {
				return fmt.Errorf("mps-daemon: %w", err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background().WithValues("claim", flags.Spec.Claim))
			ex := executor.OS{Chroot: flags.Chroot}
			return sharing.RunDaemon(ctx, ex, flags.Spec, sharing.DirsOf(flags.MPSDir, flags.Spec.ID), poll)
		},
	}
	flags.AddFlags(cmd.Flags())
	cmd.Flags().DurationVar(&poll, "poll-interval", 5*time.Second, "How often the daemon is asked whether it still runs.")
	return cmd
}
