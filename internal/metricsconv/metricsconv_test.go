package metricsconv

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/component-base/metrics"
)

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind dto.MetricType
		ok   bool
	}{
		{"tessera_scheduler_pods_bound_total", dto.MetricType_COUNTER, true},
		{"tessera_draplugin_claim_operation_duration_seconds", dto.MetricType_HISTOGRAM, true},
		{"tessera_cluster_queue_limit_gpus", dto.MetricType_GAUGE, true},
		{"tessera_scheduler_pods_bound", dto.MetricType_COUNTER, false},            // counter without _total
		{"tessera_node_devices_total", dto.MetricType_GAUGE, false},                // gauge with _total
		{"tessera_draplugin_prepare_duration_ms", dto.MetricType_HISTOGRAM, false}, // not seconds
		{"tessera_gpu_allocated", dto.MetricType_GAUGE, false},                     // no component
		{"scheduler_pods_bound_total", dto.MetricType_COUNTER, false},              // no namespace
		{"tessera_scheduler_", dto.MetricType_GAUGE, false},
	} {
		err := CheckName(tc.name, tc.kind)
		if (err == nil) != tc.ok {
			t.Errorf("CheckName(%s, %s) = %v, want ok=%t", tc.name, tc.kind, err, tc.ok)
		}
	}
}

// TestWithLabelsServesInstancesSideBySide: two registries holding the same
// metric (two simulated nodes' DRA plugins) are served together once each
// carries its node label; without the labels the second is a duplicate.
func TestWithLabelsServesInstancesSideBySide(t *testing.T) {
	reg := func(value float64) metrics.KubeRegistry {
		r := metrics.NewKubeRegistry()
		c := metrics.NewCounterVec(&metrics.CounterOpts{Namespace: Namespace, Subsystem: DRAPlugin, Name: "claim_operations_total", Help: "h", StabilityLevel: metrics.ALPHA}, []string{"operation"})
		r.MustRegister(c)
		c.WithLabelValues("prepare").Add(value)
		return r
	}
	a, b := reg(1), reg(2)
	if _, err := (prometheus.Gatherers{a, b}).Gather(); err == nil {
		t.Fatal("the same series from two registries should collide")
	}
	srv := httptest.NewServer(Handler(WithLabels(a, map[string]string{"node": "n0"}), WithLabels(b, map[string]string{"node": "n1"})))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{
		`tessera_draplugin_claim_operations_total{node="n0",operation="prepare"} 1`,
		`tessera_draplugin_claim_operations_total{node="n1",operation="prepare"} 2`,
		`go_goroutines `, // the legacy registry's runtime metrics
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
}
