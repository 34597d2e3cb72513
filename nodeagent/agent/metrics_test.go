package agent_test

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// TestPublishErrorsStartAtZero: the node's error counter is exported at 0 as soon as the agent
// exists, before any error, so that the PrometheusRule's increase() sees the first one.
func TestPublishErrorsStartAtZero(t *testing.T) {
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	if _, err := agent.New(agent.Options{KubeClient: client, NodeName: "zero-errors-node", NVML: lib}); err != nil {
		t.Fatal(err)
	}
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "tessera_node_publish_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == "zero-errors-node" {
					if v := m.GetCounter().GetValue(); v != 0 {
						t.Fatalf("publish errors of a new agent = %v, want 0", v)
					}
					return
				}
			}
		}
	}
	t.Fatal("tessera_node_publish_errors_total{node=\"zero-errors-node\"} is not exported before the first error")
}
