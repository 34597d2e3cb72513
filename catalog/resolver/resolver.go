// Package resolver finds the workload a pod belongs to: it walks the pod's
// controller owner references through informer caches to the topmost object the
// catalog has a definition for, maps that object and tells the pod's component,
// instance, replica and gang. It never lists the cluster per pod.
package resolver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/catalog"
)

var (
	// ErrUnknownOwner: the pod has a controller, but no object on its owner chain
	// has a definition. The caller schedules the pod as a one-pod gang (see
	// SinglePod) and records the reason (the error's text).
	ErrUnknownOwner = errors.New("no owner of the pod has a catalog definition")
	// ErrOwnerNotFound: an owner is not (yet) in the informer cache, or the cached
	// object has another UID; retry later.
	ErrOwnerNotFound = errors.New("owner not found in the informer cache")
)

// maxDepth bounds the owner walk (owner cycles are possible in a broken cluster).
const maxDepth = 16

var podGVK = corev1.SchemeGroupVersion.WithKind("Pod")

// PodWorkload is the workload a pod belongs to and the pod's place in it.
type PodWorkload struct {
	// The top-level workload object.
	GVK       schema.GroupVersionKind
	Namespace string
	Name      string
	UID       types.UID
	// Labels and Annotations of the workload object (e.g. tessera.dev/queue),
	// from the informer cache; shared: do not modify.
	Labels      map[string]string
	Annotations map[string]string
	// Workload is the mapped model of the workload object (shared between calls:
	// do not modify).
	Workload *catalog.Workload
	// Component is the definition component; ComponentName the Workload.Components
	// entry (the instance id for components with instances).
	Component     string
	ComponentName string
	Instance      string
	Replica       string
	Role          catalog.Role
	// Gang is nil when the pod is scheduled alone.
	Gang *catalog.PodGang
	// FallbackReason is set by SinglePod.
	FallbackReason string
}

// GangKey identifies the pod's gang in the cluster: namespace/kind/name/gang, or
// namespace/Pod/name for a pod scheduled alone.
func (p *PodWorkload) GangKey() string {
	if p.Gang == nil {
		return p.Namespace + "/Pod/" + p.podName()
	}
	return p.Namespace + "/" + p.GVK.Kind + "/" + p.Name + "/" + p.Gang.Name
}

func (p *PodWorkload) podName() string {
	if p.GVK == podGVK {
		return p.Name
	}
	return p.Name + "-pod"
}

// SinglePod is the fallback for a pod whose workload cannot be resolved: a
// one-pod workload with a one-pod gang, recording why.
func SinglePod(pod *corev1.Pod, reason string) *PodWorkload {
	return &PodWorkload{
		GVK:            podGVK,
		Namespace:      pod.Namespace,
		Name:           pod.Name,
		UID:            pod.UID,
		Component:      "pod",
		ComponentName:  "pod",
		Role:           catalog.RoleWorker,
		Gang:           &catalog.PodGang{Name: "pod", PodGroup: "pod", Shape: "pod", MinMember: 1, Pods: 1},
		FallbackReason: reason,
	}
}

// getter reads one object of a kind from a cache.
type getter func(namespace, name string) (metav1.Object, runtime.Object, error)

// Resolver resolves pods to workloads through informer caches. Safe for
// concurrent use once started.
type Resolver struct {
	cat    atomic.Pointer[catalog.Catalog]
	claims catalog.ClaimLookup

	mapper    meta.RESTMapper
	podLister corelisters.PodLister
	factory   dynamicinformer.DynamicSharedInformerFactory
	// clusterFactory watches cluster-scoped objects (WorkloadDefinitions), which
	// a namespace filter must not apply to.
	clusterFactory dynamicinformer.DynamicSharedInformerFactory
	// metaFactory, when a metadata client is given, watches only the metadata of
	// kinds the walk passes through but never maps (ReplicaSets, PodCliques, …
	// and pods): owner references are all it reads from them.
	metaFactory metadatainformer.SharedInformerFactory

	// kindsMu guards the informers: kinds are added when a new definition names
	// them or when a CRD missing at start appears.
	kindsMu sync.RWMutex
	getters map[schema.GroupVersionKind]getter
	// full marks kinds cached as whole objects (they can be mapped); the others
	// are cached as metadata only.
	full    map[schema.GroupVersionKind]bool
	missing map[schema.GroupVersionKind]bool
	// lookAgain asks the rediscovery loop to look for missing kinds now: a pod
	// is owned by one (its CRD appeared since the last look).
	lookAgain chan struct{}
	synced    []cache.InformerSynced
	startCtx  context.Context

	defs *clusterDefinitions // nil unless WithClusterDefinitions
	wg   sync.WaitGroup

	mu     sync.Mutex
	mapped map[types.UID]mappedEntry
}

type mappedEntry struct {
	resourceVersion string
	workload        *catalog.Workload
	// catalog the workload was mapped with: a new catalog maps it again.
	catalog *catalog.Catalog
}

// maxMapped bounds the cache of mapped workloads; it is dropped when full (a
// cache miss only costs one evaluation).
const maxMapped = 20000

// RediscoverInterval is how often the resolver looks again for kinds the API
// server did not serve (a CRD installed after the scheduler started).
var RediscoverInterval = 30 * time.Second

// Option configures New.
type Option func(*config)

type config struct {
	resync      time.Duration
	podLister   corelisters.PodLister
	claims      catalog.ClaimLookup
	namespace   string
	clusterDefs bool
	fileDefs    []*catalog.Definition
	writeStatus bool
	metadata    metadata.Interface
}

// WithMetadataClient caches the kinds that are only walked through (not mapped)
// as metadata, which takes far less memory than whole objects. NewForConfig sets it.
func WithMetadataClient(m metadata.Interface) Option { return func(c *config) { c.metadata = m } }

// WithPodLister reuses the caller's pod informer to walk through pods that own
// objects (a LeaderWorkerSet leader pod owns its workers' StatefulSet); without
// it the resolver watches pods itself.
func WithPodLister(l corelisters.PodLister) Option { return func(c *config) { c.podLister = l } }

// WithClaimLookup counts GPUs of DRA claims in mapped workloads.
func WithClaimLookup(l catalog.ClaimLookup) Option { return func(c *config) { c.claims = l } }

// WithResync sets the informers' resync period (default none).
func WithResync(d time.Duration) Option { return func(c *config) { c.resync = d } }

// WithNamespace limits the informers to one namespace.
func WithNamespace(ns string) Option { return func(c *config) { c.namespace = ns } }

// WithClusterDefinitions makes the resolver follow the cluster's
// WorkloadDefinition objects: the catalog in force becomes the built-ins, the
// cluster's definitions and fileDefs (which win over the cluster), rebuilt on
// every change. With writeStatus, each WorkloadDefinition gets an Accepted
// condition saying whether it is in force and, if not, why (needs update on
// workloaddefinitions/status).
func WithClusterDefinitions(fileDefs []*catalog.Definition, writeStatus bool) Option {
	return func(c *config) { c.clusterDefs, c.fileDefs, c.writeStatus = true, fileDefs, writeStatus }
}

// NewForConfig builds a resolver with a dynamic client and a discovery-backed
// REST mapper for cfg.
func NewForConfig(ctx context.Context, cat *catalog.Catalog, cfg *rest.Config, opts ...Option) (*Resolver, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metadata client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	return New(ctx, cat, dc, mapper, append([]Option{WithMetadataClient(mc)}, opts...)...)
}

// New sets up informers for every kind the catalog maps and every intermediate
// kind its definitions name; kinds the API server does not serve are looked for
// again every RediscoverInterval (until then, a pod owned by one resolves to
// ErrUnknownOwner). Call Start, then WaitForCacheSync.
func New(ctx context.Context, cat *catalog.Catalog, client dynamic.Interface, mapper meta.RESTMapper, opts ...Option) (*Resolver, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	r := &Resolver{
		claims:         cfg.claims,
		mapper:         mapper,
		podLister:      cfg.podLister,
		getters:        map[schema.GroupVersionKind]getter{},
		full:           map[schema.GroupVersionKind]bool{},
		missing:        map[schema.GroupVersionKind]bool{},
		lookAgain:      make(chan struct{}, 1),
		mapped:         map[types.UID]mappedEntry{},
		factory:        dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, cfg.resync, cfg.namespace, nil),
		clusterFactory: dynamicinformer.NewDynamicSharedInformerFactory(client, cfg.resync),
	}
	if cfg.metadata != nil {
		r.metaFactory = metadatainformer.NewFilteredSharedInformerFactory(cfg.metadata, cfg.resync, cfg.namespace, nil)
	}
	r.cat.Store(cat)
	if err := r.ensureKinds(ctx, cat); err != nil {
		return nil, err
	}
	if cfg.clusterDefs {
		d, err := newClusterDefinitions(ctx, r, client, cfg.fileDefs, cfg.writeStatus)
		if err != nil {
			return nil, err
		}
		r.defs = d
	}
	return r, nil
}

// Catalog is the catalog in force (it changes with WithClusterDefinitions).
func (r *Resolver) Catalog() *catalog.Catalog { return r.cat.Load() }

// ensureKinds sets up informers for the kinds of cat that have none yet.
func (r *Resolver) ensureKinds(ctx context.Context, cat *catalog.Catalog) error {
	logger := klog.FromContext(ctx)
	r.kindsMu.Lock()
	defer r.kindsMu.Unlock()
	added := false
	for _, gvk := range append(cat.RootKinds(), cat.IntermediateKinds()...) {
		// Pods are mapped only as the pod being resolved (passed in), so the walk
		// needs their metadata only; other mapped kinds need whole objects.
		needFull := cat.Knows(gvk) && gvk != podGVK
		if _, ok := r.getters[gvk]; ok && (r.full[gvk] || !needFull) {
			continue
		}
		if gvk == podGVK && r.podLister != nil {
			pl := r.podLister
			r.getters[gvk] = func(ns, name string) (metav1.Object, runtime.Object, error) {
				p, err := pl.Pods(ns).Get(name)
				if err != nil {
					return nil, nil, err
				}
				return p, p, nil
			}
			r.full[gvk] = true
			continue
		}
		m, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			if meta.IsNoMatchError(err) {
				if !r.missing[gvk] {
					logger.V(2).Info("Kind not served; pods owned by it resolve as unknown until it is", "kind", gvk.String())
				}
				r.missing[gvk] = true
				continue
			}
			return fmt.Errorf("REST mapping of %s: %w", gvk, err)
		}
		delete(r.missing, gvk)
		var inf informers.GenericInformer
		if needFull || r.metaFactory == nil {
			inf = r.factory.ForResource(m.Resource)
		} else {
			inf = r.metaFactory.ForResource(m.Resource)
		}
		// Server-side apply bookkeeping is often the largest part of an object and
		// nothing here reads it; an informer already started keeps its transform.
		_ = inf.Informer().SetTransform(stripManagedFields)
		r.synced = append(r.synced, inf.Informer().HasSynced)
		lister := inf.Lister()
		namespaced := m.Scope.Name() == meta.RESTScopeNameNamespace
		r.getters[gvk] = func(ns, name string) (metav1.Object, runtime.Object, error) {
			var obj runtime.Object
			var err error
			if namespaced {
				obj, err = lister.ByNamespace(ns).Get(name)
			} else {
				obj, err = lister.Get(name)
			}
			if err != nil {
				return nil, nil, err
			}
			mo, err := meta.Accessor(obj)
			if err != nil {
				return nil, nil, err
			}
			return mo, obj, nil
		}
		r.full[gvk] = needFull || r.metaFactory == nil
		added = true
		logger.V(4).Info("Watching kind for owner lookups", "kind", gvk.String(), "wholeObjects", r.full[gvk])
	}
	if added && r.startCtx != nil {
		// Start only starts the informers not started yet.
		r.factory.Start(r.startCtx.Done())
		if r.metaFactory != nil {
			r.metaFactory.Start(r.startCtx.Done())
		}
	}
	return nil
}

// rediscover looks again, now and then, for kinds the API server did not serve.
func (r *Resolver) rediscover(ctx context.Context) {
	t := time.NewTicker(RediscoverInterval)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.lookAgain:
			// Pods of a new kind ask at every try: look at most once a second.
			if wait := time.Second - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
		last = time.Now()
		r.kindsMu.RLock()
		n := len(r.missing)
		r.kindsMu.RUnlock()
		if n == 0 {
			continue
		}
		if rs, ok := r.mapper.(interface{ Reset() }); ok {
			rs.Reset()
		}
		if err := r.ensureKinds(ctx, r.Catalog()); err != nil {
			klog.FromContext(ctx).Error(err, "Looking for kinds again")
		}
	}
}

// getter returns how to read objects of gvk from the caches, and whether they
// are cached whole (mappable) or as metadata.
func (r *Resolver) getter(gvk schema.GroupVersionKind) (getter, bool, bool) {
	r.kindsMu.RLock()
	defer r.kindsMu.RUnlock()
	g, ok := r.getters[gvk]
	return g, r.full[gvk], ok
}

// Start starts the informers and the resolver's goroutines; they stop when ctx
// ends (call Shutdown to wait for them).
func (r *Resolver) Start(ctx context.Context) {
	r.kindsMu.Lock()
	r.startCtx = ctx
	r.kindsMu.Unlock()
	r.factory.Start(ctx.Done())
	r.clusterFactory.Start(ctx.Done())
	if r.metaFactory != nil {
		r.metaFactory.Start(ctx.Done())
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.rediscover(ctx)
	}()
	if r.defs != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.defs.run(ctx)
		}()
	}
}

// WaitForCacheSync waits until every informer has synced and, with
// WithClusterDefinitions, the cluster's definitions are in force.
func (r *Resolver) WaitForCacheSync(ctx context.Context) bool {
	r.kindsMu.RLock()
	synced := append([]cache.InformerSynced(nil), r.synced...)
	r.kindsMu.RUnlock()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return false
	}
	if r.defs != nil {
		if !cache.WaitForCacheSync(ctx.Done(), r.defs.synced) {
			return false
		}
		r.defs.rebuild(ctx)
		// Informers for kinds that the cluster's definitions added.
		r.kindsMu.RLock()
		synced = append([]cache.InformerSynced(nil), r.synced...)
		r.kindsMu.RUnlock()
		return cache.WaitForCacheSync(ctx.Done(), synced...)
	}
	return true
}

// Shutdown waits for the informers and goroutines after Start's context ended.
func (r *Resolver) Shutdown() {
	r.factory.Shutdown()
	r.clusterFactory.Shutdown()
	if r.metaFactory != nil {
		r.metaFactory.Shutdown()
	}
	r.wg.Wait()
}

// Resolve returns the workload pod belongs to. Errors: ErrUnknownOwner (use
// SinglePod), ErrOwnerNotFound (retry), a *catalog.Error (the definition failed on
// the workload), catalog.ErrNoComponent (no component selects the pod).
func (r *Resolver) Resolve(ctx context.Context, pod *corev1.Pod) (*PodWorkload, error) {
	type level struct {
		gvk schema.GroupVersionKind
		obj runtime.Object
		mo  metav1.Object
	}
	var top *level
	var topIdx int
	var chain []schema.GroupVersionKind // kinds above the pod, nearest first
	cat := r.Catalog()
	if cat.Knows(podGVK) {
		top = &level{gvk: podGVK, obj: pod, mo: pod}
	}
	cur := metav1.Object(pod)
	hasOwner := false
	seen := map[types.UID]bool{}
	if pod.UID != "" {
		seen[pod.UID] = true
	}
	for depth := 0; ; depth++ {
		ref := metav1.GetControllerOfNoCopy(cur)
		if ref == nil {
			break
		}
		if depth == maxDepth || seen[ref.UID] {
			return nil, fmt.Errorf("pod %s/%s: owner references form a cycle or a chain longer than %d at %s %s", pod.Namespace, pod.Name, maxDepth, ref.Kind, ref.Name)
		}
		seen[ref.UID] = true
		hasOwner = true
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: owner %s %s: %w", pod.Namespace, pod.Name, ref.Kind, ref.Name, err)
		}
		gvk := gv.WithKind(ref.Kind)
		get, full, ok := r.getter(gvk)
		if !ok && cat.Walks(gvk) {
			// A kind the catalog defines whose CRD was not served when last
			// looked for: mapping the pod by a lower owner (a JobSet's Job)
			// would give it the wrong gang. Look for the kind now and retry.
			select {
			case r.lookAgain <- struct{}{}:
			default:
			}
			return nil, fmt.Errorf("pod %s/%s: owner %s %s: kind not watched yet: %w", pod.Namespace, pod.Name, catalog.GVKString(gvk), ref.Name, ErrOwnerNotFound)
		}
		if !ok || !cat.Walks(gvk) {
			// A kind nobody defines: the walk ends; the topmost known object so far
			// (if any above the pod) is the workload.
			if top == nil || top.gvk == podGVK && depth == 0 {
				return nil, fmt.Errorf("pod %s/%s: owner %s %s: %w", pod.Namespace, pod.Name, catalog.GVKString(gvk), ref.Name, ErrUnknownOwner)
			}
			break
		}
		mo, obj, err := get(pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("pod %s/%s: %s %s: %w", pod.Namespace, pod.Name, catalog.GVKString(gvk), ref.Name, ErrOwnerNotFound)
			}
			return nil, fmt.Errorf("pod %s/%s: reading %s %s: %w", pod.Namespace, pod.Name, catalog.GVKString(gvk), ref.Name, err)
		}
		if mo.GetUID() != ref.UID {
			return nil, fmt.Errorf("pod %s/%s: %s %s has UID %s, owner reference says %s: %w", pod.Namespace, pod.Name, catalog.GVKString(gvk), ref.Name, mo.GetUID(), ref.UID, ErrOwnerNotFound)
		}
		chain = append(chain, gvk)
		if cat.Knows(gvk) && full {
			top, topIdx = &level{gvk: gvk, obj: obj, mo: mo}, len(chain)-1
		}
		cur = mo
	}
	if top == nil || (hasOwner && top.gvk == podGVK && top.obj == runtime.Object(pod)) {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, ErrUnknownOwner)
	}
	w, err := r.mapObject(ctx, cat, top.gvk, top.obj, top.mo)
	if err != nil {
		return nil, err
	}
	// The kinds between the pod and the workload, nearest first.
	below := chain
	if top.gvk != podGVK || top.obj != runtime.Object(pod) {
		below = chain[:topIdx]
	}
	pm, err := cat.MatchPod(ctx, w, pod, below)
	if err != nil {
		return nil, err
	}
	return &PodWorkload{
		GVK:           top.gvk,
		Namespace:     top.mo.GetNamespace(),
		Name:          top.mo.GetName(),
		UID:           top.mo.GetUID(),
		Labels:        top.mo.GetLabels(),
		Annotations:   top.mo.GetAnnotations(),
		Workload:      w,
		Component:     pm.Component,
		ComponentName: pm.Name,
		Instance:      pm.Instance,
		Replica:       pm.Replica,
		Role:          pm.Role,
		Gang:          pm.Gang,
	}, nil
}

// mapObject maps the workload object, reusing the result while its
// resourceVersion is unchanged: pods of one workload share one evaluation.
func (r *Resolver) mapObject(ctx context.Context, cat *catalog.Catalog, gvk schema.GroupVersionKind, obj runtime.Object, mo metav1.Object) (*catalog.Workload, error) {
	uid, rv := mo.GetUID(), mo.GetResourceVersion()
	if uid != "" && rv != "" {
		r.mu.Lock()
		e, ok := r.mapped[uid]
		r.mu.Unlock()
		if ok && e.resourceVersion == rv && e.catalog == cat {
			return e.workload, nil
		}
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return nil, fmt.Errorf("converting %s %s: %w", gvk.Kind, mo.GetName(), err)
		}
		u = &unstructured.Unstructured{Object: content}
	}
	if u.GetKind() == "" {
		// Typed objects from informers carry no TypeMeta.
		u = u.DeepCopy()
		u.SetGroupVersionKind(gvk)
	}
	w, err := cat.MapWithClaims(ctx, u, r.claims)
	if err != nil {
		return nil, err
	}
	if uid != "" && rv != "" {
		r.mu.Lock()
		if len(r.mapped) >= maxMapped {
			r.mapped = map[types.UID]mappedEntry{}
		}
		r.mapped[uid] = mappedEntry{resourceVersion: rv, workload: w, catalog: cat}
		r.mu.Unlock()
	}
	return w, nil
}

// stripManagedFields drops metadata.managedFields from cached objects.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil && a.GetManagedFields() != nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}
