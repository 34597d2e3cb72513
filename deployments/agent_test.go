package deployments_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestNodeAgentRunsWithChartAccess runs the real node agent (mock DGX H100,
// the chart's partition config with dynamic MIG and shared GPUs) with
// nothing but the chart's RBAC and admission policy, as its service account
// with a node-bound token: least privilege that still does the job, feature
// probes, the slice controller's list/watch and writes included.
func TestNodeAgentRunsWithChartAccess(t *testing.T) {
	c := getCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	nodeName := framework.UniqueName("gpu-node")
	node, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	user := "system:serviceaccount:" + ns + ":" + prefix + "-node"
	onNode := impersonate(t, c.cp, user, map[string][]string{nodeNameExtra: {nodeName}})

	// The agent's first writes must meet the policy, so wait until it is in
	// force (a slice for another node is refused).
	waitForPolicy(t, func() error {
		_, err := onNode.ResourceV1().ResourceSlices().Create(ctx, slice(prefix+"-x", "elsewhere"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}, "may only write ResourceSlices")

	r := render(t, ns, `node: {partition: {default: {gpus: [{indices: [0, 1], mode: dynamicMIG}, {indices: [2, 3], mode: shared}, {mode: whole}]}}}`)
	cfg, err := partition.Parse([]byte(typedConfigMap(t, r)))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvmlbackend.Open(nvmlbackend.MockPrefix + "dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Options{KubeClient: onNode, NodeName: nodeName, NVML: lib, Config: cfg, ResyncPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("agent: %v", err)
		}
	}()

	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			done <- err
			return false, errors.New("agent stopped early")
		default:
		}
		return a.Ready(), nil
	})
	if err != nil {
		t.Fatalf("agent not ready with the chart's access: %v", err)
	}
	counts := a.Counts()
	if counts.Whole == 0 || counts.MIG == 0 || counts.Shared == 0 {
		t.Errorf("agent publishes %+v; want whole, MIG and shared devices", counts)
	}
	if f := a.Features(); !f.PartitionableDevices || !f.ConsumableCapacity || !f.DeviceTaints {
		t.Errorf("feature probes under the chart's access found %+v, want all features of this cluster", f)
	}
	// Its slices are there, for its node, with every device it counted.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String(),
		})
		if err != nil {
			return false, err
		}
		n := 0
		for _, s := range list.Items {
			n += len(s.Spec.Devices)
		}
		return n == counts.Whole+counts.MIG+counts.Shared, nil
	})
	if err != nil {
		t.Errorf("slices of %s do not hold the %+v devices: %v", nodeName, counts, err)
	}
	// No publish error was reported (the agent records them as events).
	evs, err := c.client.CoreV1().Events("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", nodeName).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeWarning {
			t.Errorf("agent warning under the chart's access: %s: %s", e.Reason, e.Message)
		}
	}
}
