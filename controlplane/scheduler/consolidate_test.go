package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// replicaSet runs n pods of one GPU each (a ResourceClaimTemplate) in queue q; the
// kube-controller-manager's ReplicaSet controller recreates a pod that is evicted, and its
// resourceclaim controller makes each pod's claim. Each pod is a gang of one.
func (e *env) replicaSet(name, q string, n int32, mutate func(*v1.PodSpec)) {
	e.t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name + "-gpu"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: fixture.GPUClaim(e.ns, "x", 1).Spec},
	}
	if _, err := e.kube.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.ctx, tmpl, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	pod := fixture.Pod(e.ns, "x")
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(tmpl.Name)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	if mutate != nil {
		mutate(&pod.Spec)
	}
	labels := map[string]string{"app": name, v1alpha1.QueueLabel: q}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
	if _, err := e.kube.AppsV1().ReplicaSets(e.ns).Create(e.ctx, rs, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create ReplicaSet: %v", err)
	}
}

// podsOn waits until the ReplicaSet's pods (label app=name) are n, all bound, and returns
// their nodes by pod name.
func (e *env) waitReplicaSetBound(name string, n int, timeout time.Duration) map[string]string {
	e.t.Helper()
	var nodes map[string]string
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := e.kube.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false, nil
		}
		nodes = map[string]string{}
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			if p.Spec.NodeName == "" {
				return false, nil
			}
			nodes[p.Name] = p.Spec.NodeName
		}
		return len(nodes) == n, nil
	})
	if err != nil {
		e.t.Fatalf("ReplicaSet %s: %d pods bound (%v), want %d: %v", name, len(nodes), nodes, n, err)
	}
	return nodes
}

// TestConsolidationMovesRecreatedPods is the consolidation case on a control plane
// with the ReplicaSet and resourceclaim controllers: 4 nodes × 8 GPUs, each with four 1-GPU
// pods (those on the fourth node non-preemptible by their PriorityClass). A gang of 2 pods ×
// 8 GPUs does not fit although 16 GPUs are free; the scheduler moves the pods of two nodes
// (8, at most --consolidation-max-pods), their ReplicaSet recreates them and they run again
// on the other nodes, and the gang binds on the two freed nodes. No non-preemptible pod moves.
func TestConsolidationMovesRecreatedPods(t *testing.T) {
	e := newEnv(t)
	var nodes []string
	for _, n := range []string{"a", "b", "c", "d"} {
		nodes = append(nodes, e.addNode(n, 8, false, nil))
	}
	// Non-preemptible pods run only within quota: the queue's quota is the cluster.
	q := e.addQueue("q", "", "32", "", 1)
	protected := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: e.id + "-protected", Labels: map[string]string{v1alpha1.PreemptibleLabel: "false"}}, Value: 0}
	if _, err := e.kube.SchedulingV1().PriorityClasses().Create(e.ctx, protected, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.kube.SchedulingV1().PriorityClasses().Delete(context.Background(), protected.Name, metav1.DeleteOptions{})
	})
	e.reapTerminating()
	// --spread puts the 1-GPU pods on the emptiest nodes: four on each.
	opts := defaultOptions()
	opts.Solver = solver.Config{Spread: true}
	opts.ConsolidationMaxPods = 8
	e.startScheduler(opts)

	// The protected pods are pinned to the fourth node; the movable ones spread over the rest.
	e.replicaSet("protected", q, 4, func(s *v1.PodSpec) {
		s.PriorityClassName = protected.Name
		s.NodeSelector = map[string]string{"kubernetes.io/hostname": nodes[3]}
	})
	protectedAt := e.waitReplicaSetBound("protected", 4, 60*time.Second)
	e.replicaSet("movable", q, 12, nil)
	before := e.waitReplicaSetBound("movable", 12, 60*time.Second)
	perNode := map[string]int{}
	for _, n := range before {
		perNode[n]++
	}
	for _, n := range nodes[:3] {
		if perNode[n] != 4 {
			t.Fatalf("setup: movable pods per node %v, want 4 on each of %v", perNode, nodes[:3])
		}
	}
	e.markRunning()

	big := e.gang("big", q, 2, func(ns, name string) *resourceapi.ResourceClaim { return fixture.GPUClaim(ns, name, 8) })
	e.waitBound(big, 120*time.Second)
	all := e.pods()
	freed := map[string]bool{}
	for _, p := range big {
		freed[all[p.Name].Spec.NodeName] = true
	}
	if len(freed) != 2 || freed[nodes[3]] {
		t.Fatalf("big's pods on %v, want two of the nodes without protected pods", freed)
	}
	// The moved pods run again (recreated) elsewhere: 12 movable pods, none on big's nodes.
	after := e.waitReplicaSetBound("movable", 12, 60*time.Second)
	moved := 0
	for name, n := range after {
		if freed[n] {
			t.Errorf("movable pod %s runs on %s, given to big", name, n)
		}
		if before[name] == "" {
			moved++
		}
	}
	if moved != 8 {
		t.Errorf("%d movable pods were recreated, want the 8 of two nodes (before %v, after %v)", moved, before, after)
	}
	// No non-preemptible pod moved: the same four pods on the fourth node.
	now := e.waitReplicaSetBound("protected", 4, 10*time.Second)
	if fmt.Sprint(now) != fmt.Sprint(protectedAt) {
		t.Errorf("protected pods moved: before %v, after %v", protectedAt, now)
	}
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PodGroup,involvedObject.name=big,reason=" + decide.ReasonConsolidating})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no Consolidating event on big (err %v)", err)
	}
	e.checkClaims()
}
