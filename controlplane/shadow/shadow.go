// Package shadow is tessera-scheduler's shadow mode: decide, do not act. It watches the pods of
// other schedulers (the kube-scheduler, KAI, Volcano: any configured spec.schedulerName) and
// its own, maps them to gangs through the catalog as the scheduler does, and runs tessera's
// pure decision function (controlplane/decide) every cycle on the cluster as it is, with the
// gangs not yet decided put back to pending (their pods unbound, their claims unallocated in
// memory). For each gang it records, in a ShadowReport, what tessera would have decided — place
// on which nodes and devices, after how many cycles, or wait and why — against what actually
// happened: when each pod was bound and where, whether the gang was ever partly placed and for
// how long, whether it deadlocked, whether the binding took its queue beyond its limit.
//
// It writes nothing but its reports: no claims, bindings, evictions, pod conditions, PodGroups
// or Events, and no dry-run probes (the DRA features it decides with are read from the
// objects that use them, see features.go).
package shadow

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/informerset"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// Options configure the shadow.
type Options struct {
	// SchedulerNames are the spec.schedulerName values of the pods it watches. Default
	// default-scheduler and tessera-scheduler.
	SchedulerNames []string
	// Namespace is where the reports are written. Required.
	Namespace string
	// Resolver maps pods to workloads (the catalog); nil: every pod without a PodGroup
	// annotation is a gang of one.
	Resolver mapper.Resolver
	// Solver tunes the gang search, as for the scheduler (its Filters are created by New).
	Solver solver.Config
	// GPUDrivers are the DRA drivers counted in GPU units. Default gpu.tessera.dev.
	GPUDrivers []string
	// Period between cycles when nothing triggers one. Default 1s (the scheduler's).
	Period time.Duration
	// StarvationTimeout and FormationTimeout as for the scheduler (decide.Config).
	StarvationTimeout, FormationTimeout time.Duration
	// UsageWeight, UsageHalfLife and MaxConsolidationMoves as for the scheduler
	// (decide.Config), so that the shadow decides with the policy the acting
	// tessera would run with (fair shares lowered by the queues' usage history,
	// consolidation bounded the same way).
	UsageWeight           float64
	UsageHalfLife         time.Duration
	MaxConsolidationMoves int
	// DeadlockAfter: a partly placed gang whose waiting pods are unschedulable and none of
	// whose pods was bound for this long is deadlocked. Default 5 minutes.
	DeadlockAfter time.Duration
	// ReportTTL: reports of ended gangs are deleted this long after they ended. Default 24h;
	// negative keeps them.
	ReportTTL time.Duration
	// AllGangs records every gang; by default only gangs of AI workloads: more than one pod
	// (minMember > 1), or pods with ResourceClaims or extended resources.
	AllGangs bool
	// Clock, when set, replaces the real clock.
	Clock clock.WithTicker
}

// Shadow is tessera's shadow scheduler.
type Shadow struct {
	opts   Options
	clock  clock.WithTicker
	kube   kubernetes.Interface
	mapper *mapper.Mapper

	factory  informers.SharedInformerFactory
	podInf   cache.SharedIndexInformer
	queueInf cache.SharedIndexInformer
	pgInf    cache.SharedIndexInformer
	// topoInf and pcInf: Topologies and PriorityClasses, which the decision reads as the
	// acting scheduler's does (gang topology levels; non-preemptible classes).
	topoInf   cache.SharedIndexInformer
	pcInf     cache.SharedIndexInformer
	upstream  cache.SharedIndexInformer
	informers []cache.SharedIndexInformer
	slices    *tracker.Tracker
	watched   map[string]bool

	filters  *filters.Filters
	solver   *solver.Solver
	podInfos *filters.PodInfoCache
	features featureCache
	writer   *writer

	trigger chan struct{}

	mu          sync.Mutex
	capacityGen uint64
	// seen: when the shadow first saw a pod or claim (creation for those that existed at
	// start); bound: when it saw a pod bound.
	seen  map[types.UID]time.Time
	bound map[types.UID]time.Time

	// Owned by the cycle goroutine.
	mappings map[types.UID]mapper.Mapping
	memory   *decide.Memory
	records  map[string]*record

	reportsMu sync.Mutex
	reports   []reportSnapshot

	cycles atomic.Uint64
	// synced: the informers delivered their initial lists; objects added before are dated by
	// their creation, not by when the shadow started.
	synced atomic.Bool
}

// New creates a shadow for the cluster cfg points at. It reads discovery (gang API,
// DeviceTaintRules) and nothing else at start.
func New(cfg *rest.Config, opts Options) (*Shadow, error) {
	if opts.Namespace == "" {
		return nil, errors.New("shadow: Namespace for the reports is required")
	}
	if len(opts.SchedulerNames) == 0 {
		opts.SchedulerNames = []string{v1.DefaultSchedulerName, v1alpha1.SchedulerName}
	}
	if opts.Period <= 0 {
		opts.Period = time.Second
	}
	if opts.DeadlockAfter <= 0 {
		opts.DeadlockAfter = 5 * time.Minute
	}
	if opts.ReportTTL == 0 {
		opts.ReportTTL = 24 * time.Hour
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	sc, err := client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	served, err := informerset.Discover(kube)
	if err != nil {
		return nil, err
	}
	s := &Shadow{
		opts: opts, clock: opts.Clock, kube: kube,
		trigger:  make(chan struct{}, 1),
		seen:     map[types.UID]time.Time{},
		bound:    map[types.UID]time.Time{},
		mappings: map[types.UID]mapper.Mapping{},
		memory:   decide.NewMemory(),
		records:  map[string]*record{},
		podInfos: filters.NewPodInfoCache(),
		watched:  map[string]bool{},
		writer:   newWriter(dyn, opts.Namespace),
	}
	for _, n := range opts.SchedulerNames {
		s.watched[n] = true
	}
	// The filter plugins' volume binder gets a client because its constructor wants one; the
	// shadow never calls Bind (nothing is committed). The slice tracker gets none: it would
	// record Events about broken DeviceTaintRules.
	set, err := informerset.New(informerset.Options{Kube: kube, Sched: sc, Served: served})
	if err != nil {
		return nil, err
	}
	s.factory, s.filters, s.slices, s.informers = set.Factory, set.Filters, set.Slices, set.All
	s.podInf, s.queueInf, s.pgInf, s.topoInf, s.pcInf, s.upstream = set.Pods, set.Queues, set.PodGroups, set.Topologies, set.PriorityClasses, set.Upstream
	solverCfg := opts.Solver
	solverCfg.Filters = s.filters
	s.solver = solver.New(solverCfg)
	s.mapper = &mapper.Mapper{Resolver: opts.Resolver, NamespaceLabels: set.NamespaceLabels}
	if served.PodGroups {
		s.mapper.UpstreamPodGroup = set.UpstreamPodGroup
	}
	for _, inf := range s.informers {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.observeAdd(obj) },
			UpdateFunc: func(old, cur any) { s.observeUpdate(old, cur) },
			DeleteFunc: func(any) { s.kick(true) },
		}); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	return s, nil
}

// observeAdd notes when pods and claims appeared, and triggers a cycle. New nodes, slices,
// classes and queues may bring capacity back; new pods and claims do not.
func (s *Shadow) observeAdd(obj any) {
	now := s.clock.Now()
	capacity := true
	note := func(uid types.UID) {
		if !s.synced.Load() {
			return
		}
		s.mu.Lock()
		if _, ok := s.seen[uid]; !ok {
			s.seen[uid] = now
		}
		s.mu.Unlock()
	}
	switch o := obj.(type) {
	case *v1.Pod:
		capacity = false
		note(o.UID)
	case *resourceapi.ResourceClaim:
		capacity = false
		note(o.UID)
	case *v1.Namespace, *v1alpha1.PodGroup:
		capacity = false
	}
	s.kick(capacity)
}

// observeUpdate notes when pods were bound. Capacity may have come back when a pod finished,
// a claim was deallocated, or a node, slice, class or queue changed (the scheduler's rule;
// bindings by the scheduler in use only take capacity).
func (s *Shadow) observeUpdate(old, cur any) {
	capacity := true
	switch o := old.(type) {
	case *v1.Pod:
		c := cur.(*v1.Pod)
		if o.Spec.NodeName == "" && c.Spec.NodeName != "" && s.synced.Load() {
			s.mu.Lock()
			s.bound[c.UID] = s.clock.Now()
			s.mu.Unlock()
		}
		capacity = c.Status.Phase != o.Status.Phase && (c.Status.Phase == v1.PodSucceeded || c.Status.Phase == v1.PodFailed)
	case *resourceapi.ResourceClaim:
		capacity = o.Status.Allocation != nil && cur.(*resourceapi.ResourceClaim).Status.Allocation == nil
	case *v1.Namespace, *v1alpha1.PodGroup:
		capacity = false
	}
	s.kick(capacity)
}

func (s *Shadow) kick(capacity bool) {
	if capacity {
		s.mu.Lock()
		s.capacityGen++
		s.mu.Unlock()
	}
	select {
	case s.trigger <- struct{}{}:
	default:
	}
}

// Cycles is the number of cycles run so far.
func (s *Shadow) Cycles() uint64 { return s.cycles.Load() }

// Run starts the informers, loads the reports an earlier run left, and runs cycles until ctx
// ends. It returns after every goroutine it started has stopped.
func (s *Shadow) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer s.slices.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	infCtx, stop := context.WithCancel(ctx)
	defer stop()
	s.factory.Start(infCtx.Done())
	defer s.factory.Shutdown()
	for _, inf := range []cache.SharedIndexInformer{s.queueInf, s.pgInf, s.topoInf} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(infCtx)
		}()
	}
	synced := []cache.InformerSynced{s.slices.HasSynced}
	for _, inf := range s.informers {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informers did not sync: %w", ctx.Err())
	}
	for typ, ok := range s.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	s.synced.Store(true)
	existing, err := s.writer.load(ctx)
	if err != nil {
		return err
	}
	for _, r := range existing {
		rec := recordFromReport(r)
		s.records[rec.key()] = rec
	}
	logger.Info("Shadow mode: deciding, not acting", "schedulerNames", s.opts.SchedulerNames, "reports", s.opts.Namespace, "loadedReports", len(existing))
	ticker := s.clock.NewTicker(s.opts.Period)
	defer ticker.Stop()
	for {
		last := s.clock.Now()
		s.cycle(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.trigger:
			wait := max(10*time.Millisecond, 50*time.Millisecond-s.clock.Since(last))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.clock.After(wait):
			case <-ticker.C():
			}
		case <-ticker.C():
		}
	}
}
