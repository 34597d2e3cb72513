package agent

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Metrics carry a node label so that many in-process agents (sandbox, e2e)
// share one registry without clobbering each other.
var (
	devicesPublished = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      "tessera",
		Subsystem:      "node",
		Name:           "devices_published",
		Help:           "Devices in the node's ResourceSlices, by type (gpu, mig, shared).",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node", "type"})
	publishErrors = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "tessera",
		Subsystem:      "node",
		Name:           "publish_errors_total",
		Help:           "Errors while publishing ResourceSlices or preparing what they describe.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node"})
	healthEvents = metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace:      "tessera",
		Subsystem:      "node",
		Name:           "health_events_total",
		Help:           "GPU health events, by kind (xid, ecc, gpu-lost) and whether the GPU became healthy.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node", "kind", "healthy"})
	slicesPublished = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace:      "tessera",
		Subsystem:      "node",
		Name:           "resource_slices",
		Help:           "ResourceSlices in the node's pool.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"node"})

	registerOnce sync.Once
)

// RegisterMetrics registers the node agent's metrics in the component-base
// legacy registry (served on /metrics). It is idempotent.
func RegisterMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(devicesPublished, publishErrors, healthEvents, slicesPublished)
	})
}
