package deployments_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/test/framework"
)

// TestNodeBinaryRunsWithChartAccess runs the tessera-node binary (agent,
// kubelet DRA plugin, device plugin) with the chart's flags and nothing but
// the chart's RBAC and admission policy, as its service account with a
// node-bound token: it publishes the node's devices, registers the kubelet
// plugin, reports ready and stops cleanly on SIGTERM.
func TestNodeBinaryRunsWithChartAccess(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	nodeName := framework.UniqueName("gpu-node")
	if _, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })

	node := startNode(t, c, ns, prefix, nodeName, `{partition: {default: {gpus: [{indices: [0, 1], mode: dynamicMIG}, {indices: [2, 3], mode: shared}, {mode: whole}]}}}`, "")

	// /readyz answers once the pool is handed to the ResourceSlice
	// controller, which writes the slices a moment later.
	devices := 0
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String(),
		})
		if err != nil {
			return false, err
		}
		devices = 0
		for _, s := range list.Items {
			devices += len(s.Spec.Devices)
		}
		return devices > 0, nil
	}); err != nil {
		t.Errorf("ready, but no device published for the node: %v", err)
	}
	if socks, _ := filepath.Glob(filepath.Join(node.dir, "reg", "*.sock")); len(socks) == 0 {
		t.Error("the kubelet plugin did not create its registration socket")
	}
	// SIGTERM, as the kubelet sends on a rolling update: a clean exit.
	if err := node.stop(20 * time.Second); err != nil {
		t.Errorf("tessera-node after SIGTERM: %v", err)
	}
}
