package scheduler

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

const subsystem = "tessera_scheduler"

var (
	gangsPending = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "gangs_pending",
		Help: "Gangs waiting to be placed at the end of the last cycle.", StabilityLevel: metrics.ALPHA,
	})
	gangsAdmitted = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "gangs_admitted_total",
		Help: "Gangs placed and committed.", StabilityLevel: metrics.ALPHA,
	})
	podsBound = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "pods_bound_total",
		Help: "Pods bound.", StabilityLevel: metrics.ALPHA,
	})
	solveLatency = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "solve_duration_seconds",
		Help:    "Time to search a placement for one gang.",
		Buckets: metrics.ExponentialBuckets(0.0001, 2, 16), StabilityLevel: metrics.ALPHA,
	})
	decideLatency = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "decide_duration_seconds",
		Help:    "Time to decide one cycle (all gangs, simulations included).",
		Buckets: metrics.ExponentialBuckets(0.0001, 2, 18), StabilityLevel: metrics.ALPHA,
	})
	wallClockAborts = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "solver_wall_clock_aborts_total",
		Help: "Gang searches ended by the solver's last-resort wall-clock guard (the work bounds did not stop them in time).", StabilityLevel: metrics.ALPHA,
	})
	bindRollbacks = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "bind_rollbacks_total",
		Help: "Gangs whose binding failed part-way and whose bound pods were evicted so that the gang is not left half-bound.", StabilityLevel: metrics.ALPHA,
	})
	apiWrites = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "api_writes_total",
		Help: "Writes of the effects layer by kind (status, pod condition, event, PodGroup, eviction).", StabilityLevel: metrics.ALPHA,
	}, []string{"kind"})
	searchesUnchanged = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "searches_unchanged_total",
		Help: "Searches of waiting gangs not run again because nothing they read changed since they last failed (answered with that failure).", StabilityLevel: metrics.ALPHA,
	})
	commitErrors = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "commit_errors_total",
		Help: "Gang commits that failed and were undone.", StabilityLevel: metrics.ALPHA,
	})
	queueAllocated = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "queue_allocated",
		Help: "Usage of a queue (with its descendants) per resource: GPU units, CPU cores, memory bytes.", StabilityLevel: metrics.ALPHA,
	}, []string{"queue", "resource"})
	queueRequested = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "queue_requested",
		Help: "Usage plus waiting demand of a queue per resource.", StabilityLevel: metrics.ALPHA,
	}, []string{"queue", "resource"})
	victimSets = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "victim_sets_simulated_total",
		Help: "Victim sets simulated (the gang searched on the cluster without them) by rule: preemption, reclaim, consolidation.", StabilityLevel: metrics.ALPHA,
	}, []string{"rule"})
)

var registerOnce sync.Once

// RegisterMetrics registers the scheduler's metrics with the component-base legacy registry
// (served by legacyregistry.Handler()).
func RegisterMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(gangsPending, gangsAdmitted, podsBound, solveLatency, decideLatency, wallClockAborts, bindRollbacks, apiWrites, searchesUnchanged, commitErrors, queueAllocated, queueRequested, victimSets)
	})
}
