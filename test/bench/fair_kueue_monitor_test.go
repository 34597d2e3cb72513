package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestKueueShape: at every size the pair exercises borrowing and its limit — queue a is
// admitted beyond its nominal quota, and the next job of a would pass its limit although
// the cluster still has room for it — and b stays within its own quota.
func TestKueueShape(t *testing.T) {
	for _, nodes := range []int{5, 50, 100, 1000} {
		s := kueueShapeFor(nodes)
		a, b := int64(s.expected["a"]*kueueJobPods), int64(s.expected["b"]*kueueJobPods)
		switch {
		case a <= s.nominal:
			t.Errorf("%d nodes: a admitted %d GPUs, not beyond its nominal %d: no borrowing", nodes, a, s.nominal)
		case a > s.limit() || a+kueueJobPods <= s.limit():
			t.Errorf("%d nodes: a admitted %d GPUs, its limit %d must stop the next job of %d", nodes, a, s.limit(), kueueJobPods)
		case a+b+kueueJobPods > s.gpus:
			t.Errorf("%d nodes: %d of %d GPUs admitted: capacity, not the limit, would stop a", nodes, a+b, s.gpus)
		case b > s.nominal || s.expected["b"] != s.demand["b"]:
			t.Errorf("%d nodes: b admitted %d of %d jobs (%d GPUs, nominal %d)", nodes, s.expected["b"], s.demand["b"], b, s.nominal)
		case len(s.order) != s.demand["a"]+s.demand["b"]:
			t.Errorf("%d nodes: %d jobs in order, demand %v", nodes, len(s.order), s.demand)
		}
	}
}

func monitorJob(name, queue string, suspended bool) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{benchQueueLabel: queue}},
		Spec:       batchv1.JobSpec{Parallelism: ptr.To(int32(kueueJobPods)), Suspend: ptr.To(suspended)},
	}
}

func monitorPod(name, job, queue, node string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{benchQueueLabel: queue, gangLabel: job}},
		Spec:       v1.PodSpec{NodeName: node},
	}
}

// waitMonitor waits until the monitor's result satisfies ok.
func waitMonitor(t *testing.T, m *quotaMonitor, what string, ok func(quotaResult) bool) quotaResult {
	t.Helper()
	var r quotaResult
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		r = m.result()
		return ok(r), nil
	}); err != nil {
		t.Fatalf("%s: monitor shows %+v", what, r)
	}
	return r
}

// TestQuotaMonitorKueueAdmission: with suspended jobs, admission is unsuspending; a job
// admitted beyond the queue's limit is a violation at once, before any pod exists, and
// a job suspended again gives its GPUs back.
func TestQuotaMonitorKueueAdmission(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset()
	s := kueueShapeFor(5) // nominal 20, borrowing 10: limit 30 GPUs, 7 jobs of 4
	m := newQuotaMonitor(t, kube, "ns", s, true)
	defer m.stop()
	for i := 0; i < s.expected["a"]+1; i++ {
		if _, err := kube.BatchV1().Jobs("ns").Create(ctx, monitorJob(fmt.Sprintf("a%04d", i), "a", true), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < s.expected["a"]; i++ {
		if _, err := kube.BatchV1().Jobs("ns").Update(ctx, monitorJob(fmt.Sprintf("a%04d", i), "a", false), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r := waitMonitor(t, m, "7 jobs admitted", func(r quotaResult) bool { return r.admitted["a"] == s.expected["a"] })
	if r.violations != 0 || r.lastAdmit.IsZero() {
		t.Fatalf("within the limit: %+v", r)
	}
	over := fmt.Sprintf("a%04d", s.expected["a"])
	if _, err := kube.BatchV1().Jobs("ns").Update(ctx, monitorJob(over, "a", false), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r = waitMonitor(t, m, "the 8th job admitted", func(r quotaResult) bool { return r.violations > 0 })
	if !strings.Contains(r.first, "queue a admitted 32 GPUs, limit 30") {
		t.Errorf("violation = %q", r.first)
	}
	// Evicted (suspended again): back within the limit, no new violation.
	if _, err := kube.BatchV1().Jobs("ns").Update(ctx, monitorJob(over, "a", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r = waitMonitor(t, m, "the 8th job suspended again", func(r quotaResult) bool { return r.admitted["a"] == s.expected["a"] })
	if r.violations != 1 {
		t.Errorf("violations = %d, want 1", r.violations)
	}
}

// TestQuotaMonitorBinding: pods bound count against their queue whatever admitted them,
// and the cohort as a whole may not pass the sum of the nominal quotas; without suspended
// jobs (tessera) a job is admitted when all its pods are bound.
func TestQuotaMonitorBinding(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset()
	s := kueueShapeFor(5)
	m := newQuotaMonitor(t, kube, "ns", s, false)
	defer m.stop()
	bind := func(job, queue string, pods int) {
		for i := 0; i < pods; i++ {
			if _, err := kube.CoreV1().Pods("ns").Create(ctx, monitorPod(fmt.Sprintf("%s-%d", job, i), job, queue, "n00000"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An unbound pod counts for nothing.
	if _, err := kube.CoreV1().Pods("ns").Create(ctx, monitorPod("pending", "b0009", "b", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind("a0000", "a", kueueJobPods-1)
	r := waitMonitor(t, m, "3 pods bound", func(r quotaResult) bool { return r.bound == kueueJobPods-1 })
	if r.admitted["a"] != 0 {
		t.Fatalf("a gang with a pod left is not admitted: %+v", r)
	}
	if _, err := kube.CoreV1().Pods("ns").Create(ctx, monitorPod("a0000-3", "a0000", "a", "n00001"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r = waitMonitor(t, m, "the gang bound", func(r quotaResult) bool { return r.admitted["a"] == 1 })
	if r.violations != 0 || r.maxGPUs["a"] != kueueJobPods {
		t.Fatalf("one gang: %+v", r)
	}
	// a up to its limit (30 → 7 jobs = 28), b to 12: the cohort's 40 is not passed.
	for j := 1; j < 7; j++ {
		bind(fmt.Sprintf("a%04d", j), "a", kueueJobPods)
	}
	for j := 0; j < 3; j++ {
		bind(fmt.Sprintf("b%04d", j), "b", kueueJobPods)
	}
	r = waitMonitor(t, m, "a 28, b 12", func(r quotaResult) bool { return r.bound == 40 })
	if r.violations != 0 {
		t.Fatalf("40 of 40 in the cohort is no violation: %s", r.first)
	}
	bind("b0003", "b", 1)
	r = waitMonitor(t, m, "one more in b", func(r quotaResult) bool { return r.violations > 0 })
	if !strings.Contains(r.first, "cohort bound 41 GPUs, nominal quotas 40") {
		t.Errorf("violation = %q", r.first)
	}
}
