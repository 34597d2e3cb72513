package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/resolver"
	"github.com/tessera-gpu/tessera/cmd/internal/gomemlimit"
	"github.com/tessera-gpu/tessera/cmd/internal/kubeconfig"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/scheduler"
	"github.com/tessera-gpu/tessera/controlplane/solver"
	"github.com/tessera-gpu/tessera/internal/metricsconv"
)

func run(ctx context.Context, o *options) error {
	if err := o.validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	gomemlimit.Apply(logger, o.memoryLimitRatio)
	cfg, err := kubeconfig.Load(kubeconfig.Options{Path: o.kubeconfig, UserAgent: "tessera-scheduler"})
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = o.kubeAPIQPS, o.kubeAPIBurst
	if o.shadow {
		return runShadow(ctx, o, cfg)
	}

	opts := o.schedulerOptions()
	if o.catalog {
		res, err := newCatalogResolver(ctx, cfg, o.clusterDefinitions, true)
		if err != nil {
			return err
		}
		opts.Resolver = res
	}
	if o.leaderElect {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("leader election identity: %w", err)
		}
		opts.LeaderElection = &scheduler.LeaderElection{
			Namespace: o.leaseNamespace, Name: o.leaseName, Identity: fmt.Sprintf("%s_%d", host, os.Getpid()),
			LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod,
			ReleaseOnCancel: true,
		}
	}
	s, err := scheduler.New(cfg, opts)
	if err != nil {
		return err
	}
	scheduler.RegisterMetrics()
	stopServing, err := serveEndpoints(ctx, o)
	if err != nil {
		return err
	}
	defer stopServing()
	logger.Info("Starting", "schedulerName", o.schedulerName, "leaderElection", o.leaderElect)
	if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// newCatalogResolver starts the catalog's pod resolver with the built-in
// definitions and, with clusterDefs, the cluster's WorkloadDefinitions (with
// writeStatus each gets an Accepted condition; a broken one leaves the built-in
// in force). A cluster without the WorkloadDefinition CRD runs on the built-ins
// alone.
func newCatalogResolver(ctx context.Context, cfg *rest.Config, clusterDefs, writeStatus bool) (*mapper.CatalogResolver, error) {
	cat, err := catalog.New(nil)
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	if !clusterDefs {
		return mapper.NewCatalogResolver(ctx, cat, cfg)
	}
	res, err := mapper.NewCatalogResolver(ctx, cat, cfg, resolver.WithClusterDefinitions(nil, writeStatus))
	if errors.Is(err, resolver.ErrNoDefinitionCRD) {
		klog.FromContext(ctx).Info("The WorkloadDefinition CRD is not installed: the catalog has the built-in definitions only", "err", err)
		return mapper.NewCatalogResolver(ctx, cat, cfg)
	}
	return res, err
}

// serveEndpoints serves /metrics and the health paths over HTTPS with
// delegated authentication and authorization, and over plain HTTP only with
// --metrics-bind-address (internal/secureserve). The health paths answer ok
// while the process runs: a standby replica is healthy and ready too.
func serveEndpoints(ctx context.Context, o *options) (stop func(), err error) {
	o.serving.DefaultKubeconfig(o.kubeconfig)
	srv, err := o.serving.Serve(ctx, endpointsHandler(o))
	if err != nil {
		return nil, err
	}
	return srv.Stop, nil
}

// endpointsHandler routes /metrics, the health paths and, with --profiling, /debug/pprof.
func endpointsHandler(o *options) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsconv.Handler())
	for _, path := range []string{"/healthz", "/readyz", "/livez"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	}
	if o.profiling {
		// The routes of k8s.io/apiserver's routes.Profiling, which needs that package's
		// PathRecorderMux; net/http/pprof's handlers are what it installs.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// schedulerOptions maps the flags to the scheduler's Options (where a flag's 0 means "off"
// and the Options' 0 means "the default", the flag's 0 becomes -1).
func (o *options) schedulerOptions() scheduler.Options {
	opts := scheduler.Options{
		UnfitRetry:           o.unfitRetry,
		SchedulerName:        o.schedulerName,
		Solver:               solver.Config{TopologyKeys: o.topologyKeys, Spread: o.spread, MaxTries: o.maxTries, JointSteps: o.jointSteps, MaxSteps: o.maxSteps},
		ProbeNamespace:       o.probeNamespace,
		GPUDrivers:           o.gpuDrivers,
		Period:               o.period,
		MinCycleInterval:     o.minCycleInterval,
		Parallelism:          o.parallelism,
		StarvationTimeout:    o.starvation,
		FormationTimeout:     o.formation,
		UsageHalfLife:        o.usageHalfLife,
		UsageWeight:          o.usageWeight,
		ConsolidationMaxPods: o.consolidationMax,
		VolumeBindTimeout:    o.volumeBind,
	}
	if o.consolidationMax == 0 {
		opts.ConsolidationMaxPods = -1 // the flag's 0 disables it; the Options' 0 is the default
	}
	if o.unfitRetry == 0 {
		opts.UnfitRetry = -1
	}
	return opts
}
