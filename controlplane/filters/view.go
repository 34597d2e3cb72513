package filters

import (
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// View is the kube-scheduler's picture of one cycle: a framework.NodeInfo per node with the
// pods bound (or assumed) on it. It implements the scheduler framework's SharedLister, which
// is what the filter plugins read. The gang search adds its tentative pods with Assume and
// takes them back with Forget, last in first out, so that a gang's earlier pods count for the
// affinity, spread, ports and resources of its later pods.
//
// A View is not safe for concurrent use.
type View struct {
	nodes  []fwk.NodeInfo // sorted by node name
	byName map[string]*framework.NodeInfo
	// pvcRefs counts, per "namespace/name", the pods on nodes that use the PVC.
	pvcRefs map[string]int
	// assumed is the stack of pods added by Assume.
	assumed []assumedPod
	// lists are derived from nodes and rebuilt when dirty.
	dirty                                    bool
	withAffinity, withRequiredAnti, withWide []fwk.NodeInfo
	// extended maps extended resource names to DeviceClasses (DRA extended resources).
	extended fwk.DeviceClassResolver
	// shared: the NodeInfos and pvcRefs belong to the caller of NewSharedView (and to other
	// views) until this view copies them to change them (shared.go); owned are the nodes
	// copied so far.
	shared, pvcShared bool
	owned             map[string]bool
}

// SetExtendedResources sets the DeviceClass mapping of extended resources that
// NodeResourcesFit consults (a resource a class maps is left to DRA on nodes that do not
// advertise it).
func (v *View) SetExtendedResources(r fwk.DeviceClassResolver) { v.extended = r }

var _ fwk.SharedLister = (*View)(nil)

// PodInfoCache keeps the framework's PodInfo of bound pods across cycles (parsing affinity
// terms and summing requests is most of the cost of building a View). Safe for concurrent use.
type PodInfoCache struct {
	mu      sync.Mutex
	entries map[types.UID]cachedPodInfo
}

type cachedPodInfo struct {
	resourceVersion, node string
	info                  *framework.PodInfo
	used                  bool
}

// NewPodInfoCache returns an empty cache.
func NewPodInfoCache() *PodInfoCache {
	return &PodInfoCache{entries: map[types.UID]cachedPodInfo{}}
}

func (c *PodInfoCache) get(pod *v1.Pod) (*framework.PodInfo, error) {
	if c == nil || pod.UID == "" || pod.ResourceVersion == "" {
		return framework.NewPodInfo(pod)
	}
	c.mu.Lock()
	e, ok := c.entries[pod.UID]
	c.mu.Unlock()
	if ok && e.resourceVersion == pod.ResourceVersion && e.node == pod.Spec.NodeName {
		c.mu.Lock()
		e.used = true
		c.entries[pod.UID] = e
		c.mu.Unlock()
		return e.info, nil
	}
	info, err := framework.NewPodInfo(pod)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.entries[pod.UID] = cachedPodInfo{resourceVersion: pod.ResourceVersion, node: pod.Spec.NodeName, info: info, used: true}
	c.mu.Unlock()
	return info, nil
}

// sweep drops entries not used since the last sweep.
func (c *PodInfoCache) sweep() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, e := range c.entries {
		if !e.used {
			delete(c.entries, uid)
			continue
		}
		e.used = false
		c.entries[uid] = e
	}
}

// NewView builds the view of nodes and the non-terminal pods bound to them (pods of unknown
// nodes are left out, as the kube-scheduler's cache does). cache may be nil.
func NewView(nodes []*v1.Node, pods []*v1.Pod, cache *PodInfoCache) *View {
	v := &View{byName: make(map[string]*framework.NodeInfo, len(nodes)), pvcRefs: map[string]int{}, dirty: true}
	sorted := append([]*v1.Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, n := range sorted {
		ni := framework.NewNodeInfo()
		ni.SetNode(n)
		v.byName[n.Name] = ni
		v.nodes = append(v.nodes, ni)
	}
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		ni := v.byName[p.Spec.NodeName]
		if ni == nil {
			continue
		}
		info, err := cache.get(p)
		if err != nil {
			continue // only for a nil pod
		}
		ni.AddPodInfo(info)
		for key := range framework.PodPVCKeys(p) {
			v.pvcRefs[key]++
		}
	}
	cache.sweep()
	return v
}

// Node returns the NodeInfo of a node, or nil.
func (v *View) Node(name string) *framework.NodeInfo { return v.byName[name] }

// Assume adds pod to node (a copy with spec.nodeName set is stored).
func (v *View) Assume(pod *v1.Pod, node string) error {
	p := pod.DeepCopy()
	p.Spec.NodeName = node
	info, err := framework.NewPodInfo(p)
	if err != nil {
		return fmt.Errorf("pod %s: %w", klog.KObj(pod), err)
	}
	return v.assumeInfo(info, node)
}

// assumeInfo adds a parsed pod to node. The pod's spec.nodeName must be node.
func (v *View) assumeInfo(info *framework.PodInfo, node string) error {
	ni := v.writable(node)
	if ni == nil {
		return fmt.Errorf("node %s is not in the view", node)
	}
	ni.AddPodInfo(info)
	v.ownPVCRefs()
	for key := range framework.PodPVCKeys(info.Pod) {
		v.pvcRefs[key]++
	}
	v.assumed = append(v.assumed, assumedPod{pod: info.Pod, node: node})
	v.dirty = true
	return nil
}

type assumedPod struct {
	pod  *v1.Pod
	node string
}

// Forget takes back the pod assumed last.
func (v *View) Forget(logger klog.Logger) error {
	if len(v.assumed) == 0 {
		return fmt.Errorf("no assumed pod to forget")
	}
	a := v.assumed[len(v.assumed)-1]
	v.assumed = v.assumed[:len(v.assumed)-1]
	if err := v.writable(a.node).RemovePod(logger, a.pod); err != nil {
		return fmt.Errorf("forget pod %s: %w", klog.KObj(a.pod), err)
	}
	v.ownPVCRefs()
	for key := range framework.PodPVCKeys(a.pod) {
		if v.pvcRefs[key]--; v.pvcRefs[key] <= 0 {
			delete(v.pvcRefs, key)
		}
	}
	v.dirty = true
	return nil
}

// Assumed is how many pods Assume added and Forget did not take back.
func (v *View) Assumed() int { return len(v.assumed) }

func (v *View) rebuildLists() {
	if !v.dirty {
		return
	}
	v.withAffinity, v.withRequiredAnti, v.withWide = v.withAffinity[:0], v.withRequiredAnti[:0], v.withWide[:0]
	for _, ni := range v.nodes {
		if len(ni.GetPodsWithAffinity()) > 0 {
			v.withAffinity = append(v.withAffinity, ni)
		}
		if len(ni.GetPodsWithRequiredAntiAffinity()) > 0 {
			v.withRequiredAnti = append(v.withRequiredAnti, ni)
		}
		if len(ni.GetPodsWithRequiredNonHostScopedAntiAffinity()) > 0 {
			v.withWide = append(v.withWide, ni)
		}
	}
	v.dirty = false
}

// NodeInfos implements fwk.SharedLister.
func (v *View) NodeInfos() fwk.NodeInfoLister { return nodeInfoLister{v} }

// StorageInfos implements fwk.SharedLister.
func (v *View) StorageInfos() fwk.StorageInfoLister { return storageInfoLister{v} }

// PodGroupStates implements fwk.SharedLister. The framework's gang plugins are not run
// (tessera places gangs itself), so no pod group is known here.
func (v *View) PodGroupStates() fwk.PodGroupStateLister { return noPodGroupStates{} }

// PodGroups implements fwk.SharedLister.
func (v *View) PodGroups() fwk.PodGroupLister { return noPodGroups{} }

// CompositePodGroupStates implements fwk.SharedLister.
func (v *View) CompositePodGroupStates() fwk.CompositePodGroupStateLister {
	return noCompositeStates{}
}

// CompositePodGroups implements fwk.SharedLister.
func (v *View) CompositePodGroups() fwk.CompositePodGroupLister { return noComposites{} }

type nodeInfoLister struct{ v *View }

func (l nodeInfoLister) List() ([]fwk.NodeInfo, error) { return l.v.nodes, nil }

func (l nodeInfoLister) HavePodsWithAffinityList() ([]fwk.NodeInfo, error) {
	l.v.rebuildLists()
	return l.v.withAffinity, nil
}

func (l nodeInfoLister) HavePodsWithRequiredAntiAffinityList() ([]fwk.NodeInfo, error) {
	l.v.rebuildLists()
	return l.v.withRequiredAnti, nil
}

func (l nodeInfoLister) HavePodsWithRequiredNonHostScopedAntiAffinityList() ([]fwk.NodeInfo, error) {
	l.v.rebuildLists()
	return l.v.withWide, nil
}

func (l nodeInfoLister) Get(name string) (fwk.NodeInfo, error) {
	if ni := l.v.byName[name]; ni != nil {
		return ni, nil
	}
	return nil, fmt.Errorf("nodeinfo not found for node name %q", name)
}

type storageInfoLister struct{ v *View }

func (l storageInfoLister) IsPVCUsedByPods(key string) bool { return l.v.pvcRefs[key] > 0 }

type (
	noPodGroups       struct{}
	noPodGroupStates  struct{}
	noComposites      struct{}
	noCompositeStates struct{}
)

func notFound(namespace, name string) error {
	return fmt.Errorf("pod group %s/%s: %w", namespace, name, fwk.ErrNotFound)
}

func (noPodGroups) Get(namespace, name string) (*schedulingv1beta1.PodGroup, error) {
	return nil, notFound(namespace, name)
}

func (noPodGroupStates) Get(namespace, name string) (fwk.PodGroupState, error) {
	return nil, notFound(namespace, name)
}

func (noComposites) Get(namespace, name string) (*schedulingv1alpha3.CompositePodGroup, error) {
	return nil, notFound(namespace, name)
}

func (noCompositeStates) Get(namespace, name string) (fwk.CompositePodGroupState, error) {
	return nil, notFound(namespace, name)
}
