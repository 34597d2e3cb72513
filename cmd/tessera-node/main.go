// Command tessera-node: discovers the GPUs of one node and publishes them through DRA.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tessera-gpu/tessera/cmd/internal/version"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "tessera-node",
		Short:         "tessera-node discovers the GPUs of one node and publishes them through DRA",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	return cmd
}
