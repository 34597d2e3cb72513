package deviceplugin

import (
	"context"

	"k8s.io/klog/v2"
)

// HealthEvent says that a GPU or MIG device became unhealthy, or recovered.
type HealthEvent struct {
	// UUID of the GPU or MIG device. An unhealthy GPU makes its MIG devices
	// and replicas unhealthy too.
	UUID    string
	Healthy bool
	// Reason is logged, e.g. "XID 79".
	Reason string
}

// HealthSource delivers health events until ctx ends, then closes the
// channel.
type HealthSource interface {
	Subscribe(ctx context.Context) <-chan HealthEvent
}

// applyHealth records the event and, when it changes anything, wakes the
// ListAndWatch streams. Unlike NVIDIA's device plugin, a recovered device
// is offered again.
func (p *Plugin) applyHealth(ctx context.Context, ev HealthEvent) {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	_, wasUnhealthy := p.unhealthy[ev.UUID]
	switch {
	case !ev.Healthy && !wasUnhealthy:
		p.unhealthy[ev.UUID] = ev.Reason
		logger.Info("Device unhealthy", "uuid", ev.UUID, "reason", ev.Reason)
	case ev.Healthy && wasUnhealthy:
		delete(p.unhealthy, ev.UUID)
		logger.Info("Device healthy again", "uuid", ev.UUID, "reason", ev.Reason)
	default:
		return
	}
	close(p.changed)
	p.changed = make(chan struct{})
}
