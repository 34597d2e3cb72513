package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics, as both schedulers register them
)

// TestParseClientThrottling reads the exposition client-go's rate limiter really writes (the
// registration both schedulers use): three requests through a limiter of 4 QPS and burst 1
// wait about 250 ms each after the first (less the first's own time: far below that).
func TestParseClientThrottling(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[]}`))
	}))
	defer api.Close()
	scrape := func() (float64, int) {
		rec := httptest.NewRecorder()
		legacyregistry.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		wait, waited, err := parseClientThrottling(rec.Body.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return wait, waited
	}
	wait0, waited0 := scrape()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: 4, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wait, waited := scrape()
	if waited-waited0 != 2 || wait-wait0 < 0.3 {
		t.Errorf("parsed %.3f s waited by %d requests over 5 ms; want about 0.5 s by 2", wait-wait0, waited-waited0)
	}
}

func TestParseClientThrottlingNoSeries(t *testing.T) {
	wait, waited, err := parseClientThrottling([]byte("# HELP go_goroutines x\ngo_goroutines 12\n"))
	if err != nil || wait != 0 || waited != 0 {
		t.Errorf("got %v, %d, %v; want 0, 0, nil", wait, waited, err)
	}
	if _, _, err := parseClientThrottling([]byte("rest_client_rate_limiter_duration_seconds_sum{verb=\"GET\"} x\n")); err == nil {
		t.Error("a malformed value was accepted")
	}
	gauge := "# TYPE rest_client_rate_limiter_duration_seconds gauge\nrest_client_rate_limiter_duration_seconds 3\n"
	if _, _, err := parseClientThrottling([]byte(gauge)); err == nil {
		t.Error("a gauge of that name was read as the histogram")
	}
}

// TestKlogTime: the harness reads when a scheduler's informers synced from the klog header
// of the line it logs then, in the year of the process start.
func TestKlogTime(t *testing.T) {
	near := time.Date(2026, 12, 8, 0, 7, 10, 0, time.Local)
	got, ok := klogTime(`I1208 00:07:11.172252   19375 server.go:308] "Handlers synced"`+"\n", near)
	if want := time.Date(2026, 12, 8, 0, 7, 11, 172252000, time.Local); !ok || !got.Equal(want) {
		t.Errorf("klogTime = %v, %v; want %v", got, ok, want)
	}
	for _, line := range []string{"", "FLAG: --v=1", `X1208 00:07:11.172252 "Handlers synced"`, `I12x8 00:07:11.172252 x`} {
		if _, ok := klogTime(line, near); ok {
			t.Errorf("klogTime(%q) parsed", line)
		}
	}
}
