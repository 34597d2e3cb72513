// Package web serves the overview of `tessera top` as a web page: nodes with
// their GPUs (whole, MIG slices, shares), queue bars against quota and limit,
// and gangs with why they wait. The page is one self-contained HTML document
// (styles and script inline, no external assets, no JavaScript library)
// that refreshes its overview in place every second; /overview.json is the
// same data for scripts (as `tessera get -o json`).
package web

import (
	"bytes"
	_ "embed" // the page template
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/controlplane/overview"
)

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"units": units,
	"pct":   func(v float64) string { return strconv.FormatFloat(math.Round(v*1000)/10, 'f', -1, 64) },
	"dur":   func(d time.Duration) string { return d.Round(time.Second).String() },
	"clock": func(t time.Time) string { return t.Format("15:04:05") },
}).Parse(pageHTML))

// Options tune the page.
type Options struct {
	// Refresh is how often the page fetches a new overview (default 1s).
	Refresh time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Handler serves "/" (the page; "/?fragment=1" is the overview part alone,
// which the page fetches to refresh) and "/overview.json".
func Handler(src overview.Source, opts Options) http.Handler {
	if opts.Refresh <= 0 {
		opts.Refresh = time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		c, err := src.Overview(r.Context(), opts.Now())
		fragment := r.URL.Query().Get("fragment") != ""
		if err != nil {
			// The page keeps its last overview and says it is stale.
			http.Error(w, "no overview: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		v := newView(c)
		v.RefreshMillis = opts.Refresh.Milliseconds()
		name := "page"
		if fragment {
			name = "overview"
		}
		var buf bytes.Buffer
		if err := page.ExecuteTemplate(&buf, name, v); err != nil {
			http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		// Nothing but this document: no scripts, styles, frames or
		// connections from elsewhere.
		w.Header().Set("Content-Security-Policy", "default-src 'none'; connect-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'self' data:")
		_, _ = w.Write(buf.Bytes())
	})
	mux.HandleFunc("GET /overview.json", func(w http.ResponseWriter, r *http.Request) {
		c, err := src.Overview(r.Context(), opts.Now())
		if err != nil {
			http.Error(w, "no overview: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(c)
	})
	return mux
}

// view is what the template draws.
type view struct {
	overview.Cluster
	RefreshMillis int64
	Nodes         []nodeView
	Queues        []queueView
	Gangs         []overview.Gang
}

type nodeView struct {
	Name    string
	Product string
	Used    float64
	GPUs    int
	Modes   string
	Cells   []cellView
	Details []string
}

type cellView struct {
	Label string
	Class string // free, part, whole, tainted
	Mode  string // whole, mig, shared
	Fill  string // percent of the cell filled
	Title string
}

type queueView struct {
	overview.Queue
	Indent   int // pixels
	Fill     string
	QuotaAt  string // percent, "" without quota
	LimitAt  string
	Class    string // "", borrowing, over
	Waiting  float64
	QuotaTxt string
	LimitTxt string
}

func newView(c overview.Cluster) view {
	v := view{Cluster: c, Gangs: c.Gangs}
	for _, n := range c.Nodes {
		nv := nodeView{Name: n.Name, GPUs: len(n.GPUs)}
		modes := map[string]int{}
		for _, g := range n.GPUs {
			nv.Used += g.Used
			if nv.Product == "" {
				nv.Product = g.Product
			}
			modes[g.Mode]++
			cell := cellView{Label: strconv.Itoa(g.Minor), Fill: percent(g.Used), Mode: g.Mode}
			switch {
			case g.Tainted:
				cell.Class = "tainted"
			case g.Used >= 0.999:
				cell.Class = "whole"
			case g.Used > 0:
				cell.Class = "part"
			default:
				cell.Class = "free"
			}
			title := fmt.Sprintf("gpu-%d · %s · %s used", g.Minor, g.Mode, units(g.Used))
			if g.Detail != "" {
				title += " · " + g.Detail
			}
			if g.Tainted {
				title += " · unhealthy (tainted)"
			}
			if len(g.Claims) > 0 {
				title += " · " + strings.Join(g.Claims, ", ")
			}
			cell.Title = title
			nv.Cells = append(nv.Cells, cell)
			if g.Detail != "" && g.Detail != "whole" {
				nv.Details = append(nv.Details, fmt.Sprintf("gpu-%d %s", g.Minor, g.Detail))
			}
		}
		var parts []string
		for _, m := range []string{"mig", "shared"} {
			if modes[m] > 0 {
				parts = append(parts, strconv.Itoa(modes[m])+" "+m)
			}
		}
		nv.Modes = strings.Join(parts, ", ")
		v.Nodes = append(v.Nodes, nv)
	}
	for _, q := range c.Queues {
		scale := q.Allocated
		for _, p := range []*float64{q.Quota, q.Limit} {
			if p != nil {
				scale = max(scale, *p)
			}
		}
		qv := queueView{Queue: q, Indent: 8 + 18*q.Depth, QuotaTxt: "-", LimitTxt: "-", Waiting: math.Max(0, q.Requested-q.Allocated)}
		if scale > 0 {
			qv.Fill = percent(q.Allocated / scale)
			if q.Quota != nil {
				qv.QuotaAt = percent(*q.Quota / scale)
			}
			if q.Limit != nil {
				qv.LimitAt = percent(*q.Limit / scale)
			}
		} else {
			qv.Fill = "0"
		}
		if q.Quota != nil {
			qv.QuotaTxt = units(*q.Quota)
		}
		if q.Limit != nil {
			qv.LimitTxt = units(*q.Limit)
		}
		switch {
		case q.Limit != nil && q.Allocated > *q.Limit+1e-9:
			qv.Class = "over"
		case q.Quota != nil && q.Allocated > *q.Quota+1e-9:
			qv.Class = "borrowing"
		}
		v.Queues = append(v.Queues, qv)
	}
	return v
}

func percent(f float64) string {
	return strconv.FormatFloat(math.Round(math.Min(math.Max(f, 0), 1)*1000)/10, 'f', -1, 64)
}

// units prints GPU units as `tessera top` does: integers plain, else two
// decimals.
func units(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
