// Package scheduler runs tessera's gang scheduler. Each cycle collects the cluster from the
// informers (nodes, pods, slices with their DeviceTaintRules applied, claims, classes, queues,
// PodGroups — tessera's and the Kubernetes gang API's), maps pods to gangs, calls the pure
// policy (controlplane/decide), and hands the decisions to the effects layer, which commits
// placements (claims, volumes, bindings) and writes statuses, pod conditions and Events
// asynchronously and deduplicated. With leader election, only the leader schedules, and
// every new term starts by rebuilding its state from the API and rolling back
// half-committed gangs.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/informerset"
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
	// Solver tunes the gang search (its Filters are created by New).
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
	// MinCycleInterval keeps the starts of cycles that events trigger at least this far apart
	// (cycleWait). Default 50ms.
	MinCycleInterval time.Duration
	// Parallelism of API writes within a commit, gangs committed at once, and status
	// writers. Default 16.
	Parallelism int
	// Hooks for fault-injection tests.
	Hooks Hooks
	// LeaderElection, when set, makes the scheduler schedule only while it holds the Lease.
	LeaderElection *LeaderElection
	// StarvationTimeout: a borrowing gang that has not fit for this long (and would fit the
	// empty cluster) holds back other borrowing gangs until it is placed, so that small
	// gangs cannot keep a large one out forever. Zero means 5 minutes; negative disables.
	StarvationTimeout time.Duration
	// FormationTimeout: a gang with fewer pods than minMember for this long says so (its
	// condition names the workload and what is missing, an Event, pod conditions). Zero
	// means 2 minutes; negative disables.
	FormationTimeout time.Duration
	// UsageHalfLife is the half-life of the queues' usage history (decide.Config); 0 keeps
	// none. UsageWeight is how much it lowers a queue's over-quota share.
	UsageHalfLife time.Duration
	UsageWeight   float64
	// ConsolidationMaxPods is the most pods one consolidation moves. Zero means 16;
	// negative disables consolidation.
	ConsolidationMaxPods int
	// VolumeBindTimeout bounds a commit's wait for the PV controller to bind a gang's
	// volumes. Zero means 10 minutes (the kube-scheduler's default).
	VolumeBindTimeout time.Duration
	// UnfitRetry: a gang that did not fit is searched again as soon as anything its search
	// reads changes, and at least this often (epoch.go). Zero means 30 seconds; negative
	// searches waiting gangs whenever decide asks (after their backoff).
	UnfitRetry time.Duration
	// Clock, when set, replaces the real clock (tests step a fake one).
	Clock clock.WithTicker
}

// Scheduler is tessera's gang scheduler.
type Scheduler struct {
	opts   Options
	clock  clock.WithTicker
	kube   kubernetes.Interface
	sched  *client.Client
	mapper *mapper.Mapper

	factory  informers.SharedInformerFactory
	podInf   cache.SharedIndexInformer
	queueInf cache.SharedIndexInformer
	pgInf    cache.SharedIndexInformer
	// topoInf: Topologies (ordered node-label levels); pcInf: PriorityClasses (their
	// preemptible label).
	topoInf, pcInf cache.SharedIndexInformer
	informers      []cache.SharedIndexInformer
	// upstream is the informer of scheduling.k8s.io/v1beta1 PodGroups, when served.
	upstream cache.SharedIndexInformer
	// slices lists ResourceSlices with DeviceTaintRules applied (when served).
	slices *tracker.Tracker

	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	solver    *solver.Solver
	filters   *filters.Filters
	decideCfg decide.Config
	podInfos  *filters.PodInfoCache
	snapCache *snapshot.Cache
	effects   *effects
	assumed   *assumeCache
	celCache  celCache
	features  structured.Features

	trigger chan struct{}

	mu          sync.Mutex
	mappings    map[types.UID]mapper.Mapping
	memory      *decide.Memory
	capacityGen uint64 // bumped when capacity may have come back

	cycles atomic.Uint64
	// inputGen counts informer events that can change a decision (kick); epochs is the cycle
	// goroutine's input epoch (epoch.go).
	inputGen atomic.Uint64
	epochs   epochState

	// leading: this replica schedules.
	leadMu  sync.Mutex
	leading bool
}

// Scheme has the core types and the scheduling API (for Events on PodGroups).
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(v1alpha1.AddToScheme(Scheme))
}

// New creates a scheduler for the cluster cfg points at. It asks the API server (discovery)
// whether it serves the Kubernetes gang API and DeviceTaintRules.
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
	if opts.MinCycleInterval <= 0 {
		opts.MinCycleInterval = defaultMinCycleInterval
	}
	if opts.Parallelism <= 0 {
		opts.Parallelism = 16
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.UnfitRetry == 0 {
		opts.UnfitRetry = defaultUnfitRetry
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	sc, err := client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	served, err := informerset.Discover(kube)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		opts:      opts,
		clock:     opts.Clock,
		kube:      kube,
		sched:     sc,
		assumed:   newAssumeCache(),
		trigger:   make(chan struct{}, 1),
		mappings:  map[types.UID]mapper.Mapping{},
		memory:    decide.NewMemory(),
		podInfos:  filters.NewPodInfoCache(),
		snapCache: snapshot.NewCache(),
	}
	// The kube-scheduler's filter plugins register the informers they read (PVCs, PVs,
	// StorageClasses, CSI objects, namespaces) on the shared factory (shared with shadow
	// mode: controlplane/informerset).
	set, err := informerset.New(informerset.Options{Kube: kube, Sched: sc, Served: served, VolumeBindTimeout: opts.VolumeBindTimeout, TrackerEvents: true})
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
	taintRules := served.DeviceTaintRules
	if taintRules {
		// A DeviceTaintRule changes what the slices the tracker reports look like.
		if _, err := s.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { s.kick(true) }, UpdateFunc: func(any, any) { s.kick(true) }, DeleteFunc: func(any) { s.kick(true) },
		}); err != nil {
			return nil, fmt.Errorf("add slice tracker handler: %w", err)
		}
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
	s.effects = newEffects(s)
	return s, nil
}

func (s *Scheduler) kick(capacity bool) {
	s.inputGen.Add(1)
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

// Cycles is the number of cycles run so far (tests wait on it).
func (s *Scheduler) Cycles() uint64 { return s.cycles.Load() }

// Idle reports whether no commit and no write is in flight.
func (s *Scheduler) Idle() bool { return s.effects.idle() }

// Run starts the informers and schedules until ctx ends (with leader election: while this
// replica leads; after losing the Lease it campaigns again). It returns after every goroutine
// it started has stopped.
func (s *Scheduler) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	runStart := time.Now()
	s.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.kube.CoreV1().Events("")})
	defer s.broadcaster.Shutdown()
	defer s.slices.Stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	infCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	s.factory.Start(infCtx.Done())
	defer s.factory.Shutdown()
	for _, inf := range []cache.SharedIndexInformer{s.queueInf, s.pgInf, s.topoInf} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inf.RunWithContext(infCtx)
		}()
	}
	synced := make([]cache.InformerSynced, 0, len(s.informers)+1)
	for _, inf := range s.informers {
		synced = append(synced, inf.HasSynced)
	}
	synced = append(synced, s.slices.HasSynced)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informers did not sync: %w", ctx.Err())
	}
	for typ, ok := range s.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v did not sync: %w", typ, ctx.Err())
		}
	}
	// Once per start: how long the informers' initial lists took (on a large cluster most of
	// a start; the fair benchmark's clock starts here, test/bench).
	logger.Info("Informers synced", "after", time.Since(runStart).Round(time.Millisecond))
	if s.opts.Features != nil {
		s.features = *s.opts.Features
	} else {
		f, err := DetectFeatures(ctx, s.kube, s.opts.ProbeNamespace)
		if err != nil {
			return err
		}
		s.features = f
	}
	s.celCache = newCELCache(s.features)
	s.decideCfg = decide.Config{
		Solver:                s.solver,
		Snapshot:              s.snapshotConfig(),
		StarvationTimeout:     s.opts.StarvationTimeout,
		FormationTimeout:      s.opts.FormationTimeout,
		UsageHalfLife:         s.opts.UsageHalfLife,
		UsageWeight:           s.opts.UsageWeight,
		MaxConsolidationMoves: s.opts.ConsolidationMaxPods,
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.effects.run(infCtx, s.opts.Parallelism)
	}()

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

func (s *Scheduler) snapshotConfig() snapshot.Config {
	return snapshot.Config{Features: s.features, GPUDrivers: s.opts.GPUDrivers, CELCache: s.celCache, PodInfos: s.podInfos, Cache: s.snapCache}
}

// lead is one leadership term: rebuild state from the API, roll back half-committed gangs,
// then run cycles until ctx ends. In-flight commits finish before it returns.
func (s *Scheduler) lead(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	s.setLeading(true)
	defer s.setLeading(false)
	// Writes still queued when the term ends are the old leader's: dropped, not sent.
	defer s.effects.writes.drop()
	defer s.effects.waitCommits()
	s.assumed.reset()
	s.effects.reset()
	s.inputGen.Add(1) // a new term starts a new input epoch
	s.mu.Lock()
	s.memory = decide.NewMemory()
	s.mu.Unlock()
	if err := s.recover(ctx); err != nil {
		return fmt.Errorf("recover state: %w", err)
	}
	logger.Info("Scheduling", "schedulerName", s.opts.SchedulerName)
	ticker := s.clock.NewTicker(s.opts.Period)
	defer ticker.Stop()
	for {
		last := s.clock.Now()
		s.cycle(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.trigger:
			// Let a burst of events settle into one cycle, and keep cycles apart so that a
			// stream of events cannot keep the scheduler busy rebuilding snapshots.
			wait := cycleWait(s.clock.Since(last), s.opts.MinCycleInterval)
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

func (s *Scheduler) setLeading(v bool) {
	s.leadMu.Lock()
	s.leading = v
	s.leadMu.Unlock()
}
