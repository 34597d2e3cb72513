package overview

import (
	"context"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
)

// Watcher keeps what Build reads in informer caches, for views that stay up
// (`tessera top --web`, its metrics): after the initial lists, an overview
// costs no API call however often it is built or scraped.
type Watcher struct {
	slices, claims cache.SharedIndexInformer
	// queues and groups are nil on a cluster without the tessera CRDs.
	queues, groups cache.SharedIndexInformer
	factory        informers.SharedInformerFactory

	mu      sync.Mutex
	started bool
}

// NewWatcher prepares the informers; Start runs them.
func NewWatcher(cfg *rest.Config) (*Watcher, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	sched, err := schedclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("scheduling client: %w", err)
	}
	w := &Watcher{factory: informers.NewSharedInformerFactory(client, 0)}
	w.slices = w.factory.Resource().V1().ResourceSlices().Informer()
	w.claims = w.factory.Resource().V1().ResourceClaims().Informer()
	// A cluster without tessera's CRDs has no queues and gangs; that is no
	// error (as for Fetch), but an informer would retry its list forever.
	served, err := client.Discovery().ServerResourcesForGroupVersion(v1alpha1.SchemeGroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("discover %s: %w", v1alpha1.SchemeGroupVersion, err)
	default:
		for _, r := range served.APIResources {
			switch r.Name {
			case "queues":
				w.queues = cache.NewSharedIndexInformer(sched.QueueListWatch(), &v1alpha1.Queue{}, 0, cache.Indexers{})
			case "podgroups":
				w.groups = cache.NewSharedIndexInformer(sched.PodGroupListWatch(), &v1alpha1.PodGroup{}, 0, cache.Indexers{})
			}
		}
	}
	for _, inf := range w.informers() {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return nil, fmt.Errorf("informer transform: %w", err)
		}
	}
	return w, nil
}

func (w *Watcher) informers() []cache.SharedIndexInformer {
	var all []cache.SharedIndexInformer
	for _, inf := range []cache.SharedIndexInformer{w.slices, w.claims, w.queues, w.groups} {
		if inf != nil {
			all = append(all, inf)
		}
	}
	return all
}

// stripManagedFields drops what the overview never reads, to keep the
// caches small on a large cluster.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// Start runs the informers until ctx ends; WaitForSync waits for their
// first lists.
func (w *Watcher) Start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return
	}
	w.started = true
	w.factory.Start(ctx.Done())
	for _, inf := range []cache.SharedIndexInformer{w.queues, w.groups} {
		if inf != nil {
			go inf.RunWithContext(ctx)
		}
	}
}

// WaitForSync waits until every cache holds its first list, or ctx ends.
func (w *Watcher) WaitForSync(ctx context.Context) error {
	var synced []cache.InformerSynced
	for _, inf := range w.informers() {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("overview caches not synced: %w", context.Cause(ctx))
	}
	return nil
}

// Overview builds the overview from the caches (Start first).
func (w *Watcher) Overview(_ context.Context, now time.Time) (Cluster, error) {
	in := Input{Now: now}
	for _, obj := range w.slices.GetStore().List() {
		in.Slices = append(in.Slices, *obj.(*resourceapi.ResourceSlice))
	}
	for _, obj := range w.claims.GetStore().List() {
		in.Claims = append(in.Claims, *obj.(*resourceapi.ResourceClaim))
	}
	if w.queues != nil {
		for _, obj := range w.queues.GetStore().List() {
			in.Queues = append(in.Queues, *obj.(*v1alpha1.Queue))
		}
	}
	if w.groups != nil {
		for _, obj := range w.groups.GetStore().List() {
			in.PodGroups = append(in.PodGroups, *obj.(*v1alpha1.PodGroup))
		}
	}
	return Build(in), nil
}
