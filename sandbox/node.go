package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"

	"github.com/tessera-gpu/tessera/contract"
)

// simNode is one simulated GPU node: a simulated kubelet, and tessera-node's
// node agent and kubelet DRA plugin running in-process on a mock NVML backend,
// talking to each other over the plugin's real unix sockets.
type simNode struct {
	name    string
	dir     string
	nvml    nvml.Interface
	kubelet *simkubelet.Kubelet
	exec    *simExecutor

	agent *agent.Agent
	// metrics is the DRA plugin's registry (one per node).
	metrics metrics.KubeRegistry

	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

type nodeSpec struct {
	name    string
	backend string // e.g. "mock:dgxh100"
	labels  map[string]string
	config  *partition.Config
	bootID  string
}

// startNode starts a node's kubelet, agent and plugin; stop ends them all.
func startNode(ctx context.Context, client kubernetes.Interface, dir string, spec nodeSpec) (*simNode, error) {
	n := &simNode{name: spec.name, dir: dir, exec: &simExecutor{}, done: make(chan struct{}), metrics: metrics.NewKubeRegistry()}
	for _, d := range []string{n.registryDir(), n.pluginDir(), n.cdiDir(), n.mpsDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node %s: %w", spec.name, err)
		}
	}
	lib, err := nvmlbackend.Open(spec.backend)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", spec.name, err)
	}
	n.nvml = lib
	n.kubelet = simkubelet.New(simkubelet.Options{NodeName: spec.name, Client: client, RegistryDir: n.registryDir(), Labels: spec.labels})

	a, err := agent.New(agent.Options{
		KubeClient: client,
		NodeName:   spec.name,
		NVML:       lib,
		Config:     spec.config,
		Components: []agent.Component{draplugin.Component(draplugin.Options{
			KubeClient:   client,
			RegistrarDir: n.registryDir(),
			PluginDir:    n.pluginDir(),
			CDIDir:       n.cdiDir(),
			MPSDir:       n.mpsDir(),
			Executor:     n.exec,
			BootID:       spec.bootID,
			Registry:     n.metrics,
		})},
	})
	if err != nil {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("node %s: %w", spec.name, err)
	}
	n.agent = a

	ctx, n.cancel = context.WithCancel(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("node", spec.name)))
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() {
		if err := n.kubelet.Run(ctx); err != nil {
			errs <- fmt.Errorf("kubelet: %w", err)
			n.cancel()
		}
	})
	wg.Go(func() {
		if err := a.Run(ctx); err != nil && ctx.Err() == nil {
			errs <- fmt.Errorf("tessera-node: %w", err)
			n.cancel()
		}
	})
	go func() {
		wg.Wait()
		close(errs)
		var all []error
		for err := range errs {
			all = append(all, err)
		}
		n.err = errors.Join(all...)
		_ = lib.Shutdown()
		close(n.done)
	}()
	return n, nil
}

func (n *simNode) registryDir() string { return filepath.Join(n.dir, "plugins_registry") }
func (n *simNode) pluginDir() string   { return filepath.Join(n.dir, "plugins", contract.DriverName) }
func (n *simNode) cdiDir() string      { return filepath.Join(n.dir, "cdi") }
func (n *simNode) mpsDir() string      { return filepath.Join(n.dir, "mps") }

// ready reports whether the agent has published and the kubelet plugin has
// put its registration socket where the kubelet looks.
func (n *simNode) ready() bool {
	if !n.agent.Ready() {
		return false
	}
	entries, _ := os.ReadDir(n.registryDir())
	return len(entries) > 0
}

// failed returns the error that stopped the node early, if it stopped.
func (n *simNode) failed() error {
	select {
	case <-n.done:
		if n.err != nil {
			return n.err
		}
		return fmt.Errorf("node %s stopped", n.name)
	default:
		return nil
	}
}

// stop ends the node's goroutines and waits for them.
func (n *simNode) stop() error {
	n.cancel()
	<-n.done
	return n.err
}
