package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/overview"
	"github.com/tessera-gpu/tessera/test/browser"
)

func cluster(pendingReason string) overview.Cluster {
	return overview.Cluster{
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Nodes: []overview.Node{
			{Name: "gpu-node-0", GPUs: []overview.GPU{{Minor: 0, Mode: "whole", Used: 1, Product: "NVIDIA H100 80GB HBM3", Detail: "whole"}, {Minor: 1, Mode: "whole"}}},
			{Name: "gpu-node-1", GPUs: []overview.GPU{
				{Minor: 0, Mode: "mig", Used: 3.0 / 7, Detail: "3/7 slices: 1g.10gb×3", Product: "NVIDIA H100 80GB HBM3"},
				{Minor: 4, Mode: "shared", Used: 0.25, Detail: "20Gi of 80Gi"},
				{Minor: 5, Mode: "whole", Tainted: true},
			}},
		},
		Queues: []overview.Queue{
			{Name: "research", Allocated: 16.68, Requested: 26.68, Quota: ptr.To(24.0), Limit: ptr.To(24.0), Weight: 1},
			{Name: "team-b", Parent: "research", Depth: 1, Allocated: 10, Quota: ptr.To(8.0), Limit: ptr.To(24.0), Weight: 1},
		},
		Gangs: []overview.Gang{
			{Namespace: "team-b", Name: "job-train-b", Queue: "team-b", Phase: "Pending", MinMember: 10, Members: 10,
				Reason: pendingReason, ReasonCode: "QuotaExceeded", Waiting: 42 * time.Second},
			{Namespace: "team-a", Name: "job-train-a", Queue: "team-a", Phase: "Running", MinMember: 16, Members: 16, Scheduled: 16, Running: 16},
		},
		Totals: overview.Totals{GPUs: 5, GPUsUsed: 1.68, Utilisation: 0.336, GangsPending: 1, GangsRunning: 1, LongestWait: 42 * time.Second, MeanWait: 42 * time.Second},
	}
}

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func TestPageShowsTheOverview(t *testing.T) {
	src := overview.SourceFunc(func(context.Context, time.Time) (overview.Cluster, error) {
		return cluster(`queue "research" would use 26.68 of gpu, above its limit 24`), nil
	})
	srv := httptest.NewServer(Handler(src, Options{}))
	defer srv.Close()

	code, body, hdr := get(t, srv.URL+"/")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %s", code, hdr.Get("Content-Type"))
	}
	for _, want := range []string{
		`<tr class="node" data-node="gpu-node-0">`,
		`<div class="gpu whole mode-whole" title="gpu-0 · whole · 1 used · whole">`,
		`<div class="gpu part mode-mig" title="gpu-0 · mig · 0.43 used · 3/7 slices: 1g.10gb×3">`,
		`<div class="gpu part mode-shared" title="gpu-4 · shared · 0.25 used · 20Gi of 80Gi">`,
		`<div class="gpu tainted mode-whole"`,
		`gpu-0 3/7 slices: 1g.10gb×3 · gpu-4 20Gi of 80Gi`,
		`<td class="num">16.68 / 24 / 24</td>`,
		`<div class="bar borrowing"><div class="fill" style="width:41.7%">`, // team-b: 10 of 24, over its quota 8
		`<span class="code">QuotaExceeded</span>queue &#34;research&#34; would use 26.68 of gpu, above its limit 24`,
		`<td class="num">42s</td>`,
		`1.68 / 5</b><span>GPUs used (33.6%)`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	// Self-contained: no script, style, image or font from elsewhere.
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`).FindString(body); m != "" {
		t.Errorf("page loads an external asset: %s", m)
	}
	if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}

	_, frag, _ := get(t, srv.URL+"/?fragment=1")
	if strings.Contains(frag, "<html") || !strings.Contains(frag, `id="gangs"`) {
		t.Errorf("fragment is not the overview alone:\n%.300s", frag)
	}
	code, js, _ := get(t, srv.URL+"/overview.json")
	var back overview.Cluster
	if err := json.Unmarshal([]byte(js), &back); code != 200 || err != nil || back.Gangs[0].ReasonCode != "QuotaExceeded" {
		t.Errorf("overview.json: %d %v %+v", code, err, back.Gangs)
	}
	if code, _, _ := get(t, srv.URL+"/nope"); code != 404 {
		t.Errorf("GET /nope = %d", code)
	}
}

func TestPageWithoutOverviewSaysSo(t *testing.T) {
	srv := httptest.NewServer(Handler(overview.SourceFunc(func(context.Context, time.Time) (overview.Cluster, error) {
		return overview.Cluster{}, errors.New("connection refused")
	}), Options{}))
	defer srv.Close()
	code, body, _ := get(t, srv.URL+"/?fragment=1")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "connection refused") {
		t.Errorf("= %d %q", code, body)
	}
}

// TestPageRefreshesInBrowser loads the page in headless chromium: the first
// overview is served with the page, later ones by the page's own refresh,
// without a reload. The DOM taken after a few seconds of virtual time shows
// the later overview.
func TestPageRefreshesInBrowser(t *testing.T) {
	if _, err := browser.Path(); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	src := overview.SourceFunc(func(context.Context, time.Time) (overview.Cluster, error) {
		if calls.Add(1) == 1 {
			return cluster("first answer"), nil
		}
		c := cluster("a later answer, fetched by the page")
		c.Nodes = append(c.Nodes, overview.Node{Name: "gpu-node-new", GPUs: []overview.GPU{{Minor: 0, Mode: "whole"}}})
		return c, nil
	})
	srv := httptest.NewServer(Handler(src, Options{Refresh: 500 * time.Millisecond}))
	defer srv.Close()
	dom, err := browser.DumpDOM(context.Background(), srv.URL+"/", browser.Options{Budget: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`data-node="gpu-node-new"`, "a later answer, fetched by the page", `id="status" class="">live · `} {
		if !strings.Contains(dom, want) {
			t.Errorf("DOM after refresh lacks %q:\n%.2000s", want, dom)
		}
	}
	if calls.Load() < 2 {
		t.Errorf("the page never fetched a new overview (%d calls)", calls.Load())
	}
}
