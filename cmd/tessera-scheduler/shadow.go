package main

import (
	"context"
	"errors"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/shadow"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// runShadow runs shadow mode: tessera decides on the cluster as the scheduler in use places
// it, and writes only its ShadowReports. The catalog follows the cluster's
// WorkloadDefinitions without writing their Accepted conditions, and there is no leader
// election (a Lease is a write): the chart runs one replica in shadow mode.
func runShadow(ctx context.Context, o *options, cfg *rest.Config) error {
	logger := klog.FromContext(ctx)
	opts := shadowOptions(o)
	if o.catalog {
		res, err := newCatalogResolver(ctx, cfg, o.clusterDefinitions, false)
		if err != nil {
			return err
		}
		defer res.Resolver.Shutdown()
		opts.Resolver = res
	}
	s, err := shadow.New(cfg, opts)
	if err != nil {
		return err
	}
	shadow.RegisterMetrics()
	stopServing, err := serveEndpoints(ctx, o)
	if err != nil {
		return err
	}
	defer stopServing()
	if o.leaderElect {
		logger.Info("Shadow mode writes no Lease: --leader-elect is ignored; run one replica")
	}
	logger.Info("Starting in shadow mode", "schedulerNames", o.shadowSchedulers, "reportNamespace", o.shadowNamespace)
	if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// shadowOptions are the shadow's options from the flags: the same solver and
// policy settings as the acting scheduler's (run.go), so that the shadow
// decides as tessera would if it were acting.
func shadowOptions(o *options) shadow.Options {
	opts := shadow.Options{
		SchedulerNames:    o.shadowSchedulers,
		Namespace:         o.shadowNamespace,
		Solver:            solver.Config{TopologyKeys: o.topologyKeys, Spread: o.spread, MaxTries: o.maxTries, JointSteps: o.jointSteps, MaxSteps: o.maxSteps},
		GPUDrivers:        o.gpuDrivers,
		Period:            o.period,
		StarvationTimeout: o.starvation,
		FormationTimeout:  o.formation,
		DeadlockAfter:     o.shadowDeadlock,
		ReportTTL:         o.shadowReportTTL,
		AllGangs:          o.shadowAllGangs,
		UsageWeight:       o.usageWeight,
		UsageHalfLife:     o.usageHalfLife,
	}
	// As for the acting scheduler (run.go): the flag's 0 disables consolidation.
	if opts.MaxConsolidationMoves = o.consolidationMax; o.consolidationMax == 0 {
		opts.MaxConsolidationMoves = -1
	}
	return opts
}
