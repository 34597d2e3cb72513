// Command build-k8s builds the pinned Kubernetes binaries (all of them, or
// those named) with sandbox/k8sbin — the code `tessera sandbox up` uses — and
// prints the directory that holds them. hack/build-k8s.sh runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
)

func main() {
	bins := k8sbin.All
	if len(os.Args) > 1 {
		bins = nil
		for _, name := range os.Args[1:] {
			b, ok := k8sbin.Lookup(name)
			if !ok {
				fmt.Fprintf(os.Stderr, "unknown binary %q; known: etcd, kube-apiserver, kube-controller-manager, kubectl, kube-scheduler\n", name)
				os.Exit(2)
			}
			bins = append(bins, b)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := k8sbin.Ensure(ctx, k8sbin.Options{Out: os.Stderr}, bins...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	fmt.Println(dir)
}
