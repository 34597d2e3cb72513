package shadowreport

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
)

// Load lists the ShadowReports of a namespace ("" for all), read only.
func Load(ctx context.Context, dyn dynamic.Interface, namespace string) ([]shadowv1.ShadowReport, error) {
	list, err := dyn.Resource(shadowv1.Resource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ShadowReports (is the CRD installed, and tessera-scheduler running with --shadow?): %w", err)
	}
	out := make([]shadowv1.ShadowReport, 0, len(list.Items))
	for i := range list.Items {
		var r shadowv1.ShadowReport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &r); err != nil {
			return nil, fmt.Errorf("ShadowReport %s/%s: %w", list.Items[i].GetNamespace(), list.Items[i].GetName(), err)
		}
		out = append(out, r)
	}
	return out, nil
}

// WriteJSON prints the summary as indented JSON.
func WriteJSON(w io.Writer, s Summary) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// WriteTable prints one line per gang, then the totals.
func WriteTable(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tGANG\tWORKLOAD\tSCHEDULER\tBOUND\tREADY→BOUND\tPARTIAL\tTESSERA\tCYCLES\tREADY→PLACED\tNOTES")
	for _, g := range s.Gangs {
		workload := g.Workload
		if workload == "" {
			workload = "-"
		}
		tess := g.TesseraDecision
		if tess == "" {
			tess = "NotReady"
		} else if g.TesseraReason != "" && g.TesseraDecision != shadowv1.DecisionPlaced {
			tess += "/" + g.TesseraReason
		}
		partial := "-"
		if g.MaxPartial > 0 {
			partial = fmt.Sprintf("%s (max %d)", seconds(&g.PartialSeconds), g.MaxPartial)
		}
		var notes []string
		if g.Deadlocked {
			notes = append(notes, "deadlocked")
		}
		if g.QuotaViolation != "" {
			notes = append(notes, "quota violated: "+g.QuotaViolation)
		}
		if g.MappingError != "" {
			notes = append(notes, "mapping: "+g.MappingError)
		}
		if g.Ended {
			notes = append(notes, "ended")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%d\t%s\t%s\n", g.Namespace, g.Name, workload, g.SchedulerName,
			g.ActualBound, g.MinMember, seconds(g.ActualReadyToBoundSeconds), partial, tess, g.TesseraCycles,
			seconds(g.TesseraReadyToPlacedSeconds), strings.Join(notes, "; "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	t := s.Totals
	fmt.Fprintf(w, "\n%d gangs (%d ready): placed by both %d, only by the scheduler in use %d, only by tessera %d, by neither %d\n",
		t.Gangs, t.Ready, t.PlacedByBoth, t.PlacedByActualOnly, t.PlacedByTesseraOnly, t.PlacedByNeither)
	fmt.Fprintf(w, "ready → fully bound (scheduler in use): %s\n", dist(t.ActualReadyToBound, "s"))
	fmt.Fprintf(w, "ready → placed (tessera): %s; cycles %s\n", dist(t.TesseraReadyToPlace, "s"), dist(t.TesseraCycles, ""))
	fmt.Fprintf(w, "partly placed: %d gangs, %.1f s in all; deadlocks: %d; quota violations: %d\n", t.PartiallyPlaced, t.PartialSeconds, t.Deadlocks, t.QuotaViolations)
	if t.ActualFragmentationPercent != nil {
		fmt.Fprintf(w, "GPU fragmentation after placement (gangs both placed): %.0f%% actual, %.0f%% tessera\n", *t.ActualFragmentationPercent, *t.TesseraFragmentationPercent)
	}
	if len(t.MappingErrors) > 0 {
		var parts []string
		for _, r := range sortedReasons(t.MappingErrors) {
			parts = append(parts, fmt.Sprintf("%s %d", r, t.MappingErrors[r]))
		}
		fmt.Fprintf(w, "mapping errors: %s\n", strings.Join(parts, ", "))
	} else {
		fmt.Fprintln(w, "mapping errors: none")
	}
	return nil
}

func seconds(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1fs", *v)
}

func dist(d Distribution, unit string) string {
	if d.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("n=%d p50 %.1f%s p99 %.1f%s max %.1f%s", d.Count, d.P50, unit, d.P99, unit, d.Max, unit)
}

func sortedReasons(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
