package draplugin

import (
	"fmt"

	"k8s.io/component-base/metrics"
)

const metricsSubsystem = "tessera_draplugin"

// pluginMetrics are the plugin's Prometheus metrics, registered in
// Options.Registry or, by default, in a registry of the plugin's own
// (Plugin.Registry), so that tests can run several instances.
type pluginMetrics struct {
	registry         metrics.KubeRegistry
	operations       *metrics.CounterVec
	errors           *metrics.CounterVec
	duration         *metrics.HistogramVec
	preparedDevices  *metrics.GaugeVec
	recoveredActions *metrics.CounterVec
}

func newMetrics(reg metrics.KubeRegistry) (*pluginMetrics, error) {
	if reg == nil {
		reg = metrics.NewKubeRegistry()
	}
	m := &pluginMetrics{
		registry: reg,
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
	for _, c := range []metrics.Registerable{m.operations, m.errors, m.duration, m.preparedDevices, m.recoveredActions} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register DRA plugin metrics: %w", err)
		}
	}
	// Zero from the start, so that rates and the TesseraPrepareErrors alert
	// see the first error (a series that appears at 1 has no increase).
	for _, op := range []string{"prepare", "unprepare"} {
		m.operations.WithLabelValues(op)
		m.errors.WithLabelValues(op)
	}
	return m, nil
}
