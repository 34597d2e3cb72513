package deviceplugin

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/nodeagent/health"
)

// HealthSource delivers health events until ctx ends, then closes the
// channel; the node agent's *health.Broadcaster is one. Events name a GPU
// UUID (its MIG devices and replicas follow it) or a MIG device UUID.
type HealthSource interface {
	Subscribe(ctx context.Context) <-chan health.Event
}

var _ HealthSource = (*health.Broadcaster)(nil)

// applyHealth records the event the way health.Broadcaster does (a device
// is unhealthy while any condition holds; a healthy event clears its kind,
// or every kind when Kind is empty) and, when that changes whether the
// device is healthy, wakes the ListAndWatch streams. Unlike NVIDIA's device
// plugin, a recovered device is offered again.
func (p *Plugin) applyHealth(ctx context.Context, ev health.Event) {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	conds := p.unhealthy[ev.UUID]
	wasUnhealthy := len(conds) > 0
	switch {
	case !ev.Healthy:
		if conds == nil {
			conds = map[health.Kind]health.Event{}
			p.unhealthy[ev.UUID] = conds
		}
		conds[ev.Kind] = ev
	case ev.Kind == "":
		delete(p.unhealthy, ev.UUID)
	default:
		delete(conds, ev.Kind)
		if len(conds) == 0 {
			delete(p.unhealthy, ev.UUID)
		}
	}
	isUnhealthy := len(p.unhealthy[ev.UUID]) > 0
	if wasUnhealthy == isUnhealthy {
		logger.V(2).Info("Health condition changed, device health did not", "event", ev.String())
		return
	}
	if isUnhealthy {
		logger.Info("Device unhealthy", "uuid", ev.UUID, "kind", ev.Kind, "message", ev.Message)
	} else {
		logger.Info("Device healthy again", "uuid", ev.UUID, "message", ev.Message)
	}
	p.updateDeviceGaugesLocked()
	close(p.changed)
	p.changed = make(chan struct{})
}
