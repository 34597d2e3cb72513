package scheduler

import (
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// defaultMinCycleInterval is Options.MinCycleInterval's default.
const defaultMinCycleInterval = 50 * time.Millisecond

// maxSettle is the longest a cycle waits after the event that triggered it, to let a burst
// of events (a workload's pods, a claim and its pod) settle into one cycle.
const maxSettle = 10 * time.Millisecond

// cycleWait is how long the loop waits, after an event, before the next cycle; sinceStart is
// the time since the last cycle started. Cycles that events trigger start at least
// minInterval apart, so that a stream of events cannot keep the scheduler rebuilding
// snapshots, and never sooner than min(minInterval, maxSettle) after the event. A long cycle
// is not followed by a longer wait: a batch's next cycle starts soon after it.
func cycleWait(sinceStart, minInterval time.Duration) time.Duration {
	return max(min(minInterval, maxSettle), minInterval-sinceStart)
}

// relevantUpdate filters updates that cannot change a scheduling decision: node heartbeats,
// kubelet status updates of pods, and the status this scheduler writes itself to PodGroups and
// Queues. They would otherwise trigger a cycle each.
func relevantUpdate(old, cur any) bool {
	switch o := old.(type) {
	case *v1.Node:
		c := cur.(*v1.Node)
		return !equality.Semantic.DeepEqual(o.Labels, c.Labels) || !equality.Semantic.DeepEqual(o.Spec, c.Spec) ||
			!equality.Semantic.DeepEqual(o.Status.Allocatable, c.Status.Allocatable)
	case *v1.Pod:
		c := cur.(*v1.Pod)
		return o.Spec.NodeName != c.Spec.NodeName || o.Status.Phase != c.Status.Phase ||
			(o.DeletionTimestamp == nil) != (c.DeletionTimestamp == nil) ||
			!equality.Semantic.DeepEqual(o.Labels, c.Labels) || !equality.Semantic.DeepEqual(o.Annotations, c.Annotations) ||
			!equality.Semantic.DeepEqual(o.Status.ResourceClaimStatuses, c.Status.ResourceClaimStatuses)
	case *resourceapi.ResourceClaim:
		c := cur.(*resourceapi.ResourceClaim)
		return !equality.Semantic.DeepEqual(o.Status.Allocation, c.Status.Allocation) ||
			!equality.Semantic.DeepEqual(o.Status.ReservedFor, c.Status.ReservedFor) ||
			(o.DeletionTimestamp == nil) != (c.DeletionTimestamp == nil)
	case *v1.Namespace:
		return !equality.Semantic.DeepEqual(o.Labels, cur.(*v1.Namespace).Labels)
	case *v1alpha1.PodGroup:
		c := cur.(*v1alpha1.PodGroup)
		return o.Generation != c.Generation || !equality.Semantic.DeepEqual(o.Labels, c.Labels)
	case *v1alpha1.Queue:
		return o.Generation != cur.(*v1alpha1.Queue).Generation
	}
	return true
}

// addFreesCapacity: a new node, slice, class or queue may make a waiting gang fit; a new pod,
// claim, namespace or PodGroup does not.
func addFreesCapacity(obj any) bool {
	switch obj.(type) {
	case *v1.Pod, *resourceapi.ResourceClaim, *v1.Namespace, *v1alpha1.PodGroup:
		return false
	}
	return true
}

// updateFreesCapacity: a pod that finished, a claim that was deallocated, or any change of a
// node, slice, class or queue.
func updateFreesCapacity(old, cur any) bool {
	switch o := old.(type) {
	case *v1.Pod:
		c := cur.(*v1.Pod)
		return c.Status.Phase != o.Status.Phase && (c.Status.Phase == v1.PodSucceeded || c.Status.Phase == v1.PodFailed)
	case *resourceapi.ResourceClaim:
		c := cur.(*resourceapi.ResourceClaim)
		return o.Status.Allocation != nil && c.Status.Allocation == nil
	case *v1.Namespace, *v1alpha1.PodGroup:
		return false
	}
	return true
}
