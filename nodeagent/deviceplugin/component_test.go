package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// TestAgentComponentServesOnlyDevicePluginGPUs runs the device plugin as
// tessera-node does, beside the node agent: it serves exactly the GPUs the
// partition config puts in devicePlugin mode, which the agent does not
// publish, and follows the config when a resync moves a GPU between modes.
func TestAgentComponentServesOnlyDevicePluginGPUs(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := framework.UniqueName("dp-node")
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })

	dir := shortTempDir(t)
	kubelet := startFakeKubelet(t, dir)
	configPath := filepath.Join(t.TempDir(), "partition.yaml")
	writeConfig := func(indices string) {
		if err := os.WriteFile(configPath, []byte("default: {gpus: [{indices: "+indices+", mode: devicePlugin}]}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig("[1]")
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=3")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	features := slices.AllFeatures
	gatherer := &Gatherer{}
	a, err := agent.New(agent.Options{
		KubeClient: client, NodeName: node, NVML: lib, ConfigPath: configPath, Features: &features,
		Components: []agent.Component{AgentComponent(Config{PluginDir: dir}, 50*time.Millisecond, gatherer)},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	node0, _ := a.Snapshot()
	for node0 == nil {
		time.Sleep(20 * time.Millisecond)
		node0, _ = a.Snapshot()
	}
	uuid := func(i int) string { return node0.GPUs[i].UUID }

	reg := kubelet.nextRegistration()
	if reg.ResourceName != "tessera.dev/gpu" {
		t.Fatalf("registered %q, want tessera.dev/gpu", reg.ResourceName)
	}
	if got := sortedIDs(nextList(t, kubelet.watch(ctx, reg.Endpoint))); len(got) != 1 || got[0] != uuid(1) {
		t.Fatalf("device plugin serves %v, want only GPU 1 (%s)", got, uuid(1))
	}
	waitPublished(t, ctx, client, node, []string{"gpu-0", "gpu-2"})
	if mfs, err := gatherer.Gather(); err != nil || len(mfs) == 0 {
		t.Errorf("the running device plugin's metrics are not gathered: %d families, %v", len(mfs), err)
	}

	// GPU 0 joins the device plugin: the agent stops publishing it and the
	// plugin restarts with GPUs 0 and 1.
	writeConfig("[0, 1]")
	a.Resync()
	reg = kubelet.nextRegistration()
	want := []string{uuid(0), uuid(1)}
	sort.Strings(want)
	if got := sortedIDs(nextList(t, kubelet.watch(ctx, reg.Endpoint))); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("after the change the device plugin serves %v, want %v", got, want)
	}
	waitPublished(t, ctx, client, node, []string{"gpu-2"})
}

func sortedIDs(devs []*pluginapi.Device) []string {
	ids := deviceIDs(devs)
	sort.Strings(ids)
	return ids
}

// waitPublished waits until the node's slices hold exactly these devices.
func waitPublished(t *testing.T, ctx context.Context, client kubernetes.Interface, node string, want []string) {
	t.Helper()
	var got []string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatal(err)
		}
		got = nil
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				got = append(got, d.Name)
			}
		}
		sort.Strings(got)
		if len(got) == len(want) && (len(want) == 0 || equalStrings(got, want)) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s publishes %v, want %v", node, got, want)
}

func equalStrings(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
