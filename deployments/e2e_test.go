package deployments_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestChartEndToEnd installs what the chart installs (access control,
// DeviceClasses, the example queues), runs both binaries with the chart's
// flags and service accounts, a simulated kubelet on a simulated DGX H100,
// and applies the whole-GPU, MIG and CEL-selector examples unchanged: each
// pod is scheduled by tessera-scheduler under its queue, prepared by the
// kubelet DRA plugin over its real socket (the plugin reads the claim with
// its get-only access) and runs; deleting the pods unprepares the claims.
func TestChartEndToEnd(t *testing.T) {
	c := getCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")

	r := render(t, ns, "")
	for _, dc := range ofKind(r, "DeviceClass") {
		obj := dc.DeepCopy()
		if _, err := c.resource(t, c.dyn, obj, "").Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	examples := exampleObjects(t)
	for _, q := range examples["08-queues.yaml"] {
		if q.GetKind() == "Queue" {
			c.create(t, q, "")
		}
	}

	nodeName := framework.UniqueName("dgx")
	dir := nodeDir(t)
	kubelet := simkubelet.New(simkubelet.Options{NodeName: nodeName, Client: c.client, RegistryDir: filepath.Join(dir, "reg")})
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := kubelet.Run(ctx); err != nil {
			t.Errorf("simulated kubelet: %v", err)
		}
	})
	defer wg.Wait()
	defer cancel()
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })

	startNode(t, c, ns, prefix, nodeName, `{partition: {default: {gpus: [{indices: [0, 1, 2, 3], mode: dynamicMIG}, {mode: whole}]}}}`, dir)
	sched := startScheduler(t, c, ns, prefix)

	var pods []string
	for _, file := range []string{"01-whole-gpu.yaml", "02-mig-1g.yaml", "05-cel-selector.yaml"} {
		for _, obj := range examples[file] {
			c.create(t, obj, ns)
			if obj.GetKind() == "Pod" {
				pods = append(pods, obj.GetName())
			}
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := sched.running(); err != nil {
			return false, err
		}
		for _, name := range pods {
			p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("example pods not running: %v", err)
		dumpScheduling(t, c, ns)
		t.FailNow()
	}
	specs, _ := filepath.Glob(filepath.Join(dir, "cdi", "*"))
	if len(specs) < len(pods) {
		t.Errorf("%d CDI specs for %d prepared pods", len(specs), len(pods))
	}
	claims, err := c.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			t.Errorf("claim %s is not allocated", cl.Name)
			continue
		}
		for _, res := range cl.Status.Allocation.Devices.Results {
			t.Logf("claim %s: %s/%s (request %s)", cl.Name, res.Pool, res.Device, res.Request)
		}
	}

	// Deleting the pods unprepares their claims: the claims' CDI specs go
	// (the driver's base spec, written at start, stays).
	for _, name := range pods {
		if err := c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		claims, err := filepath.Glob(filepath.Join(dir, "cdi", "*-claim_*.json"))
		return err == nil && len(claims) == 0, nil
	})
	if err != nil {
		t.Errorf("CDI specs left after the pods were deleted: %v", err)
	}
}
