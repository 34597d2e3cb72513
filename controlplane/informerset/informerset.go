// Package informerset builds what tessera-scheduler decides with, the same for the acting
// scheduler (controlplane/scheduler) and its shadow mode (controlplane/shadow): one shared
// informer factory with the kube-scheduler's filter plugins registered on it, the informers
// of every kind a decision reads (pods, namespaces, nodes, DRA objects, volumes, Queues,
// PodGroups, Topologies, PriorityClasses, and the Kubernetes gang API and DeviceTaintRules
// where the server serves them), and the ResourceSlice tracker. It only builds: the caller
// adds its own event handlers and starts the factory and the informers.
package informerset

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/filters"
)

// Served says which optional APIs the server serves.
type Served struct {
	// PodGroups: scheduling.k8s.io/v1beta1 PodGroups (the Kubernetes gang API).
	PodGroups bool
	// DeviceTaintRules: resource.k8s.io/v1 DeviceTaintRules.
	DeviceTaintRules bool
}

// Discover asks the server (discovery only) which optional APIs it serves.
func Discover(kube kubernetes.Interface) (Served, error) {
	has := func(gv, resource string) (bool, error) {
		list, err := kube.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return false, fmt.Errorf("discover %s: %w", gv, err)
		}
		for _, r := range list.APIResources {
			if r.Name == resource {
				return true, nil
			}
		}
		return false, nil
	}
	var out Served
	var err error
	if out.PodGroups, err = has(schedulingv1beta1.SchemeGroupVersion.String(), "podgroups"); err != nil {
		return out, err
	}
	if out.DeviceTaintRules, err = has("resource.k8s.io/v1", "devicetaintrules"); err != nil {
		return out, err
	}
	return out, nil
}

// Options configure New.
type Options struct {
	Kube   kubernetes.Interface
	Sched  *client.Client
	Served Served
	// VolumeBindTimeout for the volume binder of the filter plugins (0: its default).
	VolumeBindTimeout time.Duration
	// TrackerEvents lets the ResourceSlice tracker record Events about broken
	// DeviceTaintRules (the acting scheduler; shadow mode writes no Events).
	TrackerEvents bool
}

// Set is the informers and filters of one scheduler.
type Set struct {
	Factory informers.SharedInformerFactory
	// Filters are the kube-scheduler's filter plugins; they register the informers they read
	// (PVCs, PVs, StorageClasses, CSI objects, namespaces) on Factory.
	Filters *filters.Filters

	Pods, Namespaces, Claims cache.SharedIndexInformer
	// Queues, PodGroups (indexed by namespace) and Topologies are tessera's own kinds.
	Queues, PodGroups, Topologies cache.SharedIndexInformer
	PriorityClasses               cache.SharedIndexInformer
	// Upstream is the informer of scheduling.k8s.io/v1beta1 PodGroups, nil when not served.
	Upstream cache.SharedIndexInformer
	// All lists every informer a decision reads (Upstream and DeviceTaintRules included
	// where served), for event handlers and cache syncs.
	All []cache.SharedIndexInformer
	// Slices is the ResourceSlice tracker (DeviceTaintRules applied when served).
	Slices *tracker.Tracker
	Served Served
}

// New builds the set; nothing is started.
func New(o Options) (*Set, error) {
	s := &Set{Factory: informers.NewSharedInformerFactory(o.Kube, 0), Served: o.Served}
	var err error
	s.Filters, err = filters.New(context.Background(), filters.Config{Informers: s.Factory, Client: o.Kube, Volumes: true, VolumeBindTimeout: o.VolumeBindTimeout})
	if err != nil {
		return nil, fmt.Errorf("filter plugins: %w", err)
	}
	f := s.Factory
	s.Pods = f.Core().V1().Pods().Informer()
	s.Namespaces = f.Core().V1().Namespaces().Informer()
	s.Claims = f.Resource().V1().ResourceClaims().Informer()
	s.Queues = cache.NewSharedIndexInformer(o.Sched.QueueListWatch(), &v1alpha1.Queue{}, 0, cache.Indexers{})
	s.PodGroups = cache.NewSharedIndexInformer(o.Sched.PodGroupListWatch(), &v1alpha1.PodGroup{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	s.Topologies = cache.NewSharedIndexInformer(o.Sched.TopologyListWatch(), &v1alpha1.Topology{}, 0, cache.Indexers{})
	s.PriorityClasses = f.Scheduling().V1().PriorityClasses().Informer()
	// The slice informer's copy shares equal values across devices and nodes and has no
	// managedFields (transform.go): most of the heap on a cluster of partitionable GPUs.
	if err := f.Resource().V1().ResourceSlices().Informer().SetTransform(NewSliceTransform().Func()); err != nil {
		return nil, fmt.Errorf("ResourceSlice informer transform: %w", err)
	}
	s.All = []cache.SharedIndexInformer{
		s.Pods, s.Namespaces, s.PriorityClasses, s.Topologies,
		f.Core().V1().Nodes().Informer(),
		f.Resource().V1().ResourceSlices().Informer(),
		s.Claims,
		f.Resource().V1().DeviceClasses().Informer(),
		f.Core().V1().PersistentVolumeClaims().Informer(),
		f.Core().V1().PersistentVolumes().Informer(),
		s.Queues, s.PodGroups,
	}
	if o.Served.PodGroups {
		s.Upstream = f.Scheduling().V1beta1().PodGroups().Informer()
		s.All = append(s.All, s.Upstream)
	}
	if o.Served.DeviceTaintRules {
		s.All = append(s.All, f.Resource().V1().DeviceTaintRules().Informer())
	}
	topts := tracker.Options{
		EnableDeviceTaintRules: o.Served.DeviceTaintRules, EnableConsumableCapacity: true,
		SliceInformer: f.Resource().V1().ResourceSlices(),
		TaintInformer: f.Resource().V1().DeviceTaintRules(),
	}
	if o.TrackerEvents {
		topts.KubeClient = o.Kube
	}
	s.Slices, err = tracker.StartTracker(context.Background(), topts)
	if err != nil {
		return nil, fmt.Errorf("ResourceSlice tracker: %w", err)
	}
	return s, nil
}

// NamespaceLabels are a namespace's labels from the informer (nil when unknown), for the
// mapper.
func (s *Set) NamespaceLabels(name string) map[string]string {
	obj, ok, err := s.Namespaces.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	return obj.(*v1.Namespace).Labels
}

// UpstreamPodGroup is a scheduling.k8s.io/v1beta1 PodGroup from the informer (nil when
// unknown or not served), for the mapper.
func (s *Set) UpstreamPodGroup(namespace, name string) *schedulingv1beta1.PodGroup {
	if s.Upstream == nil {
		return nil
	}
	obj, ok, err := s.Upstream.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	return obj.(*schedulingv1beta1.PodGroup)
}
