package deviceplugin

import (
	"k8s.io/component-base/metrics"
)

const metricsSubsystem = "tessera_deviceplugin"

// pluginMetrics are the plugin's Prometheus metrics. Each Plugin has its own
// registry (Plugin.Registry), as the DRA plugin does, so that tests and the
// binary can run several instances without duplicate registration.
type pluginMetrics struct {
	registry           metrics.KubeRegistry
	registrations      *metrics.CounterVec
	registrationErrors *metrics.CounterVec
	allocations        *metrics.CounterVec
	allocationErrors   *metrics.CounterVec
	preferredDuration  *metrics.HistogramVec
	devices            *metrics.GaugeVec
}

func newMetrics() *pluginMetrics {
	m := &pluginMetrics{
		registry: metrics.NewKubeRegistry(),
		registrations: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "registrations_total",
			Help:           "Successful registrations with the kubelet, by resource; more than one means the kubelet restarted.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource"}),
		registrationErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "registration_errors_total",
			Help:           "Failed registration attempts (retried with backoff), by resource.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource"}),
		allocations: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "container_allocations_total",
			Help:           "Containers given devices by Allocate, by resource.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource"}),
		allocationErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "allocation_errors_total",
			Help:           "Allocate calls refused (unknown device, too many replicas), by resource.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource"}),
		preferredDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Subsystem:      metricsSubsystem,
			Name:           "preferred_allocation_duration_seconds",
			Help:           "Time to answer one container's GetPreferredAllocation, by resource; the kubelet waits for it while admitting a pod.",
			Buckets:        metrics.ExponentialBuckets(0.00001, 4, 10),
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource"}),
		devices: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Subsystem:      metricsSubsystem,
			Name:           "devices",
			Help:           "Devices advertised to the kubelet, by resource and health (Healthy, Unhealthy).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource", "health"}),
	}
	m.registry.MustRegister(m.registrations, m.registrationErrors, m.allocations, m.allocationErrors, m.preferredDuration, m.devices)
	return m
}

// Registry holds the plugin's metrics, for the binary to serve.
func (p *Plugin) Registry() metrics.KubeRegistry { return p.metrics.registry }

// updateDeviceGaugesLocked recounts healthy and unhealthy devices per
// resource; p.mu is held.
func (p *Plugin) updateDeviceGaugesLocked() {
	for _, r := range p.resources {
		unhealthy := 0
		for _, a := range r.devices {
			if p.isUnhealthyLocked(a.unit) {
				unhealthy++
			}
		}
		p.metrics.devices.WithLabelValues(r.name, "Healthy").Set(float64(len(r.devices) - unhealthy))
		p.metrics.devices.WithLabelValues(r.name, "Unhealthy").Set(float64(unhealthy))
	}
}
