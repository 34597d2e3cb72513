package draplugin

import (
	"context"
	"sort"
	"strings"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/health"
)

// WatchHealthStatus implements kubeletplugin.DRAPlugin: it reports every
// device of every GPU, first in full, then on each change, and again every
// HealthResend so the kubelet never marks devices unknown.
func (p *Plugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if p.opts.Health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	events := p.opts.Health.Subscribe(ctx)
	// conditions holds the unhealthy conditions of each GPU by kind.
	conditions := map[string]map[health.Kind]health.Event{}
	ticker := time.NewTicker(p.opts.HealthResend)
	defer ticker.Stop()
	send := func() bool {
		select {
		case <-ctx.Done():
			return false
		case reports <- p.healthReport(conditions):
			return true
		}
	}
	if !send() {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			switch {
			case !ev.Healthy:
				if conditions[ev.UUID] == nil {
					conditions[ev.UUID] = map[health.Kind]health.Event{}
				}
				conditions[ev.UUID][ev.Kind] = ev
			case ev.Kind == "":
				delete(conditions, ev.UUID)
			default:
				delete(conditions[ev.UUID], ev.Kind)
			}
		case <-ticker.C:
		}
		if !send() {
			return nil
		}
	}
}

// healthReport lists every device name the node agent may publish for each
// GPU (whole, shared, every MIG profile and placement) with the GPU's
// health, in the pool named after the node.
func (p *Plugin) healthReport(conditions map[string]map[health.Kind]health.Event) kubeletplugin.DeviceHealthReport {
	now := time.Now()
	var r kubeletplugin.DeviceHealthReport
	for _, g := range p.currentNode().GPUs {
		status := kubeletplugin.HealthStatusHealthy
		var msgs []string
		for _, ev := range conditions[g.UUID] {
			status = kubeletplugin.HealthStatusUnhealthy
			msgs = append(msgs, ev.String()+messageSuffix(ev.Message))
		}
		sort.Strings(msgs)
		names := []string{devicename.GPU(g.Minor), devicename.Shared(g.Minor)}
		for _, prof := range g.MigProfiles {
			for _, pl := range prof.Placements {
				names = append(names, devicename.MIG(g.Minor, prof.Name, pl.Start))
			}
		}
		for _, n := range names {
			r.Devices = append(r.Devices, kubeletplugin.DeviceHealth{
				PoolName:           p.opts.NodeName,
				DeviceName:         n,
				Health:             status,
				LastUpdated:        now,
				HealthCheckTimeout: 2 * p.opts.HealthResend,
				Message:            strings.Join(msgs, "; "),
			})
		}
	}
	return r
}

func messageSuffix(m string) string {
	if m == "" {
		return ""
	}
	return ": " + m
}
