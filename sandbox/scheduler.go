package sandbox

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/resolver"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/scheduler"
)

// runningScheduler is tessera-scheduler running in-process, with the built-in
// catalog resolving pods to workloads, as the binary runs it.
type runningScheduler struct {
	sched  *scheduler.Scheduler
	res    *resolver.Resolver
	cancel context.CancelFunc
	done   chan error
}

func startScheduler(ctx context.Context, cfg *rest.Config) (*runningScheduler, error) {
	cat, err := catalog.New(nil)
	if err != nil {
		return nil, fmt.Errorf("built-in catalog: %w", err)
	}
	scheduler.RegisterMetrics() // as the binary does: served at the sandbox's /metrics
	ctx, cancel := context.WithCancel(ctx)
	// As tessera-scheduler runs by default: following the cluster's
	// WorkloadDefinitions (the sandbox installs their CRD first).
	res, err := mapper.NewCatalogResolver(ctx, cat, cfg, resolver.WithClusterDefinitions(nil, true))
	if err != nil {
		cancel()
		return nil, err
	}
	sched, err := scheduler.New(cfg, scheduler.Options{Resolver: res})
	if err != nil {
		cancel()
		res.Resolver.Shutdown()
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	rs := &runningScheduler{sched: sched, res: res.Resolver, cancel: cancel, done: make(chan error, 1)}
	go func() { rs.done <- sched.Run(ctx) }()
	return rs, nil
}

func (rs *runningScheduler) stop() error {
	rs.cancel()
	err := <-rs.done
	rs.res.Shutdown()
	if errors.Is(err, context.Canceled) {
		return nil // stopped as asked
	}
	return err
}
