package filters

import (
	"sort"

	fwk "k8s.io/kube-scheduler/framework"

	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// NewSharedView returns a view of nodes (sorted by node name, each with its bound pods
// added) and pvcRefs (per "namespace/name", how many of those pods use the PVC) without
// copying them: the view copies a node's NodeInfo the first time Assume or Forget changes
// it (with the kube-scheduler's own NodeInfo.SnapshotConcrete), and pvcRefs likewise, so
// the caller may hand the same NodeInfos to the views of several cycles as long as it never
// changes them itself. Building a View from scratch parses and adds every bound pod of the
// cluster; this is how an incremental snapshot avoids that when few pods changed.
func NewSharedView(nodes []*framework.NodeInfo, pvcRefs map[string]int) *View {
	v := &View{
		nodes:     make([]fwk.NodeInfo, len(nodes)),
		byName:    make(map[string]*framework.NodeInfo, len(nodes)),
		pvcRefs:   pvcRefs,
		dirty:     true,
		shared:    true,
		pvcShared: true,
		owned:     map[string]bool{},
	}
	for i, ni := range nodes {
		v.nodes[i] = ni
		v.byName[ni.Node().Name] = ni
	}
	if v.pvcRefs == nil {
		v.pvcRefs = map[string]int{}
		v.pvcShared = false
	}
	return v
}

// writable returns the node's NodeInfo, copied first when it is shared; nil when the node
// is not in the view.
func (v *View) writable(node string) *framework.NodeInfo {
	ni := v.byName[node]
	if ni == nil || !v.shared || v.owned[node] {
		return ni
	}
	clone := ni.SnapshotConcrete()
	v.byName[node] = clone
	i := sort.Search(len(v.nodes), func(i int) bool { return v.nodes[i].Node().Name >= node })
	v.nodes[i] = clone
	v.owned[node] = true
	v.dirty = true
	return clone
}

// ownPVCRefs copies pvcRefs before the view changes it, when it is shared.
func (v *View) ownPVCRefs() {
	if !v.pvcShared {
		return
	}
	own := make(map[string]int, len(v.pvcRefs))
	for k, n := range v.pvcRefs {
		own[k] = n
	}
	v.pvcRefs = own
	v.pvcShared = false
}
