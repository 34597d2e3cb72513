package client

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Topologies returns the client of the cluster-scoped Topology.
func (c *Client) Topologies() *Topologies { return &Topologies{c: c} }

// Topologies is the client of the cluster-scoped Topology.
type Topologies struct{ c *Client }

func (t *Topologies) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.TopologyList, error) {
	out := &v1alpha1.TopologyList{}
	return out, t.c.rest.Get().Resource("topologies").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
}

func (t *Topologies) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return t.c.rest.Get().Resource("topologies").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

func (t *Topologies) Create(ctx context.Context, obj *v1alpha1.Topology) (*v1alpha1.Topology, error) {
	out := &v1alpha1.Topology{}
	return out, t.c.rest.Post().Resource("topologies").Body(obj).Do(ctx).Into(out)
}

func (t *Topologies) Delete(ctx context.Context, name string) error {
	return t.c.rest.Delete().Resource("topologies").Name(name).Do(ctx).Error()
}

// TopologyListWatch lists and watches all Topologies, for an informer.
func (c *Client) TopologyListWatch() *cache.ListWatch {
	t := c.Topologies()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return t.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return t.Watch(ctx, opts)
		},
	}
}
