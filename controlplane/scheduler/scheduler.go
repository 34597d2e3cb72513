// Package scheduler runs tessera's gang scheduler: informers feed a snapshot each cycle; the
// mapper finds gangs; gangs are taken in queue order and placed by the solver; the committer
// writes claim allocations and bindings; PodGroup and Queue statuses, Events and metrics say
// what happened. With leader election, only the leader schedules, and every new term starts
// by rebuilding its state from the API and rolling back half-committed gangs.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// LeaderElection configures the Lease-based election.
type LeaderElection struct {
	Namespace, Name, Identity                 string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// ReleaseOnCancel gives the Lease up when the scheduler stops, so that another replica
	// takes over at once instead of after LeaseDuration.
	ReleaseOnCancel bool
}

// Options configure a Scheduler.
type Options struct {
	// SchedulerName of the pods this scheduler places. Default tessera-scheduler.
	SchedulerName string
	// Solver tunes the gang search.
	Solver solver.Config
	// Features, when set, replaces detection of the DRA features the API server serves.
	Features *structured.Features
	// ProbeNamespace is where feature detection dry-runs a claim. Default "default".
	ProbeNamespace string
	// Resolver maps pods to workloads (the catalog). Nil: every pod without a PodGroup
	// annotation is a gang of one.
	Resolver mapper.Resolver
	// GPUDrivers are the DRA drivers counted in GPU units. Default gpu.tessera.dev.
	GPUDrivers []string
	// Period between cycles when nothing triggers one. Default 1s.
	Period time.Duration
	// Parallelism of API writes within a commit, and gangs committed at once. Default 16.
	Parallelism int
	// Hooks for fault-injection tests.
	Hooks Hooks
	// LeaderElection, when set, makes the scheduler schedule only while it holds the Lease.
	LeaderElection *LeaderElection
	// StarvationTimeout: a borrowing gang that has not fit for this long (and would fit the
	// empty cluster) holds back other borrowing gangs until it is placed, so that small
	// gangs cannot keep a large one out forever. Zero means 5 minutes; negative disables.
	StarvationTimeout time.Duration
}

// Scheduler is tessera's gang scheduler.
type Scheduler struct {
	opts   Options
	kube   kubernetes.Interface
	sched  *client.Client
	mapper *mapper.Mapper

	factory   informers.SharedInformerFactory
	podInf    cache.SharedIndexInformer
	queueInf  cache.SharedIndexInformer
	pgInf     cache.SharedIndexInformer
	informers []cache.SharedIndexInformer

	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	solver    *solver.Solver
	committer *committer
	assumed   *assumeCache
	celCache  *cel.Cache
	features  structured.Features

	trigger chan struct{}

	mu          sync.Mutex
	mappings    map[types.UID]mapper.Mapping
	failures    map[string]*failure // gang key → last failure (backoff, event dedup)
	capacityGen uint64              // bumped when capacity may have come back
	evicting    map[types.UID]time.Time

	inflight sync.WaitGroup
	slots    chan struct{}

	// leading is closed while... set for tests: Leading reports whether this replica leads.
	leadMu  sync.Mutex
	leading bool
}

type failure struct {
	message  string
	reason   string
	at       time.Time
	backoff  time.Duration
	capacity uint64
	// since is when the gang first failed (without being placed in between).
	since time.Time
	// fitsEmpty caches whether the gang would fit an empty cluster (nil: not checked).
	fitsEmpty *bool
}

// Scheme has the core types and the scheduling API (for Events on PodGroups).
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(v1alpha1.AddToScheme(Scheme))
}

// New creates a scheduler for the cluster cfg points at.
func New(cfg *rest.Config, opts Options) (*Scheduler, error) {
	if opts.SchedulerName == "" {
		opts.SchedulerName = v1alpha1.SchedulerName
	}
	if opts.ProbeNamespace == "" {
		opts.ProbeNamespace = "default"
	}
	if opts.Period <= 0 {
		opts.Period = time.Second
	}
	if opts.Parallelism <= 0 {
		opts.Parallelism = 16
	}
	if opts.StarvationTimeout == 0 {
		opts.StarvationTimeout = 5 * time.Minute
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	sc, err := client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		opts:      opts,
		kube:      kube,
		sched:     sc,
		committer: &committer{client: kube, hooks: opts.Hooks, parallelism: opts.Parallelism},
		assumed:   newAssumeCache(),
		trigger:   make(chan struct{}, 1),
		mappings:  map[types.UID]mapper.Mapping{},
		failures:  map[string]*failure{},
		evicting:  map[types.UID]time.Time{},
		slots:     make(chan struct{}, opts.Parallelism),
	}
	s.factory = informers.NewSharedInformerFactory(kube, 0)
	// The kube-scheduler's filter plugins register the informers they read (PVCs, PVs,
	// StorageClasses, CSI objects, namespaces) on the shared factory.
	flt, err := filters.New(context.Background(), filters.Config{Informers: s.factory, Client: kube, Volumes: true})
	if err != nil {
		return nil, fmt.Errorf("filter plugins: %w", err)
	}
	solverCfg := opts.Solver
	solverCfg.Filters = flt
	s.solver = solver.New(solverCfg)
	s.podInf = s.factory.Core().V1().Pods().Informer()
	nsInf := s.factory.Core().V1().Namespaces().Informer()
	s.mapper = &mapper.Mapper{Resolver: opts.Resolver, NamespaceLabels: func(name string) map[string]string {
		obj, ok, err := nsInf.GetStore().GetByKey(name)
		if err != nil || !ok {
			return nil
		}
		return obj.(*v1.Namespace).Labels
	}}
	s.queueInf = cache.NewSharedIndexInformer(sc.QueueListWatch(), &v1alpha1.Queue{}, 0, cache.Indexers{})
	s.pgInf = cache.NewSharedIndexInformer(sc.PodGroupListWatch(), &v1alpha1.PodGroup{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	s.informers = []cache.SharedIndexInformer{
		s.podInf, nsInf,
		s.factory.Core().V1().Nodes().Informer(),
		s.factory.Resource().V1().ResourceSlices().Informer(),
		s.factory.Resource().V1().ResourceClaims().Informer(),
		s.factory.Resource().V1().DeviceClasses().Informer(),
		s.queueInf, s.pgInf,
	}
	for _, inf := range s.informers {
		// Any change may make a gang fit and triggers a cycle. Changes that may bring
		// capacity back also end the backoff of gangs that did not fit: a pod that is deleted
		// or finished, a claim deallocated or deleted, any node, slice, class or queue change.
		// Claims being allocated and pods being bound (the scheduler's own commits) do not.
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { s.kick(addFreesCapacity(obj)) },
			UpdateFunc: func(old, cur any) {
				if relevantUpdate(old, cur) {
					s.kick(updateFreesCapacity(old, cur))
				}
			},
			DeleteFunc: func(any) { s.kick(true) },
		}); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	s.broadcaster = record.NewBroadcaster()
	s.recorder = s.broadcaster.NewRecorder(Scheme, v1.EventSource{Component: opts.SchedulerName})
	return s, nil
}

func (s *Scheduler) kick(capacity bool) {
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

// Leading reports whether this replica currently schedules.
func (s *Scheduler) Leading() bool {
	s.leadMu.Lock()
	defer s.leadMu.Unlock()
	return s.leading
}

// Run starts the informers and schedules until ctx ends (with leader election: while this
// replica leads; after losing the Lease it campaigns again). It returns after every goroutine
// it started has stopped.
func (s *Scheduler) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	s.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.kube.CoreV1().Events("")})
	defer s.broadcaster.Shutdown()

	var wg sync.WaitGroup
	defer wg.Wait()
	infCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	s.factory.Start(infCtx.Done())
	defer s.factory.Shutdown()
	for _, inf := range []cache.SharedIndexInformer{s.queueInf, s.pgInf} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(infCtx)
		}()
	}
	synced := make([]cache.InformerSynced, 0, len(s.informers))
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
	if s.opts.Features != nil {
		s.features = *s.opts.Features
	} else {
		f, err := DetectFeatures(ctx, s.kube, s.opts.ProbeNamespace)
		if err != nil {
			return err
		}
		s.features = f
	}
	s.celCache = snapshot.NewCELCache(s.features)

	if s.opts.LeaderElection == nil {
		return s.lead(ctx)
	}
	le := s.opts.LeaderElection
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaFor(le.Namespace, le.Name),
		Client:     s.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity, EventRecorder: s.recorder},
	}
	for ctx.Err() == nil {
		elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   le.LeaseDuration,
			RenewDeadline:   le.RenewDeadline,
			RetryPeriod:     le.RetryPeriod,
			ReleaseOnCancel: le.ReleaseOnCancel,
			Name:            le.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					if err := s.lead(ctx); err != nil && !errors.Is(err, context.Canceled) {
						logger.Error(err, "Scheduling stopped")
					}
				},
				OnStoppedLeading: func() { logger.Info("Lost or released leadership", "identity", le.Identity) },
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		elector.Run(ctx)
	}
	return nil
}

// lead is one leadership term: rebuild state from the API, roll back half-committed gangs,
// then run cycles until ctx ends. In-flight commits finish before it returns.
func (s *Scheduler) lead(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	s.setLeading(true)
	defer s.setLeading(false)
	defer s.inflight.Wait()
	s.assumed.reset()
	s.mu.Lock()
	s.failures = map[string]*failure{}
	s.evicting = map[types.UID]time.Time{}
	s.mu.Unlock()
	if err := s.recover(ctx); err != nil {
		return fmt.Errorf("recover state: %w", err)
	}
	logger.Info("Scheduling", "schedulerName", s.opts.SchedulerName)
	timer := time.NewTicker(s.opts.Period)
	defer timer.Stop()
	for {
		last := time.Now()
		s.cycle(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.trigger:
			// Let a burst of events settle into one cycle, and keep cycles at least
			// minCycleInterval apart so that a stream of events cannot keep the scheduler busy
			// rebuilding snapshots.
			wait := max(10*time.Millisecond, minCycleInterval-time.Since(last))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		case <-timer.C:
		}
	}
}

func (s *Scheduler) setLeading(v bool) {
	s.leadMu.Lock()
	s.leading = v
	s.leadMu.Unlock()
}
