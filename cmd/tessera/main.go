// Command tessera: inspects AI workloads through the catalog and shows queues, gangs and GPUs.
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
		Use:           "tessera",
		Short:         "tessera inspects AI workloads through the catalog and shows queues, gangs and GPUs",
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.AddCommand(newSandboxCommand(), newTopCommand(), newGetCommand())
	cmd.AddCommand(newMapCommand(), newCatalogCommand(), newReportCommand())
	return cmd
}
