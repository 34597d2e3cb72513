// Package shadowreport turns the ShadowReports of tessera's shadow mode into the comparison a
// platform team reads before switching schedulers: per gang and in total, how long gangs took
// from ready to fully bound under the scheduler in use against the cycles tessera would have
// needed, how long gangs sat partly placed, deadlocks, gangs one would have placed and the
// other did not, GPU fragmentation and quota violations the other scheduler allowed. The
// scheduler's shadow mode exports the same totals as metrics; `tessera report shadow` prints
// them. It reads report objects only (no scheduler package), so the CLI can use it.
package shadowreport

import (
	"sort"
	"time"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Gang is one gang's comparison.
type Gang struct {
	Namespace     string `json:"namespace"`
	Name          string `json:"name"`
	Workload      string `json:"workload,omitempty"`
	SchedulerName string `json:"schedulerName"`
	Queue         string `json:"queue,omitempty"`
	MinMember     int32  `json:"minMember"`
	Pods          int32  `json:"pods"`
	Ready         bool   `json:"ready"`
	Ended         bool   `json:"ended"`
	// MappedReason is how the catalog mapped the gang; MappingError is set when it could not
	// (the reason and the catalog's message), the pods falling back to gangs of one.
	MappedReason string `json:"mappedReason,omitempty"`
	MappingError string `json:"mappingError,omitempty"`

	// ActualBound is how many pods the scheduler in use bound; ActualPlaced whether it
	// bound minMember of them.
	ActualBound  int32 `json:"actualBound"`
	ActualPlaced bool  `json:"actualPlaced"`
	// ActualReadyToBoundSeconds: from ready to fully bound (unset when it never was).
	ActualReadyToBoundSeconds *float64 `json:"actualReadyToBoundSeconds,omitempty"`
	// PartialSeconds is how long some but fewer than minMember pods were bound (to now
	// while that lasts); MaxPartial the most pods bound meanwhile.
	PartialSeconds float64 `json:"partialSeconds"`
	MaxPartial     int32   `json:"maxPartial,omitempty"`
	Deadlocked     bool    `json:"deadlocked"`
	QuotaViolation string  `json:"quotaViolation,omitempty"`
	ActualNodes    int     `json:"actualNodes"`

	// TesseraDecision is Placed, Waiting or "" (not ready).
	TesseraDecision string `json:"tesseraDecision"`
	TesseraReason   string `json:"tesseraReason,omitempty"`
	TesseraMessage  string `json:"tesseraMessage,omitempty"`
	// TesseraCycles: decision cycles from ready to placement (or waited, once ended).
	TesseraCycles int32 `json:"tesseraCycles"`
	// TesseraReadyToPlacedSeconds: from ready to the cycle that would have placed it.
	TesseraReadyToPlacedSeconds *float64 `json:"tesseraReadyToPlacedSeconds,omitempty"`
	TesseraNodes                int      `json:"tesseraNodes"`

	ActualFragmentationPercent  *int32 `json:"actualFragmentationPercent,omitempty"`
	TesseraFragmentationPercent *int32 `json:"tesseraFragmentationPercent,omitempty"`
}

// Totals sum the gangs up.
type Totals struct {
	Gangs int `json:"gangs"`
	Ready int `json:"ready"`
	// PlacedByBoth, PlacedByActualOnly (the scheduler in use placed it, tessera would not
	// have), PlacedByTesseraOnly (tessera would have, the other did not), PlacedByNeither.
	PlacedByBoth        int `json:"placedByBoth"`
	PlacedByActualOnly  int `json:"placedByActualOnly"`
	PlacedByTesseraOnly int `json:"placedByTesseraOnly"`
	PlacedByNeither     int `json:"placedByNeither"`
	// PartiallyPlaced counts gangs that were ever partly placed; PartialSeconds adds up
	// their partial spans.
	PartiallyPlaced int     `json:"partiallyPlaced"`
	PartialSeconds  float64 `json:"partialSeconds"`
	Deadlocks       int     `json:"deadlocks"`
	QuotaViolations int     `json:"quotaViolations"`
	// MappingErrors counts gangs whose pods the catalog could not map, by reason.
	MappingErrors map[string]int `json:"mappingErrors,omitempty"`
	// Ready to fully bound under the scheduler in use, and ready to placed by tessera, over
	// the gangs where it happened.
	ActualReadyToBound  Distribution `json:"actualReadyToBound"`
	TesseraReadyToPlace Distribution `json:"tesseraReadyToPlace"`
	// TesseraCycles is the distribution of cycles tessera needed (placed gangs).
	TesseraCycles Distribution `json:"tesseraCycles"`
	// Mean fragmentation (percent) right after placements, over the gangs both placed.
	ActualFragmentationPercent  *float64 `json:"actualFragmentationPercent,omitempty"`
	TesseraFragmentationPercent *float64 `json:"tesseraFragmentationPercent,omitempty"`
}

// Distribution of a measure over gangs.
type Distribution struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Summary is the comparison of all reports.
type Summary struct {
	Time   time.Time `json:"time"`
	Gangs  []Gang    `json:"gangs"`
	Totals Totals    `json:"totals"`
}

// Summarize compares every report; now closes spans still open.
func Summarize(reports []shadowv1.ShadowReport, now time.Time) Summary {
	s := Summary{Time: now, Gangs: []Gang{}}
	var actual, tess, cycles []float64
	var fragA, fragT []float64
	for i := range reports {
		g := Compare(&reports[i], now)
		s.Gangs = append(s.Gangs, g)
		t := &s.Totals
		t.Gangs++
		if g.Ready {
			t.Ready++
		}
		placedT := g.TesseraDecision == shadowv1.DecisionPlaced
		switch {
		case g.ActualPlaced && placedT:
			t.PlacedByBoth++
		case g.ActualPlaced:
			t.PlacedByActualOnly++
		case placedT:
			t.PlacedByTesseraOnly++
		default:
			t.PlacedByNeither++
		}
		if g.MaxPartial > 0 {
			t.PartiallyPlaced++
			t.PartialSeconds += g.PartialSeconds
		}
		if g.Deadlocked {
			t.Deadlocks++
		}
		if g.QuotaViolation != "" {
			t.QuotaViolations++
		}
		if g.MappingError != "" {
			if t.MappingErrors == nil {
				t.MappingErrors = map[string]int{}
			}
			t.MappingErrors[g.MappedReason]++
		}
		if g.ActualReadyToBoundSeconds != nil {
			actual = append(actual, *g.ActualReadyToBoundSeconds)
		}
		if g.TesseraReadyToPlacedSeconds != nil {
			tess = append(tess, *g.TesseraReadyToPlacedSeconds)
		}
		if placedT {
			cycles = append(cycles, float64(g.TesseraCycles))
		}
		if g.ActualFragmentationPercent != nil && g.TesseraFragmentationPercent != nil {
			fragA = append(fragA, float64(*g.ActualFragmentationPercent))
			fragT = append(fragT, float64(*g.TesseraFragmentationPercent))
		}
	}
	s.Totals.ActualReadyToBound = Distribute(actual)
	s.Totals.TesseraReadyToPlace = Distribute(tess)
	s.Totals.TesseraCycles = Distribute(cycles)
	if len(fragA) > 0 {
		a, t := Distribute(fragA).Mean, Distribute(fragT).Mean
		s.Totals.ActualFragmentationPercent, s.Totals.TesseraFragmentationPercent = &a, &t
	}
	sort.Slice(s.Gangs, func(i, j int) bool {
		if s.Gangs[i].Namespace != s.Gangs[j].Namespace {
			return s.Gangs[i].Namespace < s.Gangs[j].Namespace
		}
		return s.Gangs[i].Name < s.Gangs[j].Name
	})
	return s
}

// mappingErrorReasons are the Mapped reasons of pods the catalog could not map (the
// scheduler's mapper: controlplane/mapper).
var mappingErrorReasons = map[string]bool{
	v1alpha1.ReasonUnknownWorkload: true, v1alpha1.ReasonNoComponent: true, v1alpha1.ReasonCatalogUnavailable: true,
}

// Compare reads one report.
func Compare(r *shadowv1.ShadowReport, now time.Time) Gang {
	g := Gang{
		Namespace: r.Gang.Namespace, Name: r.Gang.Name, Workload: r.Gang.Workload, SchedulerName: r.Gang.SchedulerName,
		Queue: r.Gang.Queue, MinMember: r.Gang.MinMember, Pods: r.Gang.Pods,
		Ready: r.Gang.ReadyTime != nil, Ended: r.Gang.EndedTime != nil,
		ActualBound: r.Actual.Bound, ActualPlaced: r.Actual.FullyBoundTime != nil, MaxPartial: r.Actual.MaxPartial,
		Deadlocked: r.Actual.DeadlockTime != nil, QuotaViolation: r.Actual.QuotaViolation, ActualNodes: len(r.Actual.Nodes),
		TesseraDecision: r.Tessera.Decision, TesseraReason: r.Tessera.Reason, TesseraMessage: r.Tessera.Message,
		TesseraCycles: r.Tessera.Cycles, TesseraNodes: len(r.Tessera.Nodes),
		ActualFragmentationPercent: r.Actual.FragmentationPercent, TesseraFragmentationPercent: r.Tessera.FragmentationPercent,
	}
	if mappingErrorReasons[r.Gang.MappedReason] {
		g.MappingError = r.Gang.MappedReason + ": " + r.Gang.MappedMessage
	}
	g.MappedReason = r.Gang.MappedReason
	end := now
	if r.Gang.EndedTime != nil {
		end = r.Gang.EndedTime.Time
	}
	if st := r.Actual.PartialStartTime; st != nil {
		until := end
		if r.Actual.PartialEndTime != nil {
			until = r.Actual.PartialEndTime.Time
		}
		g.PartialSeconds = max(0, until.Sub(st.Time).Seconds())
	}
	if r.Gang.ReadyTime != nil {
		if fb := r.Actual.FullyBoundTime; fb != nil {
			v := max(0, fb.Sub(r.Gang.ReadyTime.Time).Seconds())
			g.ActualReadyToBoundSeconds = &v
		}
		if dt := r.Tessera.DecidedTime; dt != nil && r.Tessera.Decision == shadowv1.DecisionPlaced {
			v := max(0, dt.Sub(r.Gang.ReadyTime.Time).Seconds())
			g.TesseraReadyToPlacedSeconds = &v
		}
	}
	return g
}

// Distribute computes count, mean, p50, p99 (nearest rank) and max.
func Distribute(values []float64) Distribution {
	d := Distribution{Count: len(values)}
	if len(values) == 0 {
		return d
	}
	v := append([]float64(nil), values...)
	sort.Float64s(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	d.Mean, d.Max = sum/float64(len(v)), v[len(v)-1]
	d.P50, d.P99 = Percentile(v, 50), Percentile(v, 99)
	return d
}

// Percentile is the nearest-rank percentile of sorted values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(float64(len(sorted))*p/100+0.999999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}
