package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/test/framework"

	"github.com/tessera-gpu/tessera/contract"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// createNode creates a Node with labels and deletes it when the test ends
// (its ResourceSlices go with it through the garbage collector).
func createNode(t *testing.T, client kubernetes.Interface, labels map[string]string) *v1.Node {
	t.Helper()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: framework.UniqueName("gpu-node"), Labels: labels}}
	node, err := client.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{})
	})
	return node
}

type runningAgent struct {
	*agent.Agent
	lib  nvml.Interface
	node *v1.Node
	done chan error
}

// startAgent runs an agent for a fresh node until the test ends.
func startAgent(t *testing.T, client kubernetes.Interface, backend string, cfg string, mutate func(*agent.Options)) *runningAgent {
	t.Helper()
	lib, err := nvmlbackend.Open(backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() }) // after the agent stops
	var config *partition.Config
	if cfg != "" {
		if config, err = partition.Parse([]byte(cfg)); err != nil {
			t.Fatalf("config: %v", err)
		}
	}
	node := createNode(t, client, map[string]string{"tessera.dev/test": "true"})
	opts := agent.Options{KubeClient: client, NodeName: node.Name, NVML: lib, Config: config, ResyncPeriod: time.Hour}
	if mutate != nil {
		mutate(&opts)
	}
	a, err := agent.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	ra := &runningAgent{Agent: a, lib: lib, node: node, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ra.done:
			if err != nil {
				t.Errorf("agent: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop")
		}
	})
	return ra
}

// pool returns the complete current pool of a node: the slices of its
// highest generation, once all of them are visible.
func pool(ctx context.Context, client kubernetes.Interface, nodeName string) ([]resourceapi.ResourceSlice, bool, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, nodeName),
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, contract.DriverName),
		).String(),
	})
	if err != nil {
		return nil, false, err
	}
	var gen int64 = -1
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var out []resourceapi.ResourceSlice
	for _, s := range list.Items {
		if s.Spec.Pool.Generation == gen {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	complete := len(out) > 0 && int64(len(out)) == out[0].Spec.Pool.ResourceSliceCount
	return out, complete, nil
}

// waitPool waits until the node's complete pool satisfies cond.
func waitPool(t *testing.T, client kubernetes.Interface, nodeName string, what string, cond func([]resourceapi.ResourceSlice) bool) []resourceapi.ResourceSlice {
	t.Helper()
	var last []resourceapi.ResourceSlice
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		s, complete, err := pool(ctx, client, nodeName)
		if err != nil || !complete {
			return false, nil
		}
		last = s
		return cond(s), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s on node %s: %v; last pool: %s", what, nodeName, err, describePool(last))
	}
	return last
}

func describePool(s []resourceapi.ResourceSlice) string {
	c := countTypes(s)
	return fmt.Sprintf("%d slices, devices by type %v", len(s), c)
}

func devices(s []resourceapi.ResourceSlice) []resourceapi.Device {
	var out []resourceapi.Device
	for _, sl := range s {
		out = append(out, sl.Spec.Devices...)
	}
	return out
}

func deviceType(d resourceapi.Device) string {
	if a, ok := d.Attributes["type"]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func countTypes(s []resourceapi.ResourceSlice) map[string]int {
	out := map[string]int{}
	for _, d := range devices(s) {
		out[deviceType(d)]++
	}
	return out
}

// createDeviceClasses creates tessera's DeviceClasses from deployments/.
func createDeviceClasses(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	files, err := filepath.Glob("../../deployments/deviceclasses/*.yaml")
	if err != nil || len(files) != 3 {
		t.Fatalf("want 3 DeviceClass files, got %v (%v)", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var dc resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict(data, &dc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := client.ResourceV1().DeviceClasses().Create(context.Background(), &dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: %v", f, err)
		}
	}
}

// classLister reads DeviceClasses from the API server for the allocator.
type classLister struct{ client kubernetes.Interface }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	list, err := l.client.ResourceV1().DeviceClasses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]*resourceapi.DeviceClass, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	return l.client.ResourceV1().DeviceClasses().Get(context.Background(), name, metav1.GetOptions{})
}

// nvmlPlacements counts, from NVML directly, the (profile, placement) pairs of
// the GPU with this index.
func nvmlPlacements(t *testing.T, lib nvml.Interface, index int) int {
	t.Helper()
	dev, ret := lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	n := 0
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		pls, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		n += len(pls)
	}
	return n
}

func parse(s string) (*partition.Config, error) { return partition.Parse([]byte(s)) }
