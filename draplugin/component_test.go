package draplugin

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestAgentComponent starts the plugin the way tessera-node does: as a
// component of the node agent. The kubelet can register it and prepare a
// claim on the agent's GPUs.
func TestAgentComponent(t *testing.T) {
	e := newEnv(t) // directories, classes and fakes; its own node is unused here
	e.nodeName = framework.UniqueName("node")
	if _, err := e.client.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.CoreV1().Nodes().Delete(context.Background(), e.nodeName, metav1.DeleteOptions{}) })
	lib, err := nvmlbackend.NewMock("dgxh100", 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	e.lib = lib
	features := slices.AllFeatures
	a, err := agent.New(agent.Options{
		KubeClient: e.client, NodeName: e.nodeName, NVML: lib, Features: &features,
		Components: []agent.Component{Component(e.options())},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	k := e.kubelet()
	if k.info.Name != DriverName {
		t.Fatalf("registered %q", k.info.Name)
	}
	e.agent = a
	waitPublished(t, e)
	c := e.claim("via-agent", []request{{name: "gpu", class: "gpu"}})
	if r := k.prepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("prepare: %+v", r)
	}
	if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
}
