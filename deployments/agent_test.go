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
	user := "system:serviceaccount:" + nodeNamespace(ns) + ":" + prefix + "-node"
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

// TestDaemonSetTargetsGPUNodes creates the chart's DaemonSet for real: the
// DaemonSet controller creates a pod for the labelled, tainted GPU node and
// none for a plain node.
func TestDaemonSetTargetsGPUNodes(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	gpuNode, plainNode := framework.UniqueName("gpu"), framework.UniqueName("cpu")
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: gpuNode, Labels: map[string]string{"nvidia.com/gpu.present": "true"}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: plainNode}},
	} {
		taints := n.Spec.Taints
		created, err := c.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.client.CoreV1().Nodes().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
		})
		// Ready, so that the controller considers the node.
		created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		if created, err = c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The API server taints new nodes not-ready; no kubelet lifts it.
		created.Spec.Taints = taints
		if _, err := c.client.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r := render(t, ns, "{fullnameOverride: "+prefix+"}")
	for _, kind := range []string{"ConfigMap", "DaemonSet"} {
		for _, obj := range ofKind(r, kind) {
			c.create(t, obj, ns)
		}
	}
	ns = nodeNamespace(ns) // where the DaemonSet and its pods are
	var targets []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		targets = nil
		for _, p := range pods.Items {
			// The controller pins each pod to its node by node affinity.
			if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
					for _, f := range term.MatchFields {
						targets = append(targets, f.Values...)
					}
				}
			}
		}
		return len(targets) > 0, nil
	})
	if err != nil {
		t.Fatalf("the DaemonSet controller created no pod: %v", err)
	}
	// Give the controller a moment to (wrongly) add a pod for the plain node.
	time.Sleep(2 * time.Second)
	pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || len(targets) != 1 || targets[0] != gpuNode {
		t.Errorf("DaemonSet pods = %d targeting %v, want exactly one, for %s (not %s)", len(pods.Items), targets, gpuNode, plainNode)
	}
}
