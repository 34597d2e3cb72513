package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/internal/metricsconv"
	"github.com/tessera-gpu/tessera/test/framework"
)

// scrapeWhile scrapes url every period until the returned function is
// called, which returns every metric family seen (name → type).
func scrapeWhile(t *testing.T, url string, period time.Duration) func() map[string]dto.MetricType {
	t.Helper()
	var (
		mu      sync.Mutex
		seen    = map[string]dto.MetricType{}
		lastErr error
		scrapes int
	)
	scrape := func() {
		resp, err := http.Get(url)
		if err != nil {
			mu.Lock()
			lastErr = err
			mu.Unlock()
			return
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(resp.Body)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			lastErr = err
			return
		}
		scrapes++
		for name, f := range families {
			if len(f.Metric) > 0 {
				seen[name] = f.GetType()
			}
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			scrape()
			select {
			case <-stop:
				return
			case <-time.After(period):
			}
		}
	}()
	var once sync.Once
	return func() map[string]dto.MetricType {
		once.Do(func() { close(stop); <-done; scrape() })
		mu.Lock()
		defer mu.Unlock()
		if scrapes == 0 {
			t.Fatalf("no scrape of %s succeeded: %v", url, lastErr)
		}
		return seen
	}
}

// checkDashboardsAndAlerts renders the chart with its Grafana dashboard and
// PrometheusRule, parses every expression with Prometheus's own parser
// (test/promql) and checks that each metric it names was exported; and that
// every exported tessera metric is named by the convention of
// internal/metricsconv.
func checkDashboardsAndAlerts(t *testing.T, exported map[string]dto.MetricType) {
	t.Helper()
	for name, kind := range exported {
		if strings.HasPrefix(name, metricsconv.Namespace+"_") {
			if err := metricsconv.CheckName(name, kind); err != nil {
				t.Errorf("exported metric breaks the naming convention: %v", err)
			}
		}
	}
	r, err := deployments.Render(deployments.Options{Values: map[string]any{
		"prometheusRule":   map[string]any{"enabled": true},
		"grafanaDashboard": map[string]any{"enabled": true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	type source struct{ where, expr string }
	var exprs []source
	for _, obj := range r.Objects {
		switch obj.GetKind() {
		case "PrometheusRule":
			var rule struct {
				Spec struct {
					Groups []struct {
						Rules []struct {
							Alert, Expr string
						}
					}
				}
			}
			data, _ := json.Marshal(obj.Object)
			if err := json.Unmarshal(data, &rule); err != nil {
				t.Fatal(err)
			}
			for _, g := range rule.Spec.Groups {
				for _, rl := range g.Rules {
					exprs = append(exprs, source{"alert " + rl.Alert, rl.Expr})
				}
			}
		case "ConfigMap":
			data, _, _ := unstructuredString(obj.Object, "data", "tessera.json")
			if data == "" {
				continue
			}
			var dash struct {
				Panels []struct {
					Title   string
					Targets []struct{ Expr string }
				}
				Templating struct {
					List []struct {
						Name       string
						Definition string
					}
				}
			}
			if err := json.Unmarshal([]byte(data), &dash); err != nil {
				t.Fatalf("dashboard JSON: %v", err)
			}
			for _, p := range dash.Panels {
				for _, tg := range p.Targets {
					exprs = append(exprs, source{"panel " + p.Title, grafanaToPromQL(tg.Expr)})
				}
			}
			for _, v := range dash.Templating.List {
				if m, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
					metric, _, _ := strings.Cut(m, ",")
					exprs = append(exprs, source{"variable " + v.Name, strings.TrimSpace(metric)})
				}
			}
		}
	}
	if len(exprs) < 10 {
		t.Fatalf("found %d expressions in the dashboard and rules; the chart did not render them", len(exprs))
	}
	list := make([]string, len(exprs))
	for i, e := range exprs {
		list[i] = e.expr
	}
	parsed := parsePromQL(t, list)
	var missing []string
	for i, p := range parsed {
		where := exprs[i].where
		if p.Error != "" {
			t.Errorf("%s: %q does not parse: %s", where, p.Expr, p.Error)
			continue
		}
		tessera := 0
		for _, m := range p.Metrics {
			if !strings.HasPrefix(m, metricsconv.Namespace+"_") {
				continue
			}
			tessera++
			if !isExported(m, exported) {
				missing = append(missing, where+": "+m)
			}
		}
		if tessera == 0 {
			t.Errorf("%s: %q names no tessera metric", where, p.Expr)
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not exported by the running sandbox: %s", m)
	}
	if t.Failed() {
		var names []string
		for n := range exported {
			if strings.HasPrefix(n, "tessera_") {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		t.Logf("exported: %s", strings.Join(names, " "))
	}
}

// grafanaToPromQL replaces the dashboard's variables with what Grafana
// would send.
func grafanaToPromQL(expr string) string {
	return strings.NewReplacer("$__rate_interval", "1m", "$queue", ".*").Replace(expr)
}

// isExported: the name is an exported family, or a histogram's or summary's
// _bucket, _sum or _count series.
func isExported(name string, exported map[string]dto.MetricType) bool {
	if _, ok := exported[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if kind, ok := exported[base]; ok && (kind == dto.MetricType_HISTOGRAM || kind == dto.MetricType_SUMMARY) {
				return true
			}
		}
	}
	return false
}

type promqlResult struct {
	Expr    string
	Metrics []string
	Error   string
}

// parsePromQL runs test/promql, Prometheus's parser in a module of its own.
func parsePromQL(t *testing.T, exprs []string) []promqlResult {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(exprs)
	cmd := exec.Command("go", "run", ".")
	cmd.Dir = filepath.Join(root, "test", "promql")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("test/promql: %v\n%s", err, stderr.String())
	}
	var res []promqlResult
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(exprs) {
		t.Fatalf("test/promql output: %v (%d results for %d expressions)", err, len(res), len(exprs))
	}
	return res
}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	cur := any(obj)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
}
