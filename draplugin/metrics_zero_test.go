package draplugin

import (
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
)

// TestErrorCountersStartAtZero: the operation and error counters exist at 0
// before the first call, so that increase() sees the first error (the
// TesseraPrepareErrors alert) and dashboards show 0 rather than no data.
func TestErrorCountersStartAtZero(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tessera_draplugin_claim_operation_errors_total", "tessera_draplugin_claim_operations_total"} {
		got, err := testutil.GetCounterValuesFromGatherer(reg, name, map[string]string{}, "operation")
		if err != nil || len(got) != 2 || got["prepare"] != 0 || got["unprepare"] != 0 {
			t.Errorf("%s = %v, %v; want prepare and unprepare at 0", name, got, err)
		}
	}
}
