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
	corelisters "k8s.io/client-go/listers/core/v1"
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
	cat     *catalog.Catalog
	getters map[schema.GroupVersionKind]getter
	claims  catalog.ClaimLookup

	factory dynamicinformer.DynamicSharedInformerFactory
	synced  []cache.InformerSynced

	mu     sync.Mutex
	mapped map[types.UID]mappedEntry
}

type mappedEntry struct {
	resourceVersion string
	workload        *catalog.Workload
}

// maxMapped bounds the cache of mapped workloads; it is dropped when full (a
// cache miss only costs one evaluation).
const maxMapped = 20000

// Option configures New.
type Option func(*config)

type config struct {
	resync    time.Duration
	podLister corelisters.PodLister
	claims    catalog.ClaimLookup
	namespace string
}

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
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	return New(ctx, cat, dc, mapper, opts...)
}

// New sets up informers for every kind the catalog maps and every intermediate
// kind its definitions name; kinds the API server does not serve are skipped (a
// pod owned by one resolves to ErrUnknownOwner). Call Start, then WaitForCacheSync.
func New(ctx context.Context, cat *catalog.Catalog, client dynamic.Interface, mapper meta.RESTMapper, opts ...Option) (*Resolver, error) {
	logger := klog.FromContext(ctx)
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	r := &Resolver{
		cat:     cat,
		getters: map[schema.GroupVersionKind]getter{},
		claims:  cfg.claims,
		mapped:  map[types.UID]mappedEntry{},
		factory: dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, cfg.resync, cfg.namespace, nil),
	}
	kinds := append(cat.RootKinds(), cat.IntermediateKinds()...)
	for _, gvk := range kinds {
		if gvk == podGVK && cfg.podLister != nil {
			pl := cfg.podLister
			r.getters[gvk] = func(ns, name string) (metav1.Object, runtime.Object, error) {
				p, err := pl.Pods(ns).Get(name)
				if err != nil {
					return nil, nil, err
				}
				return p, p, nil
			}
			continue
		}
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			if meta.IsNoMatchError(err) {
				logger.V(2).Info("Kind not served, pods owned by it resolve as unknown", "kind", gvk.String())
				continue
			}
			return nil, fmt.Errorf("REST mapping of %s: %w", gvk, err)
		}
		inf := r.factory.ForResource(m.Resource)
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
	}
	return r, nil
}

// Start starts the informers; they stop when ctx ends (call Shutdown to wait).
func (r *Resolver) Start(ctx context.Context) { r.factory.Start(ctx.Done()) }

// WaitForCacheSync waits until every informer has synced.
func (r *Resolver) WaitForCacheSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), r.synced...)
}

// Shutdown waits for the informers' goroutines after their context ended.
func (r *Resolver) Shutdown() { r.factory.Shutdown() }

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
	if r.cat.Knows(podGVK) {
		top = &level{gvk: podGVK, obj: pod, mo: pod}
	}
	cur := metav1.Object(pod)
	hasOwner := false
	for depth := 0; depth < maxDepth; depth++ {
		ref := metav1.GetControllerOfNoCopy(cur)
		if ref == nil {
			break
		}
		hasOwner = true
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: owner %s %s: %w", pod.Namespace, pod.Name, ref.Kind, ref.Name, err)
		}
		gvk := gv.WithKind(ref.Kind)
		get, ok := r.getters[gvk]
		if !ok {
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
		if r.cat.Knows(gvk) {
			top, topIdx = &level{gvk: gvk, obj: obj, mo: mo}, len(chain)-1
		}
		cur = mo
	}
	if top == nil || (hasOwner && top.gvk == podGVK && top.obj == runtime.Object(pod)) {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, ErrUnknownOwner)
	}
	w, err := r.mapObject(ctx, top.gvk, top.obj, top.mo)
	if err != nil {
		return nil, err
	}
	// The kinds between the pod and the workload, nearest first.
	below := chain
	if top.gvk != podGVK || top.obj != runtime.Object(pod) {
		below = chain[:topIdx]
	}
	pm, err := r.cat.MatchPod(ctx, w, pod, below)
	if err != nil {
		return nil, err
	}
	return &PodWorkload{
		GVK:           top.gvk,
		Namespace:     top.mo.GetNamespace(),
		Name:          top.mo.GetName(),
		UID:           top.mo.GetUID(),
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
func (r *Resolver) mapObject(ctx context.Context, gvk schema.GroupVersionKind, obj runtime.Object, mo metav1.Object) (*catalog.Workload, error) {
	uid, rv := mo.GetUID(), mo.GetResourceVersion()
	if uid != "" && rv != "" {
		r.mu.Lock()
		e, ok := r.mapped[uid]
		r.mu.Unlock()
		if ok && e.resourceVersion == rv {
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
	w, err := r.cat.MapWithClaims(ctx, u, r.claims)
	if err != nil {
		return nil, err
	}
	if uid != "" && rv != "" {
		r.mu.Lock()
		if len(r.mapped) >= maxMapped {
			r.mapped = map[types.UID]mappedEntry{}
		}
		r.mapped[uid] = mappedEntry{resourceVersion: rv, workload: w}
		r.mu.Unlock()
	}
	return w, nil
}
