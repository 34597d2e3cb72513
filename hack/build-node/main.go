// Command build-node builds the binaries of a real node (all of them, or
// those named) with sandbox/nodebin — the code `tessera sandbox up
// --real-node` uses — and prints the directory that holds them.
// hack/build-node.sh runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tessera-gpu/tessera/sandbox/nodebin"
)

func main() {
	bins := nodebin.All
	if len(os.Args) > 1 {
		bins = nil
		for _, name := range os.Args[1:] {
			b, ok := lookup(name)
			if !ok {
				var known []string
				for _, b := range nodebin.All {
					known = append(known, b.Name)
				}
				fmt.Fprintf(os.Stderr, "unknown binary %q; known: %s\n", name, strings.Join(known, ", "))
				os.Exit(2)
			}
			bins = append(bins, b)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := nodebin.Ensure(ctx, nodebin.Options{Out: os.Stderr}, bins...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}

func lookup(name string) (nodebin.Binary, bool) {
	for _, b := range nodebin.All {
		if b.Name == name {
			return b, true
		}
	}
	return nodebin.Binary{}, false
}
