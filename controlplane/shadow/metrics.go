package shadow

import (
	"sync"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
)

const subsystem = "tessera_shadow"

var (
	decideLatency = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "decide_duration_seconds",
		Help:    "Time to decide one shadow cycle (tessera's decision function on the counterfactual snapshot).",
		Buckets: metrics.ExponentialBuckets(0.0001, 2, 18), StabilityLevel: metrics.ALPHA,
	})
	cyclesNeeded = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: subsystem, Name: "decision_cycles",
		Help:    "Decision cycles tessera needed from a gang's readiness to its placement (the placing cycle included).",
		Buckets: []float64{1, 2, 3, 5, 10, 20, 50, 100, 300, 1000}, StabilityLevel: metrics.ALPHA,
	})
	quotaViolations = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "quota_violations_total",
		Help: "Gangs whose binding by the scheduler in use took their queue (or an ancestor) beyond its limit.", StabilityLevel: metrics.ALPHA,
	}, []string{"queue"})
	reportWrites = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: subsystem, Name: "report_writes_total",
		Help: "Writes of ShadowReports by verb (create, update, delete): the only writes of shadow mode.", StabilityLevel: metrics.ALPHA,
	}, []string{"verb"})
	gangsPlacedBy = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "gangs",
		Help: "Reported gangs by who placed them: both, actual_only (the scheduler in use, not tessera), tessera_only, neither.", StabilityLevel: metrics.ALPHA,
	}, []string{"placed_by"})
	partialGangs = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "gangs_partially_placed",
		Help: "Reported gangs that were partly placed (some but fewer than minMember pods bound) for at least a second.", StabilityLevel: metrics.ALPHA,
	})
	partialSeconds = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "partial_placement_seconds",
		Help: "Seconds reported gangs spent partly placed, added up (spans still open counted to now).", StabilityLevel: metrics.ALPHA,
	})
	deadlocks = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "deadlocked_gangs",
		Help: "Reported gangs found deadlocked: partly placed, the rest unschedulable, no progress for the deadlock timeout.", StabilityLevel: metrics.ALPHA,
	})
	quotaViolating = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "quota_violating_gangs",
		Help: "Reported gangs whose binding took a queue beyond its limit.", StabilityLevel: metrics.ALPHA,
	})
	readyToPlaced = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "ready_to_placed_seconds",
		Help: "Time from a gang's readiness to its placement over the reported gangs, by who placed it (actual: fully bound by the scheduler in use; tessera: the cycle that would have placed it) and quantile (0.5, 0.99, or mean).", StabilityLevel: metrics.ALPHA,
	}, []string{"by", "quantile"})
	fragmentationRatio = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: subsystem, Name: "gpu_fragmentation_ratio",
		Help: "Mean GPU fragmentation (free GPU units on partly used nodes over all free units) right after placements, over the gangs both placed, by who placed them.", StabilityLevel: metrics.ALPHA,
	}, []string{"by"})
)

var registerOnce sync.Once

// RegisterMetrics registers the shadow's metrics with the legacy registry (once).
func RegisterMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(decideLatency, cyclesNeeded, quotaViolations, reportWrites, gangsPlacedBy, partialGangs,
			partialSeconds, deadlocks, quotaViolating, readyToPlaced, fragmentationRatio)
	})
}

// reportSnapshot is the reports as the last cycle left them.
type reportSnapshot = shadowv1.ShadowReport

// publish keeps a copy of the reports for Reports and sets the total gauges.
func (s *Shadow) publish(now time.Time) {
	list := make([]shadowv1.ShadowReport, 0, len(s.records))
	for _, rec := range s.records {
		r := rec.report.DeepCopy()
		if r.Gang.EndedTime == nil && r.Tessera.Decision != shadowv1.DecisionPlaced {
			r.Tessera.Cycles = rec.cycles
		}
		list = append(list, *r)
	}
	s.reportsMu.Lock()
	s.reports = list
	s.reportsMu.Unlock()
	sum := shadowreport.Summarize(list, now)
	t := sum.Totals
	gangsPlacedBy.WithLabelValues("both").Set(float64(t.PlacedByBoth))
	gangsPlacedBy.WithLabelValues("actual_only").Set(float64(t.PlacedByActualOnly))
	gangsPlacedBy.WithLabelValues("tessera_only").Set(float64(t.PlacedByTesseraOnly))
	gangsPlacedBy.WithLabelValues("neither").Set(float64(t.PlacedByNeither))
	partialGangs.Set(float64(t.PartiallyPlaced))
	partialSeconds.Set(t.PartialSeconds)
	deadlocks.Set(float64(t.Deadlocks))
	quotaViolating.Set(float64(t.QuotaViolations))
	for by, d := range map[string]shadowreport.Distribution{"actual": t.ActualReadyToBound, "tessera": t.TesseraReadyToPlace} {
		readyToPlaced.WithLabelValues(by, "0.5").Set(d.P50)
		readyToPlaced.WithLabelValues(by, "0.99").Set(d.P99)
		readyToPlaced.WithLabelValues(by, "mean").Set(d.Mean)
	}
	if t.ActualFragmentationPercent != nil {
		fragmentationRatio.WithLabelValues("actual").Set(*t.ActualFragmentationPercent / 100)
		fragmentationRatio.WithLabelValues("tessera").Set(*t.TesseraFragmentationPercent / 100)
	}
}

// Reports returns the reports as the last cycle left them (the waiting gangs' cycle counts
// included, which the written reports carry only once the gang is placed or ended).
func (s *Shadow) Reports() []shadowv1.ShadowReport {
	s.reportsMu.Lock()
	defer s.reportsMu.Unlock()
	return append([]shadowv1.ShadowReport(nil), s.reports...)
}
