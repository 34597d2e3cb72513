package deployments_test

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/draplugin/sharing"
)

// TestNodeAgentManagesOnlyItsDaemonPods: with the chart's RBAC and
// admission policy, the node agent's token (bound to node-a) may create and
// delete exactly what the kubelet plugin's PodLauncher makes: MPS daemon
// pods on node-a running tessera's image — not pods for another node, not
// another image or command, not pods of other kinds, and not another
// node's daemon pods.
func TestNodeAgentManagesOnlyItsDaemonPods(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	// The daemon pods live in the node namespace, with the agents.
	nodeNS := nodeNamespace(ns)
	user := "system:serviceaccount:" + nodeNS + ":" + prefix + "-node"
	onA := impersonate(t, c.cp, user, map[string][]string{nodeNameExtra: {"node-a"}}).CoreV1().Pods(nodeNS)
	noNode := impersonate(t, c.cp, user, nil).CoreV1().Pods(nodeNS)
	ds := typed(t, render(t, ns, "{fullnameOverride: "+prefix+"}"), "DaemonSet", "", &appsv1.DaemonSet{})
	image := ds.Spec.Template.Spec.Containers[0].Image

	daemonPod := func(id, node string) *corev1.Pod {
		l := &sharing.PodLauncher{Namespace: nodeNS, NodeName: node, Image: image, MPSDir: "/run/tessera/mps", RuntimeClassName: "", HostDriverRoot: "/"}
		spec := sharing.DaemonSpec{ID: id, Claim: "team/c", Devices: []string{"GPU-1"}, PinnedMemoryMiB: []int64{1024}}
		return l.Pod(spec, sharing.DirsOf(l.MPSDir, id))
	}
	waitForPolicy(t, func() error {
		_, err := onA.Create(ctx, daemonPod("probe", "node-b"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}, "bound to its own node")

	own, err := onA.Create(ctx, daemonPod("c1", "node-a"), metav1.CreateOptions{})
	wantAllowed(t, "node-a agent creates its claim's daemon pod", err)
	_, err = onA.Create(ctx, daemonPod("c2", "node-b"), metav1.CreateOptions{})
	wantForbidden(t, "node-a agent creates a daemon pod on node-b", err, "bound to its own node")
	_, err = noNode.Create(ctx, daemonPod("c3", "node-a"), metav1.CreateOptions{})
	wantForbidden(t, "agent token without a node", err, "names no node")
	evil := daemonPod("c4", "node-a")
	evil.Spec.Containers[0].Image = "registry.example.com/evil"
	_, err = onA.Create(ctx, evil, metav1.CreateOptions{})
	wantForbidden(t, "a daemon pod with another image", err, "tessera's image")
	evil = daemonPod("c5", "node-a")
	evil.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "nsenter -t 1 -m"}
	_, err = onA.Create(ctx, evil, metav1.CreateOptions{})
	wantForbidden(t, "a daemon pod with another command", err, "tessera-node mps-daemon")
	plain := daemonPod("c6", "node-a")
	delete(plain.Labels, sharing.LabelComponent)
	_, err = onA.Create(ctx, plain, metav1.CreateOptions{})
	wantForbidden(t, "a pod that is not a daemon pod", err, "may only create and delete MPS daemon pods")

	other, err := c.client.CoreV1().Pods(nodeNS).Create(ctx, daemonPod("c7", "node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("admin creates node-b's daemon pod (the policy must not apply to others): %v", err)
	}
	wantForbidden(t, "node-a agent deletes node-b's daemon pod", onA.Delete(ctx, other.Name, metav1.DeleteOptions{}), "bound to its own node")
	if own != nil {
		wantAllowed(t, "node-a agent deletes its own daemon pod", onA.Delete(ctx, own.Name, metav1.DeleteOptions{}))
	}
	_ = c.client.CoreV1().Pods(nodeNS).Delete(ctx, other.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
}

// TestNodePluginWritesClaimStatus: the node plugin's token may write its
// driver's status.devices entries of a claim allocated on its node (the
// applied MPS limits), and nothing else of the claim's status.
func TestNodePluginWritesClaimStatus(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	user := "system:serviceaccount:" + nodeNamespace(ns) + ":" + prefix + "-node"
	claimNS := c.cp.CreateNamespace(t)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "share", Namespace: claimNS},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "s", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "shared.gpu.tessera.dev"},
		}}}},
	}
	claim, err := c.client.ResourceV1().ResourceClaims(claimNS).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Request: "s", Driver: "gpu.tessera.dev", Pool: "node-a", Device: "gpu-2"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}},
		}}}},
	}
	if claim, err = c.client.ResourceV1().ResourceClaims(claimNS).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	withStatus := func(driver string) *resourceapi.ResourceClaim {
		cl := claim.DeepCopy()
		cl.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: driver, Pool: "node-a", Device: "gpu-2",
			Data: &runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"SharingStatus","strategy":"MPS"}`)}}}
		return cl
	}
	onB := impersonate(t, c.cp, user, map[string][]string{nodeNameExtra: {"node-b"}}).ResourceV1().ResourceClaims(claimNS)
	_, err = onB.UpdateStatus(ctx, withStatus("gpu.tessera.dev"), metav1.UpdateOptions{})
	wantForbidden(t, "node-b's plugin writes the status of a claim on node-a", err, "resourceclaims/driver")
	onA := impersonate(t, c.cp, user, map[string][]string{nodeNameExtra: {"node-a"}}).ResourceV1().ResourceClaims(claimNS)
	_, err = onA.UpdateStatus(ctx, withStatus("gpu.nvidia.com"), metav1.UpdateOptions{})
	wantForbidden(t, "node-a's plugin writes another driver's entry", err, "resourceclaims/driver")
	moved := claim.DeepCopy()
	moved.Status.Allocation.Devices.Results[0].Device = "gpu-3"
	_, err = onA.UpdateStatus(ctx, moved, metav1.UpdateOptions{})
	wantForbidden(t, "node-a's plugin changes the allocation", err, "resourceclaims/binding")
	updated, err := onA.UpdateStatus(ctx, withStatus("gpu.tessera.dev"), metav1.UpdateOptions{})
	wantAllowed(t, "node-a's plugin writes its driver's status.devices", err)
	if updated != nil && len(updated.Status.Devices) != 1 {
		t.Errorf("status.devices = %+v", updated.Status.Devices)
	}
}
