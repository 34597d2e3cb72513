package baseline

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/contract"
)

// DCGMUtilMetric is dcgm-exporter's GPU utilisation: the percentage (0–100) of the last
// sample period during which one or more kernels ran on the GPU (DCGM field
// DCGM_FI_DEV_GPU_UTIL, in the exporter's default collectors). dcgm-exporter labels each
// series with the GPU's index (gpu), UUID, pci_bus_id, device (nvidia0…), modelName and
// Hostname, and, with pod attribution on, container/namespace/pod — one series per pod using
// the GPU, all with the GPU's value. GPUs in MIG mode do not report it (their GPU instances
// carry GPU_I_ID/GPU_I_PROFILE labels and are skipped here).
const DCGMUtilMetric = "DCGM_FI_DEV_GPU_UTIL"

// UtilSampler accumulates DCGM_FI_DEV_GPU_UTIL per GPU UUID over scrapes of dcgm-exporter's
// /metrics (one exporter per GPU node).
type UtilSampler struct {
	sum     map[string]float64
	samples map[string]int
}

// NewUtilSampler returns an empty sampler.
func NewUtilSampler() *UtilSampler {
	return &UtilSampler{sum: map[string]float64{}, samples: map[string]int{}}
}

// Observe reads one scrape in the Prometheus text exposition format. A GPU's series of
// several pods count once (their values are the GPU's).
func (u *UtilSampler) Observe(r io.Reader) error {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return fmt.Errorf("parse metrics: %w", err)
	}
	mf := families[DCGMUtilMetric]
	if mf == nil {
		return fmt.Errorf("no %s series (is this dcgm-exporter's /metrics?)", DCGMUtilMetric)
	}
	seen := map[string]float64{}
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["GPU_I_ID"] != "" || labels["UUID"] == "" {
			continue // a MIG GPU instance, or not a GPU
		}
		v, ok := value(m)
		if !ok {
			continue
		}
		seen[labels["UUID"]] = max(seen[labels["UUID"]], v)
	}
	for uuid, v := range seen {
		u.sum[uuid] += v
		u.samples[uuid]++
	}
	return nil
}

func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	}
	return 0, false
}

// Means are each GPU's mean utilisation (percent) over the samples, by UUID.
func (u *UtilSampler) Means() map[string]float64 {
	out := make(map[string]float64, len(u.sum))
	for uuid, s := range u.sum {
		out[uuid] = s / float64(u.samples[uuid])
	}
	return out
}

// Scrape reads one exporter's /metrics into the sampler.
func (u *UtilSampler) Scrape(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("dcgm-exporter %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("dcgm-exporter %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("dcgm-exporter %s: %s", url, resp.Status)
	}
	if err := u.Observe(resp.Body); err != nil {
		return fmt.Errorf("dcgm-exporter %s: %w", url, err)
	}
	return nil
}

// GPUNodes maps the UUID of every GPU the node agents publish (whole and shared GPUs by
// their uuid, MIG devices by their parent's) to its node.
func GPUNodes(slices []resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for i := range slices {
		s := &slices[i]
		node := ptrStr(s.Spec.NodeName)
		if node == "" {
			continue
		}
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			for _, attr := range []resourceapi.QualifiedName{contract.AttrUUID, contract.AttrParentUUID} {
				if uuid := contract.StringAttr(d, attr); uuid != "" {
					out[uuid] = node
				}
			}
		}
	}
	return out
}

func ptrStr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// utilisation fills the report's measured GPU utilisation: per node the mean over its GPUs
// with a sample, and over the cluster. GPUs of UUIDs no node publishes are counted apart.
func utilisation(r *Report, means map[string]float64, nodes map[string]string) {
	if means == nil {
		return
	}
	perNode := map[string][]float64{}
	var all []float64
	unmatched := 0
	uuids := make([]string, 0, len(means))
	for uuid := range means {
		uuids = append(uuids, uuid)
	}
	sort.Strings(uuids)
	for _, uuid := range uuids {
		node, ok := nodes[uuid]
		if !ok {
			unmatched++
			continue
		}
		perNode[node] = append(perNode[node], means[uuid])
		all = append(all, means[uuid])
	}
	mean := func(vs []float64) *float64 {
		if len(vs) == 0 {
			return nil
		}
		s := 0.0
		for _, v := range vs {
			s += v
		}
		m := round3(s / float64(len(vs)))
		return &m
	}
	for i := range r.Nodes {
		r.Nodes[i].GPUUtilPercent = mean(perNode[r.Nodes[i].Name])
		r.Nodes[i].GPUsWithUtil = len(perNode[r.Nodes[i].Name])
	}
	r.Totals.GPUUtilPercent = mean(all)
	r.Totals.GPUsWithUtil = len(all)
	r.Totals.UnknownGPUsWithUtil = unmatched
}
