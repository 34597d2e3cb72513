package scheduler

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// markPodsUnschedulable sets PodScheduled=False on the gang's waiting pods with the gang's
// reason, as the kube-scheduler does for its pods, so that `kubectl describe pod` and tools
// reading pod conditions see why a pod waits. Pods that already say so are not written.
func (s *Scheduler) markPodsUnschedulable(ctx context.Context, g *gangState) {
	logger := klog.FromContext(ctx)
	msg := fmt.Sprintf("gang %s: %s: %s", g.key, g.reason, g.message)
	for _, p := range g.pending {
		if c := podCondition(p, v1.PodScheduled); c != nil && c.Status == v1.ConditionFalse && c.Message == msg {
			continue
		}
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{{
			Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable,
			Message: msg, LastTransitionTime: metav1.Now(),
		}}}})
		if err != nil {
			continue
		}
		if _, err := s.kube.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			logger.V(2).Info("Could not set PodScheduled on pod", "pod", klog.KObj(p), "err", err)
		}
	}
}

func podCondition(p *v1.Pod, t v1.PodConditionType) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
