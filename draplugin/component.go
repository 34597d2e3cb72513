package draplugin

import (
	"context"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
)

// Component runs the plugin beside the node agent (agent.Options.Components):
// it takes the agent's node name, NVML library, discovery snapshots (fresh
// for every prepare), health broadcaster, per-GPU locks and driver roots,
// tells the agent which devices to withdraw, and stops the plugin when the
// agent stops. opts carries the rest (KubeClient, directories, executor,
// rolling-update UID).
func Component(opts Options) agent.Component {
	return func(ctx context.Context, a *agent.Agent) error {
		opts.NodeName = a.NodeName()
		opts.NVML = a.NVML()
		opts.Node, _ = a.Snapshot()
		opts.Discovery = func() *discovery.Node {
			n, _ := a.Snapshot()
			return n
		}
		opts.Health = a.Health()
		opts.GPULocks = a.GPULocks()
		opts.Withdraw = a.Withdraw
		if opts.Roots == nil {
			roots := a.Roots()
			opts.Roots = &roots
		}
		p, err := Start(ctx, opts)
		if err != nil {
			return err
		}
		<-ctx.Done()
		p.Stop()
		return nil
	}
}
