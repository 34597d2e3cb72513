package realnode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
)

// runWholeGPU schedules a report pod with whole GPU index and waits until it runs.
func (e *env) runWholeGPU(name string, index int) (*corev1.Pod, *resourceapi.ResourceClaim) {
	e.t.Helper()
	claim := e.claim(name, request{class: contract.ClassGPU, selector: attr(contract.AttrIndex) + " == " + itoa(index)})
	pod, claim := e.schedule(e.pod(name, claim.Name, reportScript), claim, nil)
	e.waitRunning(pod)
	return pod, claim
}

// TestUnprepareRetriesWhilePluginDown: a pod deleted while tessera-node is
// down stays Terminating — the kubelet does not let it go before its claim
// is unprepared, and keeps trying — and goes once tessera-node is back,
// which unprepares the claim it prepared before.
func TestUnprepareRetriesWhilePluginDown(t *testing.T) {
	e := newEnv(t)
	pod, claim := e.runWholeGPU("down", 3)
	e.node.Plugin.Stop()

	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
		t.Fatal(err)
	}
	// The containers stop, but the pod object stays while the claim is prepared.
	e.waitFor("container of "+pod.Name+" stopped", time.Minute, func(ctx context.Context) (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated != nil, nil
	})
	// The kubelet retries with the pod worker's backoff (about 10s, growing).
	e.waitFor("the kubelet's third attempt to unprepare", 2*time.Minute, func(context.Context) (bool, error) {
		return e.unprepareFailures() >= 3, nil
	})
	if _, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, pod.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("pod %s went while its claim was still prepared and the plugin down: %v", pod.Name, err)
	}
	if _, held := e.checkpoint()[claim.UID]; !held {
		t.Fatalf("claim %s left the checkpoint while tessera-node was down", claim.Name)
	}

	p, err := e.node.StartPlugin(e.ctx, realnode.PluginOptions{Name: "tessera-node-2"})
	if err != nil {
		t.Fatal(err)
	}
	e.node.Plugin = p
	e.waitFor("pod "+pod.Name+" gone after the plugin came back", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if _, held := e.checkpoint()[claim.UID]; held {
		t.Errorf("claim %s still in the checkpoint after the pod went", claim.Name)
	}
	if n := e.claimOperations(p, "unprepare"); n != 1 {
		t.Errorf("the restarted tessera-node unprepared %d claims, want 1", n)
	}
	if files := e.claimSpecFiles(); len(files) != 0 {
		t.Errorf("claims' CDI specs left: %v", files)
	}
}

// unprepareFailures counts the kubelet's failed attempts to unprepare a
// pod's claims ("Error syncing pod" with "unprepare dynamic resources").
func (e *env) unprepareFailures() int {
	n := 0
	for _, line := range strings.Split(e.node.KubeletLog(100000), "\n") {
		if strings.Contains(line, "unprepare dynamic resources") {
			n++
		}
	}
	return n
}

// allocatedStatus returns the kubelet's health report for the container's
// claim "gpu" (pod.status.containerStatuses[0].allocatedResourcesStatus).
func allocatedStatus(p *corev1.Pod) []corev1.ResourceHealth {
	if len(p.Status.ContainerStatuses) != 1 {
		return nil
	}
	for _, rs := range p.Status.ContainerStatuses[0].AllocatedResourcesStatus {
		if rs.Name == "claim:gpu" {
			return rs.Resources
		}
	}
	return nil
}

func (e *env) waitHealth(pod *corev1.Pod, resourceID string, want corev1.ResourceHealthStatus) corev1.ResourceHealth {
	e.t.Helper()
	start := time.Now()
	var last []corev1.ResourceHealth
	var got corev1.ResourceHealth
	e.waitFor("health of "+resourceID+" "+string(want), 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = allocatedStatus(p)
		for _, h := range last {
			if string(h.ResourceID) == resourceID && h.Health == want {
				got = h
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "status: " + healthString(last) })
	e.t.Logf("%s %s after %s (status %s)", resourceID, want, time.Since(start).Round(100*time.Millisecond), healthString(last))
	return got
}

func healthString(hs []corev1.ResourceHealth) string {
	var out []string
	for _, h := range hs {
		s := string(h.ResourceID) + " " + string(h.Health)
		if h.Message != nil {
			s += fmt.Sprintf(" %q", *h.Message)
		}
		out = append(out, s)
	}
	return "[" + strings.Join(out, "; ") + "]"
}

// TestPluginHealth: tessera-node's health stream (WatchResources) reaches
// the pod's status: the device is Healthy while the plugin runs, Unknown
// once it has died, and Healthy again when it is back.
func TestPluginHealth(t *testing.T) {
	e := newEnv(t)
	pod, claim := e.runWholeGPU("health", 3)
	// The kubelet names a device by its first CDI device ID.
	id := cdi.DeviceID(claim.UID, claim.Status.Allocation.Devices.Results[0].Device)
	e.waitHealth(pod, id, corev1.ResourceHealthStatusHealthy)

	e.node.Plugin.Kill()
	e.waitHealth(pod, id, corev1.ResourceHealthStatusUnknown)

	p, err := e.node.StartPlugin(e.ctx, realnode.PluginOptions{Name: "tessera-node-2"})
	if err != nil {
		t.Fatal(err)
	}
	e.node.Plugin = p
	e.waitHealth(pod, id, corev1.ResourceHealthStatusHealthy)
	if n := e.claimOperations(p, "prepare"); n != 0 {
		t.Errorf("the restarted tessera-node prepared %d claims for a running pod, want 0", n)
	}
	e.deleteAndCheckUnprepared(pod, claim, "gpu")
}

// TestDeviceUnhealthy: faults of the GPU itself, injected into the mock
// machine of the running tessera-node (its control socket), reach the pod's
// status through tessera-node's health stream and the kubelet: a critical
// XID makes the device Unhealthy and, once the GPU has answered NVML for
// --xid-recovery-period, Healthy again; a GPU that falls off the bus is
// Unhealthy until it answers again.
func TestDeviceUnhealthy(t *testing.T) {
	e := newEnv(t, func(o *realnode.Options) {
		o.PluginArgs = []string{"--health-probe-interval=1s", "--xid-recovery-period=10s"}
	})
	pod, claim := e.runWholeGPU("sick", 3)
	id := cdi.DeviceID(claim.UID, claim.Status.Allocation.Devices.Results[0].Device)
	e.waitHealth(pod, id, corev1.ResourceHealthStatusHealthy)

	// XID 48: a double-bit ECC error, critical (not among the benign XIDs).
	if err := e.node.Plugin.NVML(e.ctx, "xid 3 48"); err != nil {
		t.Fatal(err)
	}
	if h := e.waitHealth(pod, id, corev1.ResourceHealthStatusUnhealthy); h.Message == nil || !strings.Contains(*h.Message, "48") {
		t.Errorf("the Unhealthy status does not carry tessera-node's message naming XID 48: %s", healthString([]corev1.ResourceHealth{h}))
	}
	e.waitHealth(pod, id, corev1.ResourceHealthStatusHealthy)

	if err := e.node.Plugin.NVML(e.ctx, "lost 3"); err != nil {
		t.Fatal(err)
	}
	if h := e.waitHealth(pod, id, corev1.ResourceHealthStatusUnhealthy); h.Message == nil || !strings.Contains(*h.Message, "GPU does not answer") {
		t.Errorf("the Unhealthy status of a lost GPU does not say so: %s", healthString([]corev1.ResourceHealth{h}))
	}
	// Still Unhealthy while the GPU does not answer (probes every second).
	time.Sleep(5 * time.Second)
	e.waitHealth(pod, id, corev1.ResourceHealthStatusUnhealthy)
	if err := e.node.Plugin.NVML(e.ctx, "back 3"); err != nil {
		t.Fatal(err)
	}
	e.waitHealth(pod, id, corev1.ResourceHealthStatusHealthy)
	e.deleteAndCheckUnprepared(pod, claim, "gpu")
}

// TestKubeletRestart: a kubelet restarted under a running pod does not
// prepare its claim again (its DRA checkpoint holds it), it deletes the
// node's ResourceSlices at start and tessera-node publishes them again, and
// the pod's claim is unprepared when it is deleted afterwards.
func TestKubeletRestart(t *testing.T) {
	e := newEnv(t)
	pod, claim := e.runWholeGPU("restart", 3)
	before := e.sliceUIDs()
	running := e.waitRunning(pod)
	containerID := running.Status.ContainerStatuses[0].ContainerID
	prepares := e.claimOperations(e.node.Plugin, "prepare")

	e.node.StopKubelet()
	if err := e.node.StartKubelet(e.ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted kubelet wipes the node's slices; tessera-node's
	// ResourceSlice controller puts them back.
	e.waitFor("slices republished", 2*time.Minute, func(ctx context.Context) (bool, error) {
		now := e.sliceUIDs()
		if len(now) != len(before) {
			return false, nil
		}
		for uid := range now {
			if before[uid] {
				return false, nil
			}
		}
		return true, nil
	})
	// Let the kubelet sync the pod (syncFrequency 10s) before looking.
	time.Sleep(12 * time.Second)
	got := e.waitRunning(pod)
	if id := got.Status.ContainerStatuses[0].ContainerID; id != containerID || got.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("container after the kubelet restart: %s (restarts %d), want %s untouched", id, got.Status.ContainerStatuses[0].RestartCount, containerID)
	}
	if n := e.claimOperations(e.node.Plugin, "prepare"); n != prepares {
		t.Errorf("claims prepared: %d before the kubelet restart, %d after; want no second prepare", prepares, n)
	}
	e.deleteAndCheckUnprepared(pod, claim, "gpu")
}

// sliceUIDs returns the UIDs of the node's ResourceSlices.
func (e *env) sliceUIDs() map[types.UID]bool {
	e.t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[types.UID]bool{}
	for _, s := range list.Items {
		if s.Spec.NodeName != nil && *s.Spec.NodeName == e.node.Name() {
			out[s.UID] = true
		}
	}
	return out
}
