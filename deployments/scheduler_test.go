package deployments_test

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestSchedulerBinaryRunsWithChartAccess runs the tessera-scheduler binary
// with the chart's flags and nothing but the chart's RBAC and admission
// policy (a kubeconfig that impersonates its service account), and has it
// place a two-pod Job as one gang: leader election in the release namespace,
// feature probes, the catalog's informers, the claim finalizer, the
// allocation (resourceclaims/binding) and the binding all pass.
func TestSchedulerBinaryRunsWithChartAccess(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")

	// Cluster objects the scheduler needs: the chart's DeviceClasses, a GPU
	// node with its slice, a queue.
	r := render(t, ns, "")
	for _, dc := range ofKind(r, "DeviceClass") {
		obj := dc.DeepCopy()
		_, err := c.resource(t, c.dyn, obj, "").Create(ctx, obj, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	nodeName := framework.UniqueName("gpu-node")
	node, err := c.client.CoreV1().Nodes().Create(ctx, fixture.Node(nodeName, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })
	node.Status = fixture.Node(nodeName, nil).Status
	if node, err = c.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server taints new nodes not-ready; no kubelet here lifts it.
	node.Spec.Taints = nil
	if _, err := c.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range fixture.WholeGPUSlices(nodeName, 2) {
		s.UID = ""
		if _, err := c.client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.client.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
	queue := framework.UniqueName("q")
	c.create(t, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.tessera.dev/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": queue},
		"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "2", "limit": "2"}}},
	}}, "")

	sched := startScheduler(t, c, ns, prefix)

	// A Job of two pods with one GPU each, in the queue: one gang.
	if _, err := c.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: contract.ClassGPU}}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Labels: map[string]string{"tessera.dev/queue": queue}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](2), Completions: ptr.To[int32](2),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				SchedulerName: "tessera-scheduler",
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
						Claims:   []corev1.ResourceClaim{{Name: "gpu"}},
					},
				}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}},
			}},
		},
	}
	if _, err := c.client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 40*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := sched.running(); err != nil {
			return false, err
		}
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		bound := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == nodeName {
				bound++
			}
		}
		return bound == 2, nil
	})
	if err != nil {
		t.Errorf("the Job's pods were not bound with the chart's access: %v", err)
		dumpScheduling(t, c, ns)
		t.FailNow()
	}
	claims, err := c.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocated := 0
	for _, cl := range claims.Items {
		if cl.Status.Allocation != nil && len(cl.Status.ReservedFor) == 1 {
			allocated++
		}
	}
	if allocated != 2 {
		t.Errorf("%d of %d claims allocated and reserved, want 2", allocated, len(claims.Items))
	}
	if _, err := c.client.CoordinationV1().Leases(ns).Get(ctx, prefix+"-scheduler", metav1.GetOptions{}); err != nil {
		t.Errorf("leader election lease in the release namespace: %v", err)
	}
}

// dumpScheduling logs why pods wait: PodGroups, pod conditions, events.
func dumpScheduling(t *testing.T, c *cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	pgs, err := c.dyn.Resource(podGroupsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, pg := range pgs.Items {
			t.Logf("PodGroup %s: spec %v status %v", pg.GetName(), pg.Object["spec"], pg.Object["status"])
		}
	}
	if pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			t.Logf("Pod %s: node %q conditions %v", p.Name, p.Spec.NodeName, p.Status.Conditions)
		}
	}
	if evs, err := c.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			t.Logf("Event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

var podGroupsGVR = schema.GroupVersionResource{Group: "scheduling.tessera.dev", Version: "v1alpha1", Resource: "podgroups"}
