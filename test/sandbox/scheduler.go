package sandbox

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

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
	ctx, cancel := context.WithCancel(ctx)
	rs := &runningScheduler{cancel: cancel, done: make(chan error, 1)}
	res, err := resolver.NewForConfig(ctx, cat, cfg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("catalog resolver: %w", err)
	}
	rs.res = res
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("metadata client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	res.Start(ctx)
	if !res.WaitForCacheSync(ctx) {
		cancel()
		res.Shutdown()
		return nil, fmt.Errorf("catalog resolver caches did not sync: %w", ctx.Err())
	}
	rs.sched, err = scheduler.New(cfg, scheduler.Options{
		Resolver: &mapper.CatalogResolver{Resolver: res, Metadata: meta, Mapper: restMapper},
	})
	if err != nil {
		cancel()
		res.Shutdown()
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	go func() { rs.done <- rs.sched.Run(ctx) }()
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
