package overview

import (
	"context"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/internal/metricsconv"
)

// Source gives the overview at a moment: a Watcher, or Fetch for one-off
// views.
type Source interface {
	Overview(ctx context.Context, now time.Time) (Cluster, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context, now time.Time) (Cluster, error)

// Overview implements Source.
func (f SourceFunc) Overview(ctx context.Context, now time.Time) (Cluster, error) { return f(ctx, now) }

func clusterDesc(name, help string, labels ...string) *metrics.Desc {
	return metrics.NewDesc(metrics.BuildFQName(metricsconv.Namespace, metricsconv.Cluster, name), help, labels, nil, metrics.ALPHA, "")
}

// The cluster metrics: what `tessera top` shows, for dashboards and alerts
// (deployments/helm/tessera/files/dashboards, templates/prometheusrule.yaml).
// Labels stay bounded: nodes, GPUs, queues, phases, reasons (one word), and
// pending gangs only.
var (
	descGPUAllocated = clusterDesc("gpu_allocated",
		"GPU units allocated on one physical GPU (0 to 1): whole, MIG slices or shares.", "node", "gpu", "mode")
	descGPUTainted = clusterDesc("gpu_tainted",
		"1 while a health taint is on a device of the GPU, else 0.", "node", "gpu")
	descQueueAllocated = clusterDesc("queue_allocated_gpus",
		"GPU units allocated to a queue and its descendants (Queue status).", "queue", "parent")
	descQueueRequested = clusterDesc("queue_requested_gpus",
		"GPU units allocated plus waiting in a queue and its descendants.", "queue", "parent")
	descQueueQuota = clusterDesc("queue_quota_gpus",
		"A queue's GPU quota (queues with one).", "queue", "parent")
	descQueueLimit = clusterDesc("queue_limit_gpus",
		"A queue's GPU limit (queues with one).", "queue", "parent")
	descGangs = clusterDesc("gangs",
		"Gangs (PodGroups) by phase.", "phase")
	descGangsPending = clusterDesc("gangs_pending",
		"Pending gangs by queue and the reason they wait (the condition's reason).", "queue", "reason")
	descGangPending = clusterDesc("gang_pending_seconds",
		"How long each pending gang has waited since it was created.", "namespace", "podgroup", "queue", "reason")
)

// Collector exports an overview Source as the cluster metrics, built afresh
// on every scrape. Register it with a KubeRegistry's CustomMustRegister.
type Collector struct {
	metrics.BaseStableCollector
	src Source
	now func() time.Time
}

// NewCollector returns a collector of src.
func NewCollector(src Source) *Collector {
	return &Collector{src: src, now: time.Now}
}

var _ metrics.StableCollector = (*Collector)(nil)

// DescribeWithStability implements metrics.StableCollector.
func (c *Collector) DescribeWithStability(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{descGPUAllocated, descGPUTainted, descQueueAllocated, descQueueRequested,
		descQueueQuota, descQueueLimit, descGangs, descGangsPending, descGangPending} {
		ch <- d
	}
}

// CollectWithStability implements metrics.StableCollector.
func (c *Collector) CollectWithStability(ch chan<- metrics.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := c.src.Overview(ctx, c.now())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cluster metrics: no overview")
		return
	}
	gauge := func(d *metrics.Desc, v float64, labels ...string) {
		ch <- metrics.NewLazyConstMetric(d, metrics.GaugeValue, v, labels...)
	}
	for _, n := range cl.Nodes {
		for _, g := range n.GPUs {
			minor := "gpu-" + strconv.Itoa(g.Minor)
			gauge(descGPUAllocated, g.Used, n.Name, minor, g.Mode)
			tainted := 0.0
			if g.Tainted {
				tainted = 1
			}
			gauge(descGPUTainted, tainted, n.Name, minor)
		}
	}
	for _, q := range cl.Queues {
		gauge(descQueueAllocated, q.Allocated, q.Name, q.Parent)
		gauge(descQueueRequested, q.Requested, q.Name, q.Parent)
		if q.Quota != nil {
			gauge(descQueueQuota, *q.Quota, q.Name, q.Parent)
		}
		if q.Limit != nil {
			gauge(descQueueLimit, *q.Limit, q.Name, q.Parent)
		}
	}
	phases := map[string]int{}
	for _, p := range []v1alpha1.PodGroupPhase{v1alpha1.PodGroupPending, v1alpha1.PodGroupScheduled, v1alpha1.PodGroupRunning, v1alpha1.PodGroupFinished} {
		phases[string(p)] = 0 // every phase, so that a rate or an alert sees zeros
	}
	type queueReason struct{ queue, reason string }
	pending := map[queueReason]int{}
	for _, g := range cl.Gangs {
		phases[g.Phase]++
		if g.Phase != string(v1alpha1.PodGroupPending) {
			continue
		}
		reason := g.ReasonCode
		if reason == "" {
			reason = "Unknown" // not looked at by the scheduler yet
		}
		pending[queueReason{g.Queue, reason}]++
		gauge(descGangPending, g.Waiting.Seconds(), g.Namespace, g.Name, g.Queue, reason)
	}
	for p, n := range phases {
		gauge(descGangs, float64(n), p)
	}
	for k, n := range pending {
		gauge(descGangsPending, float64(n), k.queue, k.reason)
	}
}

// FetchSource lists from the API server on every call (Fetch).
func FetchSource(cfg *rest.Config) Source {
	return SourceFunc(func(ctx context.Context, now time.Time) (Cluster, error) { return Fetch(ctx, cfg, now) })
}
