package draplugin

import (
	"testing"

	"k8s.io/component-base/metrics"
)

func TestMetricsRegistry(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	m, err := newMetrics(reg)
	if err != nil || m.registry != reg {
		t.Fatalf("newMetrics = %v, %v", m, err)
	}
	m.operations.WithLabelValues("prepare").Inc()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		found = found || f.GetName() == "tessera_draplugin_claim_operations_total"
	}
	if !found {
		t.Error("metrics not in the given registry")
	}
	// A second plugin on the same registry is refused with an error.
	if _, err := newMetrics(reg); err == nil {
		t.Error("duplicate registration accepted")
	}
}
