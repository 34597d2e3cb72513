package baseline

import (
	"bytes"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controlplane/overview"
)

func TestBuildAndDiff(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	quota := 2.0
	h100 := int64(80) << 30
	before := Build(Input{Now: t0, Cluster: overview.Cluster{
		Nodes: []overview.Node{
			{Name: "a", GPUs: []overview.GPU{{Product: "H100", MemoryBytes: h100, Mode: "whole", Used: 1}, {Product: "H100", MemoryBytes: h100, Mode: "mig", Used: 0.25}}},
			{Name: "cpu"},
		},
		Queues: []overview.Queue{{Name: "q", Allocated: 1.25, Quota: &quota}},
	}, Waits: []float64{1, 2, 30}, PendingNow: 1,
		Coverage: []Kind{{APIVersion: "batch.x/v1", Kind: "Thing"}, {APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Definition: "jobset"}},
		Mapping:  []MappingFail{{Namespace: "ns", Name: "pod-x", Reason: "UnknownWorkload", Message: "no definition"}},
	})
	tt := before.Totals
	if tt.GPUNodes != 1 || tt.GPUs != 2 || tt.Allocated != 1.25 || tt.Utilisation != 0.625 || tt.WholeGPUs != 1 || tt.MIGGPUs != 1 || tt.CoveredKinds != 1 || tt.UncoveredKinds != 1 || tt.MappingErrors != 1 {
		t.Errorf("totals = %+v", tt)
	}
	if len(before.Nodes) != 1 || before.Nodes[0].MIGInUse != 1 || len(before.GPUTypes) != 1 || before.GPUTypes[0].Count != 2 || before.Pending.Wait.P50 != 2 || before.Pending.Wait.Max != 30 {
		t.Errorf("nodes %+v types %+v pending %+v", before.Nodes, before.GPUTypes, before.Pending)
	}

	var buf bytes.Buffer
	if err := WriteJSON(&buf, before); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(before, back); len(d) != 0 {
		t.Errorf("a report differs from itself read back: %v", d)
	}
	if _, err := ReadJSON(strings.NewReader(`{"gangs": []}`)); err == nil {
		t.Error("a shadow summary was read as a baseline")
	}

	after := before
	after.Nodes = []Node{{Name: "a", GPUs: 2, Allocatable: 2, Allocated: 2, MIGGPUs: 1, MIGInUse: 1}}
	after.Totals.Allocated, after.Totals.Utilisation = 2, 1
	after.Queues = []Queue{{Name: "q", Allocated: 2, Quota: &quota}, {Name: "r", Allocated: 0}}
	after.Pending.Pods = 0
	got := map[string]string{}
	for _, c := range Diff(before, after) {
		got[c.Field] = c.Before + " → " + c.After
	}
	want := map[string]string{
		"nodes[a].allocated": "1.25 → 2", "totals.allocated": "1.25 → 2", "totals.utilisation": "0.625 → 1",
		"queues[q].allocated": "1.25 → 2", "queues[r].allocated": "- → 0", "queues[r].quota": "- → none", "queues[r].limit": "- → none",
		"pending.pods": "1 → 0",
	}
	if len(got) != len(want) {
		t.Errorf("diff = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("diff %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestSamplerWaits(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(uid, node string, created time.Time) v1.Pod {
		p := v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID("u" + uid), CreationTimestamp: metav1.NewTime(created)}}
		p.Spec.NodeName = node
		p.Status.Phase = v1.PodPending
		return p
	}
	s := NewSampler()
	s.Observe([]v1.Pod{mk("a", "", t0), mk("b", "", t0.Add(5*time.Second)), mk("c", "n", t0)}, t0.Add(10*time.Second))
	if s.PendingNow() != 2 {
		t.Errorf("pending = %d, want 2 (c is bound)", s.PendingNow())
	}
	s.Observe([]v1.Pod{mk("a", "n", t0), mk("b", "", t0.Add(5*time.Second))}, t0.Add(20*time.Second))
	waits := s.Waits()
	sum := 0.0
	for _, w := range waits {
		sum += w
	}
	// a: bound when seen at 20 s (no PodScheduled condition) → 20 s; b: still waiting → 15 s.
	if len(waits) != 2 || sum != 35 || s.PendingNow() != 1 {
		t.Errorf("waits = %v, pending %d; want 20 s and 15 s, 1 pending", waits, s.PendingNow())
	}
}
