package agent_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/test/framework"
)

// runOn runs an agent for node on lib until the returned stop is called.
func runOn(t *testing.T, client kubernetes.Interface, lib *nvmlbackend.Mock, node *v1.Node, statePath string) (a *agent.Agent, stop func()) {
	t.Helper()
	a, err := agent.New(agent.Options{KubeClient: client, NodeName: node.Name, NVML: lib, ResyncPeriod: time.Hour, StatePath: statePath,
		Monitor: &health.MonitorOptions{ProbeInterval: 50 * time.Millisecond, WaitTimeout: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// wholeDevices returns the published whole GPUs by UUID with their taints.
func wholeDevices(s []resourceapi.ResourceSlice) map[string][]resourceapi.DeviceTaint {
	out := map[string][]resourceapi.DeviceTaint{}
	for _, d := range devices(s) {
		if contract.TypeOf(&d) == contract.TypeGPU {
			out[contract.StringAttr(&d, contract.AttrUUID)] = d.Taints
		}
	}
	return out
}

func hasTaint(ts []resourceapi.DeviceTaint, key, value string, effect resourceapi.DeviceTaintEffect) bool {
	for _, t := range ts {
		if t.Key == key && t.Value == value && t.Effect == effect {
			return true
		}
	}
	return false
}

// published8 waits until the pool has these 8 GPUs, the lost one (if any)
// tainted NoExecute and the others untainted (except xid, with an XID taint).
func published8(t *testing.T, client kubernetes.Interface, node string, gpus []*nvmlbackend.GPU, lost, xid string) {
	t.Helper()
	waitPool(t, client, node, "8 GPUs, "+lost+" lost, "+xid+" with an XID", func(s []resourceapi.ResourceSlice) bool {
		whole := wholeDevices(s)
		if len(whole) != 8 {
			return false
		}
		for _, g := range gpus {
			ts, ok := whole[g.UUID]
			switch {
			case !ok:
				return false
			case g.UUID == lost:
				if !hasTaint(ts, contract.TaintKeyLost, "", resourceapi.DeviceTaintEffectNoExecute) {
					return false
				}
			case g.UUID == xid:
				if !hasTaint(ts, contract.TaintKeyXID, "48", resourceapi.DeviceTaintEffectNoSchedule) {
					return false
				}
			case len(ts) != 0:
				return false
			}
		}
		return true
	})
}

func nodeEvents(t *testing.T, client kubernetes.Interface, node, reason string) []string {
	t.Helper()
	var out []string
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + reason})
		if err != nil {
			return false, err
		}
		out = nil
		for _, e := range list.Items {
			out = append(out, e.Message)
		}
		return len(out) > 0, nil
	})
	return out
}

// TestLostGPU: a GPU lost mid-run and one lost while the agent restarts do
// not stop the agent; the other 7 GPUs stay published, the lost one is
// tainted gpu-lost:NoExecute, and the taint (and an XID taint of another
// GPU) is still there after a restart.
func TestLostGPU(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	lib, err := nvmlbackend.NewMock("dgxh100", 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	gpus := lib.GPUs()
	node := createNode(t, client, nil)
	state := filepath.Join(t.TempDir(), "node-state.json")

	_, stop := runOn(t, client, lib, node, state)
	published8(t, client, node.Name, gpus, "", "")
	// Mid-run: GPU 5 falls off the bus, GPU 1 has a critical XID.
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return lib.InjectXID(gpus[1].UUID, 48) == nil, nil
	}); err != nil {
		t.Fatal("the health monitor never registered")
	}
	if err := lib.SetLost(gpus[5].UUID, true); err != nil {
		t.Fatal(err)
	}
	published8(t, client, node.Name, gpus, gpus[5].UUID, gpus[1].UUID)
	stop()

	// Restart while GPU 5 is still lost: it is published from its last
	// description, still tainted; GPU 1's XID taint is restored.
	_, stop = runOn(t, client, lib, node, state)
	published8(t, client, node.Name, gpus, gpus[5].UUID, gpus[1].UUID)
	if ev := nodeEvents(t, client, node.Name, "GPUUnavailable"); len(ev) == 0 || !strings.Contains(ev[0], "GPU 5") || !strings.Contains(ev[0], "ERROR_GPU_IS_LOST") {
		t.Fatalf("GPUUnavailable events %q", ev)
	}
	stop()
}

// TestLostAtFirstStart: a GPU lost before the agent ever saw it is not
// published (nothing is known about it), with a Node event; the agent runs
// and publishes the other GPUs.
func TestLostAtFirstStart(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	lib, _ := nvmlbackend.NewMock("dgxh100", 8)
	t.Cleanup(func() { _ = lib.Shutdown() })
	gpus := lib.GPUs()
	_ = lib.SetLost(gpus[2].UUID, true)
	node := createNode(t, client, nil)
	runOn(t, client, lib, node, "")
	waitPool(t, client, node.Name, "7 GPUs without GPU 2", func(s []resourceapi.ResourceSlice) bool {
		whole := wholeDevices(s)
		_, has2 := whole[gpus[2].UUID]
		return len(whole) == 7 && !has2
	})
	if ev := nodeEvents(t, client, node.Name, "GPUUnavailable"); len(ev) == 0 || !strings.Contains(ev[0], "GPU 2 does not answer") || !strings.Contains(ev[0], "not published") {
		t.Fatalf("GPUUnavailable events %q", ev)
	}
	// Every device carries its PCIe root (from the machine's sysfs), so that
	// matchAttribute constraints can pair a GPU with a NIC.
	s, _, _ := pool(context.Background(), client, node.Name)
	for _, d := range devices(s) {
		if root := contract.StringAttr(&d, contract.AttrPCIeRoot); !strings.HasPrefix(root, "pci0000:") {
			t.Fatalf("device %s: pcieRoot %q", d.Name, root)
		}
	}
}
