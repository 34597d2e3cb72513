package draplugin

import (
	"k8s.io/component-base/metrics"
)

const metricsSubsystem = "tessera_draplugin"

// pluginMetrics are the plugin's Prometheus metrics. Each plugin has its
// own registry (Plugin.Registry) so that tests and the binary can run
// several instances without duplicate registration.
type pluginMetrics struct {
	registry         metrics.KubeRegistry
	operations       *metrics.CounterVec
	errors           *metrics.CounterVec
	duration         *metrics.HistogramVec
	preparedDevices  *metrics.GaugeVec
	recoveredActions *metrics.CounterVec
}

func newMetrics() *pluginMetrics {
	m := &pluginMetrics{
		registry: metrics.NewKubeRegistry(),
		operations: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "claim_operations_total",
			Help:           "Claims prepared or unprepared, by operation (prepare, unprepare).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation"}),
		errors: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "claim_operation_errors_total",
			Help:           "Claims whose prepare or unprepare failed, by operation.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation"}),
		duration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Subsystem:      metricsSubsystem,
			Name:           "claim_operation_duration_seconds",
			Help:           "Latency of one NodePrepareResources or NodeUnprepareResources call, including checkpoint fsyncs.",
			Buckets:        metrics.ExponentialBuckets(0.0005, 2, 16),
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation"}),
		preparedDevices: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Subsystem:      metricsSubsystem,
			Name:           "prepared_devices",
			Help:           "Devices currently prepared, by kind (gpu, mig, shared).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"kind"}),
		recoveredActions: metrics.NewCounterVec(&metrics.CounterOpts{
			Subsystem:      metricsSubsystem,
			Name:           "startup_recovery_actions_total",
			Help:           "What startup reconciliation did, by action (checkpoint_corrupt, checkpoint_foreign_boot, rolled_back, orphan_mig_destroyed, orphan_cdi_removed, mps_stopped).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"action"}),
	}
	m.registry.MustRegister(m.operations, m.errors, m.duration, m.preparedDevices, m.recoveredActions)
	return m
}
