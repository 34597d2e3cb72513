package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
)

// Gatherer serves the metrics of whichever device plugin AgentComponent runs
// at the moment (none while no GPU is in devicePlugin mode).
type Gatherer struct {
	mu sync.Mutex
	p  *Plugin
}

var _ prometheus.Gatherer = (*Gatherer)(nil)

// Gather implements prometheus.Gatherer.
func (g *Gatherer) Gather() ([]*dto.MetricFamily, error) {
	g.mu.Lock()
	p := g.p
	g.mu.Unlock()
	if p == nil {
		return nil, nil
	}
	return p.Registry().Gather()
}

func (g *Gatherer) set(p *Plugin) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.p = p
	g.mu.Unlock()
}

// AgentComponent runs the device plugin beside a node agent in tessera-node,
// for the GPUs that the node's partition config puts in devicePlugin mode —
// and only those, so that no GPU is offered both as an extended resource and
// through DRA. When a resync moves GPUs into or out of devicePlugin mode, the
// plugin is restarted with the new set (within recheck); while no GPU is in
// that mode it serves nothing. metrics, if not nil, follows the plugin that
// runs.
func AgentComponent(cfg Config, recheck time.Duration, metrics *Gatherer) agent.Component {
	if recheck <= 0 {
		recheck = 5 * time.Second
	}
	return func(ctx context.Context, a *agent.Agent) error {
		logger := klog.FromContext(ctx).WithName("deviceplugin")
		for {
			gpus, indices := devicePluginGPUs(a)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			if len(gpus) == 0 {
				logger.Info("No GPU is in devicePlugin mode; the device plugin serves nothing")
				close(done)
			} else {
				p, err := New(Options{Config: cfg, GPUs: FromDiscovery(ctx, gpus), NVML: a.NVML(), Health: a.Health()})
				if err != nil {
					stop()
					return fmt.Errorf("device plugin: %w", err)
				}
				logger.Info("Serving GPUs through the device plugin", "indices", indices, "resources", p.ResourceNames())
				metrics.set(p)
				go func() { done <- p.Run(runCtx) }()
			}
			changed := false
			ticker := time.NewTicker(recheck)
			for !changed {
				select {
				case <-ctx.Done():
				case err := <-done:
					if err != nil {
						ticker.Stop()
						stop()
						return fmt.Errorf("device plugin: %w", err)
					}
					done = nil // idle until the set changes or ctx ends
					continue
				case <-ticker.C:
					_, now := devicePluginGPUs(a)
					changed = !slices.Equal(now, indices)
					continue
				}
				break
			}
			ticker.Stop()
			stop()
			metrics.set(nil)
			if done != nil {
				if err := <-done; err != nil && ctx.Err() == nil {
					return fmt.Errorf("device plugin: %w", err)
				}
			}
			if ctx.Err() != nil {
				return nil
			}
			logger.Info("GPUs in devicePlugin mode changed; restarting the device plugin")
		}
	}
}

func devicePluginGPUs(a *agent.Agent) ([]discovery.GPU, []int) {
	node, plan := a.Snapshot()
	if node == nil || plan == nil {
		return nil, nil
	}
	var gpus []discovery.GPU
	var indices []int
	for _, idx := range plan.DevicePluginGPUs() {
		for _, g := range node.GPUs {
			if g.Index == idx {
				gpus = append(gpus, g)
				indices = append(indices, idx)
			}
		}
	}
	return gpus, indices
}
