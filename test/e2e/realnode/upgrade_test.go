package realnode

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
)

// TestRollingUpgrade: two tessera-node instances with their own --pod-uid
// serve the node side by side while a claim is prepared, as a DaemonSet
// rolling update with maxSurge does. The kubelet sends new calls to the
// newer instance; after the old one has gone, the new one unprepares the
// claim the old one prepared, and prepares new claims.
func TestRollingUpgrade(t *testing.T) {
	e := newEnv(t, func(o *realnode.Options) { o.NoPlugin = true })
	oldPlugin, err := e.node.StartPlugin(e.ctx, realnode.PluginOptions{Name: "tessera-node-old", PodUID: "01d00000-0000-0000-0000-000000000001"})
	if err != nil {
		t.Fatal(err)
	}
	e.node.Plugin = oldPlugin
	first, firstClaim := e.runWholeGPU("first", 3)
	if n := e.claimOperations(oldPlugin, "prepare"); n != 1 {
		t.Fatalf("old instance prepared %d claims, want 1", n)
	}

	newPlugin, err := e.node.StartPlugin(e.ctx, realnode.PluginOptions{Name: "tessera-node-new", PodUID: "0e100000-0000-0000-0000-000000000002"})
	if err != nil {
		t.Fatal(err)
	}
	e.node.Plugin = newPlugin
	// Both run: the kubelet uses the newest registration.
	shareClaim := e.claim("second", request{class: contract.ClassShared, selector: attr(contract.AttrIndex) + " == 2", memory: "8Gi"})
	second, shareClaim := e.schedule(e.pod("second", shareClaim.Name, reportScript), shareClaim, nil)
	e.waitRunning(second)
	if env := e.readReport(second).nvidiaEnv(); env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" {
		t.Errorf("MPS environment of the claim prepared during the upgrade: %v", env)
	}
	if calls := strings.Join(e.node.ToolCalls(), "\n"); !strings.Contains(calls, "limits=mem:0=8192M") {
		t.Errorf("the MPS daemon of the claim prepared during the upgrade did not start with its 8Gi limit; tool calls:\n%s", calls)
	}
	if o, n := e.claimOperations(oldPlugin, "prepare"), e.claimOperations(newPlugin, "prepare"); o != 1 || n != 1 {
		t.Errorf("prepares during the overlap: old instance %d, new %d; want 1 and 1", o, n)
	}

	// The old pod goes (SIGTERM); the kubelet keeps the new registration.
	oldPlugin.Stop()
	e.deletePod(first)
	e.waitFor("claim of the old instance unprepared by the new one", time.Minute, func(context.Context) (bool, error) {
		_, held := e.checkpoint()[firstClaim.UID]
		return !held && e.claimOperations(newPlugin, "unprepare") == 1, nil
	})
	// Free GPU 3 for the next claim.
	if err := e.client.ResourceV1().ResourceClaims(e.ns).Delete(e.ctx, firstClaim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	third, thirdClaim := e.runWholeGPU("third", 3)
	if n := e.claimOperations(newPlugin, "prepare"); n != 2 {
		t.Errorf("new instance prepared %d claims, want 2", n)
	}
	e.deleteAndCheckUnprepared(third, thirdClaim, "gpu")
	e.deleteAndCheckUnprepared(second, shareClaim, "shared")
	if calls := strings.Join(e.node.ToolCalls(), "\n"); !strings.Contains(calls, "stdin=quit") {
		t.Errorf("MPS daemon started during the upgrade was not stopped; tool calls:\n%s", calls)
	}
}
