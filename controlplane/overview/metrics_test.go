package overview

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/internal/metricsconv"
)

func TestCollectorExportsTheOverview(t *testing.T) {
	c := Cluster{
		Nodes: []Node{{Name: "n0", GPUs: []GPU{
			{Minor: 0, Mode: "whole", Used: 1},
			{Minor: 1, Mode: "mig", Used: 3.0 / 7, Tainted: true},
		}}},
		Queues: []Queue{
			{Name: "research", Allocated: 16, Requested: 26, Quota: ptr.To(24.0), Limit: ptr.To(24.0)},
			{Name: "team-b", Parent: "research", Allocated: 0.5, Requested: 10.5},
		},
		Gangs: []Gang{
			{Namespace: "b", Name: "train", Queue: "team-b", Phase: "Pending", ReasonCode: "QuotaExceeded", Waiting: 90 * time.Second},
			{Namespace: "b", Name: "new", Queue: "team-b", Phase: "Pending", Waiting: time.Second},
			{Namespace: "a", Name: "run", Queue: "team-a", Phase: "Running"},
		},
	}
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(NewCollector(SourceFunc(func(context.Context, time.Time) (Cluster, error) { return c, nil })))
	want := `
# HELP tessera_cluster_gang_pending_seconds [ALPHA] How long each pending gang has waited since it was created.
# TYPE tessera_cluster_gang_pending_seconds gauge
tessera_cluster_gang_pending_seconds{namespace="b",podgroup="new",queue="team-b",reason="Unknown"} 1
tessera_cluster_gang_pending_seconds{namespace="b",podgroup="train",queue="team-b",reason="QuotaExceeded"} 90
# HELP tessera_cluster_gangs [ALPHA] Gangs (PodGroups) by phase.
# TYPE tessera_cluster_gangs gauge
tessera_cluster_gangs{phase="Finished"} 0
tessera_cluster_gangs{phase="Pending"} 2
tessera_cluster_gangs{phase="Running"} 1
tessera_cluster_gangs{phase="Scheduled"} 0
# HELP tessera_cluster_gangs_pending [ALPHA] Pending gangs by queue and the reason they wait (the condition's reason).
# TYPE tessera_cluster_gangs_pending gauge
tessera_cluster_gangs_pending{queue="team-b",reason="QuotaExceeded"} 1
tessera_cluster_gangs_pending{queue="team-b",reason="Unknown"} 1
# HELP tessera_cluster_gpu_allocated [ALPHA] GPU units allocated on one physical GPU (0 to 1): whole, MIG slices or shares.
# TYPE tessera_cluster_gpu_allocated gauge
tessera_cluster_gpu_allocated{gpu="gpu-0",mode="whole",node="n0"} 1
tessera_cluster_gpu_allocated{gpu="gpu-1",mode="mig",node="n0"} 0.42857142857142855
# HELP tessera_cluster_gpu_tainted [ALPHA] 1 while a health taint is on a device of the GPU, else 0.
# TYPE tessera_cluster_gpu_tainted gauge
tessera_cluster_gpu_tainted{gpu="gpu-0",node="n0"} 0
tessera_cluster_gpu_tainted{gpu="gpu-1",node="n0"} 1
# HELP tessera_cluster_queue_allocated_gpus [ALPHA] GPU units allocated to a queue and its descendants (Queue status).
# TYPE tessera_cluster_queue_allocated_gpus gauge
tessera_cluster_queue_allocated_gpus{parent="",queue="research"} 16
tessera_cluster_queue_allocated_gpus{parent="research",queue="team-b"} 0.5
# HELP tessera_cluster_queue_limit_gpus [ALPHA] A queue's GPU limit (queues with one).
# TYPE tessera_cluster_queue_limit_gpus gauge
tessera_cluster_queue_limit_gpus{parent="",queue="research"} 24
# HELP tessera_cluster_queue_quota_gpus [ALPHA] A queue's GPU quota (queues with one).
# TYPE tessera_cluster_queue_quota_gpus gauge
tessera_cluster_queue_quota_gpus{parent="",queue="research"} 24
# HELP tessera_cluster_queue_requested_gpus [ALPHA] GPU units allocated plus waiting in a queue and its descendants.
# TYPE tessera_cluster_queue_requested_gpus gauge
tessera_cluster_queue_requested_gpus{parent="",queue="research"} 26
tessera_cluster_queue_requested_gpus{parent="research",queue="team-b"} 10.5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if err := metricsconv.CheckName(f.GetName(), f.GetType()); err != nil {
			t.Error(err)
		}
	}
}

// TestCollectorWithoutOverviewExportsNothing: a failing source (API server
// gone) yields no samples rather than zeros that would look like an empty
// cluster.
func TestCollectorWithoutOverviewExportsNothing(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(NewCollector(SourceFunc(func(context.Context, time.Time) (Cluster, error) {
		return Cluster{}, errors.New("connection refused")
	})))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 0 {
		t.Errorf("gathered %d families from a failing source", len(families))
	}
}
