package scheduler_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
)

// addAgentNode creates a node and runs tessera's node agent for it in-process, on a mock DGX
// H100 (8 GPUs), publishing the slices the scheduler works with.
func (e *env) addAgentNode(name, config string) string {
	e.t.Helper()
	name = e.id + "-" + name
	e.createNodeObject(name, nil)
	lib, err := nvmlbackend.Open("mock:dgxh100")
	if err != nil {
		e.t.Fatal(err)
	}
	cfg, err := partition.Parse([]byte(config))
	if err != nil {
		e.t.Fatalf("partition config: %v", err)
	}
	a, err := agent.New(agent.Options{KubeClient: e.kube, NodeName: name, NVML: lib, Config: cfg, ResyncPeriod: time.Hour})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.FromContext(e.ctx)))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			e.t.Errorf("node agent: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return a.Ready(), nil
	}); err != nil {
		e.t.Fatalf("node agent for %s never published", name)
	}
	return name
}

// TestGangOnNodeAgentSlices: two mock DGX H100 nodes publish through tessera's node agent, one
// with whole GPUs, one with dynamic MIG (partitionable devices). A gang of 8 whole-GPU pods and
// 4 pods asking for 1g.10gb MIG devices binds completely, and the queue is charged in GPU units
// (8 + 4 × one memory slice of the GPU's).
func TestGangOnNodeAgentSlices(t *testing.T) {
	e := newEnv(t)
	e.addAgentNode("whole", "default:\n  gpus:\n  - mode: whole\n")
	mig := e.addAgentNode("mig", "default:\n  gpus:\n  - mode: dynamicMIG\n")
	q := e.addQueue("q", "", "", "", 1)
	i := 0
	pods := e.gang("mixed", q, 12, func(ns, name string) *resourceapi.ResourceClaim {
		i++
		if i > 8 {
			return fixture.MIGClaim(ns, name, "1g.10gb")
		}
		return fixture.GPUClaim(ns, name, 1)
	})
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	e.checkClaims()
	e.checkClaimsOnPodNodes()
	claims, _ := e.kube.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	migs := 0
	for _, c := range claims.Items {
		r := c.Status.Allocation.Devices.Results[0]
		if strings.Contains(r.Device, "-mig-") {
			migs++
			if r.Pool != mig {
				t.Errorf("MIG device %s/%s not on the MIG node", r.Pool, r.Device)
			}
		}
	}
	if migs != 4 {
		t.Fatalf("%d MIG devices allocated, want 4", migs)
	}
	// A 1g.10gb device holds one memory slice of its GPU: count the GPU's memory-slice
	// counters as the node agent published them.
	slices, err := e.kube.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	memSlices := 0
	for _, s := range slices.Items {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != mig {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			if cs.Name == "gpu-0-counters" {
				for name := range cs.Counters {
					if strings.HasPrefix(name, "memory-slice-") {
						memSlices++
					}
				}
			}
		}
	}
	if memSlices == 0 {
		t.Fatal("no memory-slice counters published for gpu-0")
	}
	want := resource.NewMilliQuantity(int64(math.Round((8+4/float64(memSlices))*1000)), resource.DecimalSI)
	t.Logf("GPU has %d memory slices; queue should hold %s GPU units", memSlices, want)
	waitQueueGPU(t, e, q, want.String())
}
