package scheduler_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/decide"
)

// reapTerminating stands in for the kubelet: pods being deleted are removed at once.
func (e *env) reapTerminating() {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	e.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			list, err := e.kube.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, p := range list.Items {
				if p.DeletionTimestamp != nil {
					_ = e.kube.CoreV1().Pods(e.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				}
			}
			return false, nil
		})
	}()
}

// TestReclaimGivesQuotaBack: qb borrows qa's idle quota (16 of 16 GPUs with quota 8). When qa
// submits a gang within its quota, qb's newest borrowing gang is evicted, never the one within
// qb's quota, and qa's gang binds.
func TestReclaimGivesQuotaBack(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	e.addNode("b", 8, false, nil)
	qa := e.addQueue("qa", "", "8", "", 1)
	qb := e.addQueue("qb", "", "8", "", 1)
	e.reapTerminating()
	e.startScheduler(defaultOptions())
	b1 := e.gang("b1", qb, 8, gpuClaim)
	e.waitBound(b1, 60*time.Second)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have a resolution of one second
	b2 := e.gang("b2", qb, 8, gpuClaim)
	e.waitBound(b2, 60*time.Second)
	e.markRunning()
	waitQueueGPU(t, e, qb, "16")

	a1 := e.gang("a1", qa, 8, gpuClaim)
	e.waitBound(a1, 60*time.Second)
	all := e.pods()
	for _, p := range b1 {
		if all[p.Name] == nil || all[p.Name].Spec.NodeName == "" {
			t.Fatalf("pod %s of qb's gang within quota was evicted", p.Name)
		}
	}
	for _, p := range b2 {
		if all[p.Name] != nil {
			t.Fatalf("pod %s of the borrowing gang survived", p.Name)
		}
	}
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PodGroup,involvedObject.name=b2,reason=" + decide.ReasonReclaimed})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no Reclaimed event on b2 (err %v)", err)
	}
	e.checkClaims()
	waitQueueGPU(t, e, qa, "8")
	waitQueueGPU(t, e, qb, "8")
}
