package overview

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Style selects how Render draws.
type Style struct {
	// Color adds ANSI colours (for a terminal).
	Color bool
	// Width is the terminal width; long reasons are cut to fit (0: no limit).
	Width int
}

// Glyphs of a GPU cell: free, partly used (shared or MIG, by quarter), whole,
// tainted.
const (
	glyphFree    = "·"
	glyphLow     = "░"
	glyphHalf    = "▒"
	glyphHigh    = "▓"
	glyphFull    = "█"
	glyphTainted = "✗"
)

func gpuGlyph(g GPU) string {
	switch {
	case g.Tainted:
		return glyphTainted
	case g.Used >= 0.999:
		return glyphFull
	case g.Used >= 0.5:
		return glyphHigh
	case g.Used >= 0.25:
		return glyphHalf
	case g.Used > 0:
		return glyphLow
	}
	return glyphFree
}

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiRed    = "\x1b[31m"
	ansiDim    = "\x1b[2m"
)

// Render writes the overview as `tessera top` shows it.
func Render(w io.Writer, c Cluster, st Style) {
	paint := func(code, s string) string {
		if !st.Color {
			return s
		}
		return code + s + ansiReset
	}
	fmt.Fprintf(w, "%s  %s  GPUs %s used of %d (%.0f%%)  gangs: %d running, %d pending",
		paint(ansiBold, "tessera top"), c.Time.Format("15:04:05"),
		units(c.Totals.GPUsUsed), c.Totals.GPUs, 100*c.Totals.Utilisation, c.Totals.GangsRunning, c.Totals.GangsPending)
	if c.Totals.GangsPending > 0 {
		fmt.Fprintf(w, " (longest wait %s, mean %s)", c.Totals.LongestWait.Round(time.Second), c.Totals.MeanWait.Round(time.Second))
	}
	if c.Totals.GangsFinished > 0 {
		fmt.Fprintf(w, ", %d finished", c.Totals.GangsFinished)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w)
	fmt.Fprintln(w, paint(ansiBold, "NODES")+paint(ansiDim, "  "+glyphFull+" whole  "+glyphHigh+glyphHalf+glyphLow+" MIG/shared in use  "+glyphFree+" free  "+glyphTainted+" unhealthy"))
	if len(c.Nodes) == 0 {
		fmt.Fprintln(w, "  (no GPU nodes publish devices)")
	}
	nameWidth := 4
	for _, n := range c.Nodes {
		nameWidth = max(nameWidth, len(n.Name))
	}
	for _, n := range c.Nodes {
		var cells strings.Builder
		used := 0.0
		product := ""
		modes := map[string]int{}
		for _, g := range n.GPUs {
			glyph := gpuGlyph(g)
			switch {
			case g.Tainted:
				glyph = paint(ansiRed, glyph)
			case g.Used > 0:
				glyph = paint(ansiGreen, glyph)
			}
			cells.WriteString(glyph)
			used += g.Used
			if product == "" {
				product = g.Product
			}
			modes[g.Mode]++
		}
		fmt.Fprintf(w, "  %-*s [%s] %5s/%d  %s%s\n", nameWidth, n.Name, cells.String(), units(used), len(n.GPUs), product, modeSummary(modes))
		for _, g := range n.GPUs {
			if g.Detail != "" && g.Detail != "whole" {
				fmt.Fprintf(w, "  %-*s   gpu-%d %s\n", nameWidth, "", g.Minor, paint(ansiDim, g.Detail))
			}
		}
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, paint(ansiBold, "QUEUES")+paint(ansiDim, "  GPU units: allocated / quota / limit"))
	if len(c.Queues) == 0 {
		fmt.Fprintln(w, "  (no queues)")
	}
	qWidth := 5
	for _, q := range c.Queues {
		qWidth = max(qWidth, len(q.Name)+2*q.Depth)
	}
	for _, q := range c.Queues {
		name := strings.Repeat("  ", q.Depth) + q.Name
		bar := queueBar(q, 20)
		if q.Limit != nil && q.Allocated > *q.Limit+1e-9 {
			bar = paint(ansiRed, bar)
		} else if q.Quota != nil && q.Allocated > *q.Quota+1e-9 {
			bar = paint(ansiYellow, bar) // borrowing
		}
		fmt.Fprintf(w, "  %-*s %s %6s / %-6s / %-6s weight %d", qWidth, name, bar, units(q.Allocated), optUnits(q.Quota), optUnits(q.Limit), q.Weight)
		if q.Requested > q.Allocated+1e-9 {
			fmt.Fprintf(w, "  (%s waiting)", units(q.Requested-q.Allocated))
		}
		fmt.Fprintln(w)
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, paint(ansiBold, "GANGS"))
	if len(c.Gangs) == 0 {
		fmt.Fprintln(w, "  (no gangs)")
	}
	for _, g := range c.Gangs {
		phase := g.Phase
		switch phase {
		case "Pending":
			phase = paint(ansiYellow, fmt.Sprintf("%-9s", phase))
		case "Finished":
			phase = paint(ansiDim, fmt.Sprintf("%-9s", phase))
		default:
			phase = paint(ansiGreen, fmt.Sprintf("%-9s", phase))
		}
		line := fmt.Sprintf("  %s %s/%s  queue %s  min %d  bound %d/%d  running %d", phase, g.Namespace, g.Name, orDash(g.Queue), g.MinMember, g.Scheduled, g.Members, g.Running)
		if g.Succeeded+g.Failed > 0 {
			line += fmt.Sprintf("  done %d", g.Succeeded)
			if g.Failed > 0 {
				line += fmt.Sprintf(" (%d failed)", g.Failed)
			}
		}
		if g.Phase == "Pending" {
			line += fmt.Sprintf("  waiting %s", g.Waiting.Round(time.Second))
		}
		fmt.Fprintln(w, line)
		if g.Reason != "" {
			reason := "why: " + g.Reason
			if st.Width > 8 && len(reason) > st.Width-6 {
				reason = reason[:st.Width-9] + "..."
			}
			fmt.Fprintln(w, "      "+paint(ansiDim, reason))
		}
	}
}

func modeSummary(modes map[string]int) string {
	var parts []string
	for _, m := range []string{"mig", "shared"} {
		if modes[m] > 0 {
			parts = append(parts, strconv.Itoa(modes[m])+" "+m)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func queueBar(q Queue, width int) string {
	scale := 0.0
	for _, v := range []*float64{q.Limit, q.Quota} {
		if v != nil && *v > scale {
			scale = *v
		}
	}
	scale = max(scale, q.Allocated)
	if scale == 0 {
		return "[" + strings.Repeat(glyphFree, width) + "]"
	}
	filled := int(q.Allocated/scale*float64(width) + 0.5)
	quotaAt := -1
	if q.Quota != nil {
		quotaAt = int(*q.Quota / scale * float64(width))
	}
	var b strings.Builder
	b.WriteString("[")
	for i := range width {
		switch {
		case i < filled:
			b.WriteString(glyphFull)
		case i == quotaAt:
			b.WriteString("|")
		default:
			b.WriteString(glyphFree)
		}
	}
	b.WriteString("]")
	return b.String()
}

func units(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func optUnits(v *float64) string {
	if v == nil {
		return "-"
	}
	return units(*v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
