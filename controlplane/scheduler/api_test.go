package scheduler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// TestQueueValidation: the CRD rejects a negative quota, a limit below quota and a queue that
// is its own parent; longer parent loops (which CRD validation cannot see) get Valid=False
// from the scheduler, and a gang in such a queue waits with QueueResolved=False.
func TestQueueValidation(t *testing.T) {
	e := newEnv(t)
	mk := func(name, parent, quota, limit string) *v1alpha1.Queue {
		q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: e.id + "-" + name}, Spec: v1alpha1.QueueSpec{Parent: parent}}
		rq := &v1alpha1.ResourceQuota{}
		if quota != "" {
			rq.Quota = ptr.To(mustQuantity(quota))
		}
		if limit != "" {
			rq.Limit = ptr.To(mustQuantity(limit))
		}
		q.Spec.Resources.GPU = rq
		return q
	}
	for _, tc := range []struct {
		q    *v1alpha1.Queue
		want string
	}{
		{mk("neg", "", "-1", ""), "quota must not be negative"},
		{mk("below", "", "8", "4"), "limit must not be below quota"},
		{mk("self", e.id+"-self", "", ""), "spec.parent must not name the queue itself"},
	} {
		_, err := e.sc.Queues().Create(e.ctx, tc.q)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create %s: err = %v, want %q", tc.q.Name, err, tc.want)
			if err == nil {
				_ = e.sc.Queues().Delete(e.ctx, tc.q.Name)
			}
		}
	}
	bad := mk("weight", "", "1", "")
	bad.Spec.Resources.GPU.OverQuotaWeight = ptr.To(int32(-1))
	if _, err := e.sc.Queues().Create(e.ctx, bad); err == nil {
		t.Error("negative overQuotaWeight accepted")
	}

	a := e.addQueue("loop-a", "loop-b", "", "", 1)
	e.addQueue("loop-b", "loop-a", "", "", 1)
	e.addNode("n", 8, false, nil)
	e.gang("g", a, 1, gpuClaim)
	e.startScheduler(defaultOptions())
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		q, err := e.sc.Queues().Get(ctx, a)
		if err != nil {
			return false, nil
		}
		for _, c := range q.Status.Conditions {
			if c.Type == v1alpha1.QueueConditionValid && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonParentLoop {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal("queue in a parent loop never got Valid=False/ParentLoop")
	}
	c := e.waitCondition("g", v1alpha1.PodGroupConditionQueueResolved, metav1.ConditionFalse, nil)
	if c.Reason != v1alpha1.ReasonQueueInvalid || !strings.Contains(c.Message, "parent loop") {
		t.Fatalf("QueueResolved = %+v", c)
	}
}
