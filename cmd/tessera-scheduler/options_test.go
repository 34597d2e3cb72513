package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestFlagsReachSchedulerOptions: the flags whose 0 means "off" become the Options' -1 (whose
// 0 means "the default"), and other values pass through unchanged.
func TestFlagsReachSchedulerOptions(t *testing.T) {
	for _, tc := range []struct {
		args                 string
		unfitRetry           time.Duration
		consolidationMaxPods int
	}{
		{args: "", unfitRetry: 30 * time.Second, consolidationMaxPods: 16},
		{args: "--unfit-retry=2m --consolidation-max-pods=4", unfitRetry: 2 * time.Minute, consolidationMaxPods: 4},
		{args: "--unfit-retry=0 --consolidation-max-pods=0", unfitRetry: -1, consolidationMaxPods: -1},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o := newOptions()
		o.addFlags(fs)
		if err := fs.Parse(strings.Fields(tc.args)); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		opts := o.schedulerOptions()
		if opts.UnfitRetry != tc.unfitRetry || opts.ConsolidationMaxPods != tc.consolidationMaxPods {
			t.Errorf("%q: UnfitRetry %s, ConsolidationMaxPods %d; want %s, %d", tc.args, opts.UnfitRetry, opts.ConsolidationMaxPods, tc.unfitRetry, tc.consolidationMaxPods)
		}
	}
}

// TestProfilingEndpoints: /debug/pprof is served by default (as the kube-scheduler's
// --profiling) and not at all with --profiling=false; /metrics is served either way.
func TestProfilingEndpoints(t *testing.T) {
	for _, tc := range []struct {
		args  string
		pprof int
	}{
		{args: "", pprof: http.StatusOK},
		{args: "--profiling=false", pprof: http.StatusNotFound},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o := newOptions()
		o.addFlags(fs)
		if err := fs.Parse(strings.Fields(tc.args)); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		h := endpointsHandler(o)
		for path, want := range map[string]int{"/debug/pprof/": tc.pprof, "/debug/pprof/cmdline": tc.pprof, "/metrics": http.StatusOK} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != want {
				t.Errorf("%q: GET %s = %d, want %d", tc.args, path, rec.Code, want)
			}
			if path == "/debug/pprof/" && want == http.StatusOK && !strings.Contains(rec.Body.String(), "goroutine") {
				t.Errorf("%q: GET %s does not list the goroutine profile:\n%s", tc.args, path, rec.Body.String())
			}
		}
	}
}

// TestClientMetricsServed: client-go's request and rate-limiter metrics are on /metrics, as
// the kube-scheduler serves them (operators and the fair benchmark read client-side
// throttling from rest_client_rate_limiter_duration_seconds).
func TestClientMetricsServed(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[]}`))
	}))
	defer api.Close()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: 50, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second waits about 20 ms for the limiter
		if _, err := kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	o := newOptions()
	rec := httptest.NewRecorder()
	endpointsHandler(o).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`rest_client_requests_total{code="200"`, `rest_client_rate_limiter_duration_seconds_count{`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}
