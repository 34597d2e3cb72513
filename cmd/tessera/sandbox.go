package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tessera-gpu/tessera/test/sandbox"
)

func newSandboxCommand() *cobra.Command {
	var stateDir string
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "Run a local tessera cluster: a real API server with simulated GPU nodes",
	}
	cmd.PersistentFlags().StringVar(&stateDir, "state-dir", sandbox.DefaultStateDir(), "where the sandbox keeps its kubeconfig and state")
	up := &cobra.Command{
		Use:   "up",
		Short: "Start the sandbox and keep it running until Ctrl-C",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return sandbox.Up(ctx, sandbox.Options{StateDir: stateDir, Out: cmd.OutOrStdout()})
		},
	}
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
