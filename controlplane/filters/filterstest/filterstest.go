// Package filterstest builds filters.Filters for tests and benchmarks, on an in-memory
// clientset holding the given storage objects and namespaces (no API server).
package filterstest

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tessera-gpu/tessera/controlplane/filters"
)

// New returns filters with the volume plugins on, reading objs (PVCs, PVs, StorageClasses,
// namespaces, ...) from a fake clientset whose informers run until the test ends.
func New(tb testing.TB, objs ...runtime.Object) *filters.Filters {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset(objs...)
	inf := informers.NewSharedInformerFactory(client, 0)
	f, err := filters.New(ctx, filters.Config{Informers: inf, Client: client, Volumes: true})
	if err != nil {
		cancel()
		tb.Fatalf("filters: %v", err)
	}
	inf.Start(ctx.Done())
	inf.WaitForCacheSync(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		inf.Shutdown()
	})
	return f
}
