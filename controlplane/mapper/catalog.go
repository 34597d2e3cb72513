package mapper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/resolver"
)

// ErrRetry marks a resolution that may succeed later (an owner not in the cache yet): the pod
// is skipped this cycle instead of falling back to a one-pod gang.
var ErrRetry = errors.New("retry later")

// NewCatalogResolver starts the catalog's informer-backed pod resolver for cat
// against the cluster of cfg, waits for its caches, and adapts it to the
// mapper. opts are passed to the resolver (resolver.WithClusterDefinitions makes
// it follow the cluster's WorkloadDefinitions). Stop it with Resolver.Shutdown.
func NewCatalogResolver(ctx context.Context, cat *catalog.Catalog, cfg *rest.Config, opts ...resolver.Option) (*CatalogResolver, error) {
	r, err := resolver.NewForConfig(ctx, cat, cfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("catalog resolver: %w", err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metadata client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	r.Start(ctx)
	if !r.WaitForCacheSync(ctx) {
		r.Shutdown()
		return nil, fmt.Errorf("catalog resolver caches did not sync: %w", ctx.Err())
	}
	return &CatalogResolver{
		Resolver: r,
		Metadata: md,
		Mapper:   restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)),
	}, nil
}

// CatalogResolver adapts the catalog's pod resolver to the mapper. The catalog does not
// return the workload's labels, so they are read once per workload through the metadata
// API (for the tessera.dev/queue label).
type CatalogResolver struct {
	Resolver *resolver.Resolver
	Metadata metadata.Interface
	Mapper   meta.RESTMapper

	mu     sync.Mutex
	labels map[types.UID]map[string]string
}

// Resolve implements Resolver.
func (c *CatalogResolver) Resolve(ctx context.Context, pod *v1.Pod) (*Workload, error) {
	pw, err := c.Resolver.Resolve(ctx, pod)
	switch {
	case errors.Is(err, resolver.ErrUnknownOwner):
		return nil, nil
	case errors.Is(err, resolver.ErrOwnerNotFound):
		return nil, fmt.Errorf("%w: %w", ErrRetry, err)
	case err != nil:
		return nil, err
	}
	apiVersion, kind := pw.GVK.ToAPIVersionAndKind()
	wl := &Workload{APIVersion: apiVersion, Kind: kind, Name: pw.Name, UID: pw.UID, Component: pw.ComponentName}
	if pw.Gang == nil {
		return wl, nil // the component is in no gang
	}
	// The kind keeps two workloads of the same name (a JobSet and a PyTorchJob "train") apart.
	wl.Gang = strings.ToLower(kind) + "-" + pw.Name + "-" + pw.Gang.Name
	wl.MinMember = int32(pw.Gang.MinMember)
	wl.Labels, err = c.workloadLabels(ctx, pw)
	if err != nil {
		return nil, fmt.Errorf("%w: labels of %s %s/%s: %w", ErrRetry, kind, pw.Namespace, pw.Name, err)
	}
	return wl, nil
}

func (c *CatalogResolver) workloadLabels(ctx context.Context, pw *resolver.PodWorkload) (map[string]string, error) {
	if pw.GVK.Kind == "Pod" && pw.GVK.Group == "" {
		return nil, nil // the pod's own labels are looked at anyway
	}
	c.mu.Lock()
	l, ok := c.labels[pw.UID]
	c.mu.Unlock()
	if ok {
		return l, nil
	}
	m, err := c.Mapper.RESTMapping(pw.GVK.GroupKind(), pw.GVK.Version)
	if err != nil {
		return nil, err
	}
	obj, err := c.Metadata.Resource(m.Resource).Namespace(pw.Namespace).Get(ctx, pw.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.labels == nil {
		c.labels = map[types.UID]map[string]string{}
	}
	c.labels[pw.UID] = obj.Labels
	c.mu.Unlock()
	return obj.Labels, nil
}
