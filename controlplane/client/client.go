// Package client is a small typed client for the scheduling.tessera.dev API (Queue,
// PodGroup) on top of client-go's REST client, with list-watches for informers. It is written
// by hand because the API has two kinds; a generated clientset would be several thousand
// lines.
package client

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Scheme knows the scheduling types.
var Scheme = runtime.NewScheme()

func init() {
	if err := v1alpha1.AddToScheme(Scheme); err != nil {
		panic(err) // static registration; cannot fail at run time
	}
	metav1.AddToGroupVersion(Scheme, v1alpha1.SchemeGroupVersion)
}

// Client talks to the scheduling.tessera.dev API.
type Client struct {
	rest rest.Interface
}

// NewForConfig returns a client for the config.
func NewForConfig(cfg *rest.Config) (*Client, error) {
	c := *cfg
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(Scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("scheduling.tessera.dev REST client: %w", err)
	}
	return &Client{rest: rc}, nil
}

// Queues returns the Queue client.
func (c *Client) Queues() *Queues { return &Queues{rest: c.rest} }

// PodGroups returns the PodGroup client for a namespace ("" for all, list and watch only).
func (c *Client) PodGroups(namespace string) *PodGroups {
	return &PodGroups{rest: c.rest, ns: namespace}
}

// Queues is the client of the cluster-scoped Queue.
type Queues struct{ rest rest.Interface }

func (q *Queues) Get(ctx context.Context, name string) (*v1alpha1.Queue, error) {
	out := &v1alpha1.Queue{}
	return out, q.rest.Get().Resource("queues").Name(name).Do(ctx).Into(out)
}

func (q *Queues) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.QueueList, error) {
	out := &v1alpha1.QueueList{}
	return out, q.rest.Get().Resource("queues").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
}

func (q *Queues) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return q.rest.Get().Resource("queues").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

func (q *Queues) Create(ctx context.Context, obj *v1alpha1.Queue) (*v1alpha1.Queue, error) {
	out := &v1alpha1.Queue{}
	return out, q.rest.Post().Resource("queues").Body(obj).Do(ctx).Into(out)
}

func (q *Queues) Update(ctx context.Context, obj *v1alpha1.Queue) (*v1alpha1.Queue, error) {
	out := &v1alpha1.Queue{}
	return out, q.rest.Put().Resource("queues").Name(obj.Name).Body(obj).Do(ctx).Into(out)
}

func (q *Queues) UpdateStatus(ctx context.Context, obj *v1alpha1.Queue) (*v1alpha1.Queue, error) {
	out := &v1alpha1.Queue{}
	return out, q.rest.Put().Resource("queues").Name(obj.Name).SubResource("status").Body(obj).Do(ctx).Into(out)
}

func (q *Queues) Delete(ctx context.Context, name string) error {
	return q.rest.Delete().Resource("queues").Name(name).Do(ctx).Error()
}

// PodGroups is the client of the namespaced PodGroup.
type PodGroups struct {
	rest rest.Interface
	ns   string
}

func (p *PodGroups) Get(ctx context.Context, name string) (*v1alpha1.PodGroup, error) {
	out := &v1alpha1.PodGroup{}
	return out, p.rest.Get().Namespace(p.ns).Resource("podgroups").Name(name).Do(ctx).Into(out)
}

func (p *PodGroups) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.PodGroupList, error) {
	out := &v1alpha1.PodGroupList{}
	return out, p.rest.Get().Namespace(p.ns).Resource("podgroups").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
}

func (p *PodGroups) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return p.rest.Get().Namespace(p.ns).Resource("podgroups").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

func (p *PodGroups) Create(ctx context.Context, obj *v1alpha1.PodGroup) (*v1alpha1.PodGroup, error) {
	out := &v1alpha1.PodGroup{}
	return out, p.rest.Post().Namespace(p.ns).Resource("podgroups").Body(obj).Do(ctx).Into(out)
}

func (p *PodGroups) Update(ctx context.Context, obj *v1alpha1.PodGroup) (*v1alpha1.PodGroup, error) {
	out := &v1alpha1.PodGroup{}
	return out, p.rest.Put().Namespace(p.ns).Resource("podgroups").Name(obj.Name).Body(obj).Do(ctx).Into(out)
}

func (p *PodGroups) UpdateStatus(ctx context.Context, obj *v1alpha1.PodGroup) (*v1alpha1.PodGroup, error) {
	out := &v1alpha1.PodGroup{}
	return out, p.rest.Put().Namespace(p.ns).Resource("podgroups").Name(obj.Name).SubResource("status").Body(obj).Do(ctx).Into(out)
}

func (p *PodGroups) Patch(ctx context.Context, name string, pt types.PatchType, data []byte) (*v1alpha1.PodGroup, error) {
	out := &v1alpha1.PodGroup{}
	return out, p.rest.Patch(pt).Namespace(p.ns).Resource("podgroups").Name(name).Body(data).Do(ctx).Into(out)
}

func (p *PodGroups) Delete(ctx context.Context, name string) error {
	return p.rest.Delete().Namespace(p.ns).Resource("podgroups").Name(name).Do(ctx).Error()
}

// QueueListWatch lists and watches all Queues, for an informer.
func (c *Client) QueueListWatch() *cache.ListWatch {
	q := c.Queues()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return q.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return q.Watch(ctx, opts)
		},
	}
}

// PodGroupListWatch lists and watches PodGroups in all namespaces, for an informer.
func (c *Client) PodGroupListWatch() *cache.ListWatch {
	p := c.PodGroups("")
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return p.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return p.Watch(ctx, opts)
		},
	}
}
