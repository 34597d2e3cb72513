package baseline_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/controlplane/baseline"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/test/framework"
)

// exporterGPU is one GPU as a dcgm-exporter stand-in reports it.
type exporterGPU struct {
	index int
	uuid  string
	// util is DCGM_FI_DEV_GPU_UTIL at each scrape (the last value repeats).
	util []float64
	// pods using the GPU: with pod attribution dcgm-exporter writes one series per pod,
	// each with the GPU's value.
	pods []string
	// migInstances: a GPU in MIG mode has no GPU-level utilisation; the exporter writes
	// series per GPU instance (GPU_I_ID, GPU_I_PROFILE) instead.
	migInstances int
}

// dcgmExporter is a stand-in for one node's dcgm-exporter (nvcr.io/nvidia/k8s/dcgm-exporter):
// /metrics in the Prometheus text format with the exporter's HELP and TYPE lines and its
// label set (gpu, UUID, pci_bus_id, device, modelName, Hostname; container, namespace, pod
// with pod attribution), values advancing by one step per scrape. Label names and layout
// as in NVIDIA's documentation ("DCGM Exporter Metrics") and the exporter's README output.
type dcgmExporter struct {
	hostname string
	gpus     []exporterGPU
	mu       sync.Mutex
	scrapes  int
}

func (e *dcgmExporter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	e.mu.Lock()
	step := e.scrapes
	e.scrapes++
	e.mu.Unlock()
	var b strings.Builder
	b.WriteString("# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n")
	for _, g := range e.gpus {
		fmt.Fprintf(&b, "DCGM_FI_DEV_SM_CLOCK{%s} 1980\n", e.labels(g, "", -1))
	}
	b.WriteString("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
	for _, g := range e.gpus {
		if g.migInstances > 0 {
			for i := range g.migInstances {
				fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_UTIL{%s} 0\n", e.labels(g, "", i))
			}
			continue
		}
		v := g.util[min(step, len(g.util)-1)]
		if len(g.pods) == 0 {
			fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_UTIL{%s} %g\n", e.labels(g, "", -1), v)
		}
		for _, pod := range g.pods {
			fmt.Fprintf(&b, "DCGM_FI_DEV_GPU_UTIL{%s} %g\n", e.labels(g, pod, -1), v)
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

func (e *dcgmExporter) labels(g exporterGPU, pod string, gi int) string {
	l := fmt.Sprintf(`gpu="%d",UUID="%s",pci_bus_id="00000000:%02X:00.0",device="nvidia%d",modelName="NVIDIA H100 80GB HBM3",Hostname="%s"`,
		g.index, g.uuid, 0x18+g.index, g.index, e.hostname)
	if gi >= 0 {
		l += fmt.Sprintf(`,GPU_I_PROFILE="1g.10gb",GPU_I_ID="%d"`, gi+7)
	}
	ns := ""
	if pod != "" {
		ns = "team-a"
	}
	return l + fmt.Sprintf(`,container="%s",namespace="%s",pod="%s"`, map[bool]string{true: "main"}[pod != ""], ns, pod)
}

// TestUtilSampler: each GPU's mean over scrapes; a GPU's series of several pods count once;
// MIG GPU instances and other metrics are skipped; input that is not dcgm-exporter's is an
// error naming what is missing.
func TestUtilSampler(t *testing.T) {
	e := &dcgmExporter{hostname: "dcgm-exporter-x7k2p", gpus: []exporterGPU{
		{index: 0, uuid: "GPU-aaaa", util: []float64{10, 30, 50}},
		{index: 1, uuid: "GPU-bbbb", util: []float64{100}, pods: []string{"nb-1", "nb-2"}},
		{index: 2, uuid: "GPU-cccc", migInstances: 3},
	}}
	srv := httptest.NewServer(e)
	defer srv.Close()
	u := baseline.NewUtilSampler()
	for range 3 {
		if err := u.Scrape(context.Background(), srv.Client(), srv.URL+"/metrics"); err != nil {
			t.Fatal(err)
		}
	}
	got := u.Means()
	if len(got) != 2 || got["GPU-aaaa"] != 30 || got["GPU-bbbb"] != 100 {
		t.Errorf("means = %v, want GPU-aaaa 30 (10, 30, 50), GPU-bbbb 100, no MIG GPU", got)
	}
	if err := u.Scrape(context.Background(), srv.Client(), srv.URL+"/other"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("scrape of a missing page: %v", err)
	}
	if err := u.Observe(strings.NewReader("node_load1 2.5\n")); err == nil || !strings.Contains(err.Error(), "DCGM_FI_DEV_GPU_UTIL") {
		t.Errorf("metrics without the utilisation: %v", err)
	}
	if err := u.Observe(strings.NewReader("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\" 5\n")); err == nil {
		t.Error("a broken exposition was accepted")
	}
}

// TestCollectMeasuresUtilisation: Collect with --dcgm-url scrapes the exporters at every
// sample and matches their GPUs to nodes by the UUID the node agent publishes; the report,
// its table and the diff against a report without DCGM carry the measured utilisation.
func TestCollectMeasuresUtilisation(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cp := framework.Shared(t)
	kube := cp.Client(t)
	node := framework.UniqueName("n")
	if _, err := kube.CoreV1().Nodes().Create(ctx, func() *v1.Node { n := fixture.Node(node, nil); n.UID = ""; return n }(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	uuids := []string{fixture.GPUUUID(node, 0), fixture.GPUUUID(node, 1)} // the slices' uuid attributes
	for _, s := range fixture.WholeGPUSlices(node, 2) {
		s.UID = ""
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
	// The node's exporter, and one on a machine whose GPU no node agent publishes.
	here := httptest.NewServer(&dcgmExporter{hostname: node, gpus: []exporterGPU{
		{index: 0, uuid: uuids[0], util: []float64{20}}, {index: 1, uuid: uuids[1], util: []float64{80}, pods: []string{"a", "b"}},
	}})
	defer here.Close()
	elsewhere := httptest.NewServer(&dcgmExporter{hostname: "other", gpus: []exporterGPU{{index: 0, uuid: "GPU-unknown", util: []float64{99}}}})
	defer elsewhere.Close()

	plain, err := baseline.Collect(ctx, cp.Config, baseline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	measured, err := baseline.Collect(ctx, cp.Config, baseline.Options{DCGMURLs: []string{here.URL + "/metrics", elsewhere.URL + "/metrics"}})
	if err != nil {
		t.Fatal(err)
	}
	if tt := plain.Totals; tt.GPUUtilPercent != nil || tt.GPUsWithUtil != 0 {
		t.Errorf("without DCGM: totals %+v, want no measured utilisation", tt)
	}
	var n *baseline.Node
	for i := range measured.Nodes {
		if measured.Nodes[i].Name == node {
			n = &measured.Nodes[i]
		}
	}
	if n == nil || n.GPUUtilPercent == nil || *n.GPUUtilPercent != 50 || n.GPUsWithUtil != 2 {
		t.Fatalf("node %s = %+v, want 50%% measured over 2 GPUs", node, n)
	}
	if tt := measured.Totals; tt.GPUUtilPercent == nil || tt.GPUsWithUtil < 2 || tt.UnknownGPUsWithUtil != 1 {
		t.Errorf("totals %+v, want the node's GPUs and 1 unknown GPU", tt)
	}
	var table strings.Builder
	if err := baseline.WriteTable(&table, measured); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "measured GPU utilisation (DCGM_FI_DEV_GPU_UTIL") || !strings.Contains(table.String(), "50.0% (2 GPUs)") {
		t.Errorf("table lacks the measured utilisation:\n%s", table.String())
	}
	got := map[string]string{}
	for _, c := range baseline.Diff(plain, measured) {
		got[c.Field] = c.Before + " → " + c.After
	}
	if got["nodes["+node+"].gpuUtilPercent"] != "none → 50" || got["nodes["+node+"].gpusWithUtil"] != "0 → 2" || got["totals.unknownGPUsWithUtil"] != "0 → 1" {
		t.Errorf("diff = %v", got)
	}

	// An exporter that does not answer is an error naming it.
	broken := httptest.NewServer(http.NotFoundHandler())
	defer broken.Close()
	if _, err := baseline.Collect(ctx, cp.Config, baseline.Options{DCGMURLs: []string{broken.URL + "/metrics"}}); err == nil || !strings.Contains(err.Error(), broken.URL) {
		t.Errorf("Collect with a broken exporter: %v", err)
	}
}
