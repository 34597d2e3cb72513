package baseline

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Change is one field that differs between two reports; "-" stands for absent.
type Change struct {
	Field  string `json:"field"`
	Before string `json:"before"`
	After  string `json:"after"`
}

// Diff lists, field by field, what changed from before to after (sorted by field). Nodes,
// GPU types, queues, kinds and mapping failures are matched by name, so an added or removed
// one shows as fields going from or to "-". The report time and window are not compared.
func Diff(before, after Report) []Change {
	a, b := flatten(before), flatten(after)
	var out []Change
	for k, va := range a {
		vb, ok := b[k]
		if !ok {
			vb = "-"
		}
		if va != vb {
			out = append(out, Change{Field: k, Before: va, After: vb})
		}
	}
	for k, vb := range b {
		if _, ok := a[k]; !ok {
			out = append(out, Change{Field: k, Before: "-", After: vb})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

func flatten(r Report) map[string]string {
	m := map[string]string{}
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	opt := func(v *float64) string {
		if v == nil {
			return "none"
		}
		return num(*v)
	}
	t := r.Totals
	for k, v := range map[string]string{
		"totals.gpuNodes": strconv.Itoa(t.GPUNodes), "totals.gpus": strconv.Itoa(t.GPUs), "totals.allocated": num(t.Allocated),
		"totals.utilisation": num(t.Utilisation), "totals.wholeGPUs": strconv.Itoa(t.WholeGPUs), "totals.migGPUs": strconv.Itoa(t.MIGGPUs),
		"totals.sharedGPUs": strconv.Itoa(t.SharedGPUs), "totals.coveredKinds": strconv.Itoa(t.CoveredKinds),
		"totals.uncoveredKinds": strconv.Itoa(t.UncoveredKinds), "totals.mappingErrors": strconv.Itoa(t.MappingErrors),
		"pending.pods": strconv.Itoa(r.Pending.Pods), "pending.wait.count": strconv.Itoa(r.Pending.Wait.Count),
		"pending.wait.p50": num(r.Pending.Wait.P50), "pending.wait.p99": num(r.Pending.Wait.P99), "pending.wait.max": num(r.Pending.Wait.Max),
		"totals.gpuUtilPercent": opt(t.GPUUtilPercent), "totals.gpusWithUtil": strconv.Itoa(t.GPUsWithUtil),
		"totals.unknownGPUsWithUtil": strconv.Itoa(t.UnknownGPUsWithUtil),
	} {
		m[k] = v
	}
	for _, n := range r.Nodes {
		p := "nodes[" + n.Name + "]."
		m[p+"gpus"], m[p+"allocatable"], m[p+"allocated"] = strconv.Itoa(n.GPUs), num(n.Allocatable), num(n.Allocated)
		m[p+"migGPUs"], m[p+"sharedGPUs"] = strconv.Itoa(n.MIGGPUs), strconv.Itoa(n.SharedGPUs)
		m[p+"migInUse"], m[p+"sharedInUse"] = strconv.Itoa(n.MIGInUse), strconv.Itoa(n.SharedInUse)
		m[p+"gpuUtilPercent"], m[p+"gpusWithUtil"] = opt(n.GPUUtilPercent), strconv.Itoa(n.GPUsWithUtil)
	}
	for _, g := range r.GPUTypes {
		m[fmt.Sprintf("gpuTypes[%s %s].count", g.Product, memory(g.MemoryBytes))] = strconv.Itoa(g.Count)
	}
	for _, q := range r.Queues {
		p := "queues[" + q.Name + "]."
		m[p+"allocated"], m[p+"quota"], m[p+"limit"] = num(q.Allocated), opt(q.Quota), opt(q.Limit)
	}
	for _, k := range r.Coverage {
		def := k.Definition
		if def == "" {
			def = "none"
		}
		m["coverage["+k.APIVersion+" "+k.Kind+"]"] = def
	}
	for _, f := range r.MappingErrors {
		m["mappingErrors["+f.Namespace+"/"+f.Name+"]"] = f.Reason
	}
	return m
}

func memory(b int64) string {
	if b <= 0 {
		return "?"
	}
	return strconv.FormatInt(b>>30, 10) + "Gi"
}

// WriteJSON saves the report (what Diff reads back).
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadJSON reads a saved report.
func ReadJSON(rd io.Reader) (Report, error) {
	var r Report
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Report{}, fmt.Errorf("not a baseline report: %w", err)
	}
	return r, nil
}

// WriteTable prints the report for people.
func WriteTable(w io.Writer, r Report) error {
	t := r.Totals
	fmt.Fprintf(w, "Baseline at %s (pending pods sampled over %.0fs)\n", r.Time.UTC().Format("2006-01-02 15:04:05Z"), r.WindowSeconds)
	fmt.Fprintf(w, "%d GPU nodes, %d GPUs (%d whole, %d MIG, %d shared), %.3f GPU units allocated (%.0f%%)\n",
		t.GPUNodes, t.GPUs, t.WholeGPUs, t.MIGGPUs, t.SharedGPUs, t.Allocated, t.Utilisation*100)
	if t.GPUUtilPercent != nil {
		fmt.Fprintf(w, "measured GPU utilisation (DCGM_FI_DEV_GPU_UTIL, mean over the window): %.1f%% over %d GPUs", *t.GPUUtilPercent, t.GPUsWithUtil)
		if t.UnknownGPUsWithUtil > 0 {
			fmt.Fprintf(w, " (%d more GPUs reported that no node agent publishes)", t.UnknownGPUsWithUtil)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "GPU utilisation not measured (allocation only; --dcgm-url reads dcgm-exporter)")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU TYPE\tMEMORY\tCOUNT")
	for _, g := range r.GPUTypes {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", orDash(g.Product), memory(g.MemoryBytes), g.Count)
	}
	fmt.Fprintln(tw, "\t\t")
	fmt.Fprintln(tw, "NODE\tGPUS\tALLOCATED\tMIG (IN USE)\tSHARED (IN USE)\tGPU UTIL")
	for _, n := range r.Nodes {
		util := "-"
		if n.GPUUtilPercent != nil {
			util = fmt.Sprintf("%.1f%% (%d GPUs)", *n.GPUUtilPercent, n.GPUsWithUtil)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%d (%d)\t%d (%d)\t%s\n", n.Name, n.GPUs, n.Allocated, n.MIGGPUs, n.MIGInUse, n.SharedGPUs, n.SharedInUse, util)
	}
	if len(r.Queues) > 0 {
		fmt.Fprintln(tw, "\t\t")
		fmt.Fprintln(tw, "QUEUE\tALLOCATED\tQUOTA\tLIMIT")
		for _, q := range r.Queues {
			fmt.Fprintf(tw, "%s\t%.3f\t%s\t%s\n", q.Name, q.Allocated, optStr(q.Quota), optStr(q.Limit))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	d := r.Pending.Wait
	fmt.Fprintf(w, "\npending pods: %d now; waits of %d pods: p50 %.1fs p99 %.1fs max %.1fs\n", r.Pending.Pods, d.Count, d.P50, d.P99, d.Max)
	var none []string
	for _, k := range r.Coverage {
		if k.Definition == "" {
			none = append(none, k.Kind+" ("+k.APIVersion+")")
		}
	}
	fmt.Fprintf(w, "catalog coverage: %d CRD versions with a definition, %d without", t.CoveredKinds, t.UncoveredKinds)
	if len(none) > 0 {
		fmt.Fprintf(w, ": %s", strings.Join(none, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "mapping errors: %d\n", t.MappingErrors)
	for _, f := range r.MappingErrors {
		fmt.Fprintf(w, "  %s/%s: %s: %s\n", f.Namespace, f.Name, f.Reason, f.Message)
	}
	return nil
}

// WriteDiff prints the changes, one per line.
func WriteDiff(w io.Writer, changes []Change) error {
	if len(changes) == 0 {
		_, err := fmt.Fprintln(w, "no changes")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIELD\tBEFORE\tAFTER")
	for _, c := range changes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Field, c.Before, c.After)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func optStr(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}
