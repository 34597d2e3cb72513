package scheduler

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// recover rolls back half-committed gangs: a claim reserved for one of this scheduler's pods
// that is not bound can only come from a commit that did not finish (a crash, a lost Lease).
// Its reservation is removed and, with no consumer left, its allocation. The gang is then
// placed again from scratch. It reads the API directly, not the informers, so that writes of a
// previous leader that the informers have not delivered yet are seen.
func (s *Scheduler) recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	pods, err := s.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	unbound := map[types.UID]*v1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.SchedulerName == s.opts.SchedulerName && p.Spec.NodeName == "" {
			unbound[p.UID] = p
		}
	}
	claims, err := s.kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list claims: %w", err)
	}
	rolledBack := 0
	for i := range claims.Items {
		c := &claims.Items[i]
		stale := false
		for _, r := range c.Status.ReservedFor {
			if r.Resource == "pods" && unbound[r.UID] != nil {
				stale = true
			}
		}
		if !stale {
			continue
		}
		if c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] == "true" {
			// An extended-resource claim of a pod that is not bound: the commit that created
			// it did not finish. The next placement creates a new one.
			(&committer{client: s.kube}).deleteClaim(ctx, c)
			rolledBack++
			continue
		}
		if err := releaseClaim(ctx, s.kube, c.Namespace, c.Name, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return r.Resource == "pods" && unbound[r.UID] != nil
		}); err != nil {
			return fmt.Errorf("roll back claim %s: %w", klog.KObj(c), err)
		}
		rolledBack++
		logger.Info("Rolled back a half-committed claim", "claim", klog.KObj(c))
	}
	logger.Info("State rebuilt from the API", "pods", len(pods.Items), "claims", len(claims.Items), "rolledBack", rolledBack)
	return nil
}
