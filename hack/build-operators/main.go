// Command build-operators builds the workload operators (all of them, or
// those named) with sandbox/opbin — the code `tessera sandbox up
// --operators` uses — and prints "<name> <directory>" for each.
// hack/build-operators.sh runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tessera-gpu/tessera/sandbox/opbin"
)

func main() {
	names := opbin.Names()
	if len(os.Args) > 1 {
		names = os.Args[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dirs, err := opbin.Ensure(ctx, opbin.Options{Out: os.Stderr}, names...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	for _, n := range names {
		fmt.Println(n, dirs[n])
	}
}
