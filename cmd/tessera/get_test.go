package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/overview"
)

func TestGetPrintsJSONAndTables(t *testing.T) {
	quota, limit := 8.0, 12.0
	c := overview.Cluster{
		Nodes: []overview.Node{{Name: "n1", GPUs: []overview.GPU{
			{Minor: 0, Product: "NVIDIA H100 80GB HBM3", Mode: "whole", Used: 1, Detail: "whole", Claims: []string{"a/c"}},
			{Minor: 1, Mode: "shared", Used: 0.25, Detail: "20Gi of 80Gi", Tainted: true},
		}}},
		Queues: []overview.Queue{{Name: "team-a", Parent: "research", Depth: 1, Allocated: 9, Quota: &quota, Limit: &limit, Weight: 2}},
		Gangs: []overview.Gang{{Namespace: "a", Name: "job-train", Queue: "team-a", Phase: "Pending", MinMember: 16, Members: 16, Waiting: 42 * time.Second, Reason: "queue over its limit",
			Position: &v1alpha1.QueuePosition{InQueue: 2, Overall: 5}}},
	}

	var out bytes.Buffer
	if err := printGet(&out, "gpus", "json", c); err != nil {
		t.Fatal(err)
	}
	var gpus []map[string]any
	if err := json.Unmarshal(out.Bytes(), &gpus); err != nil {
		t.Fatalf("gpus -o json is not JSON: %v\n%s", err, out.String())
	}
	if len(gpus) != 2 || gpus[0]["node"] != "n1" || gpus[1]["mode"] != "shared" || gpus[1]["tainted"] != true {
		t.Errorf("gpus -o json = %v", gpus)
	}

	out.Reset()
	if err := printGet(&out, "queues", "table", c); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[1]), " ") != "team-a research 9 0 8 12 2" {
		t.Errorf("queues table:\n%s", out.String())
	}

	out.Reset()
	if err := printGet(&out, "gangs", "table", c); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "job-train") || !strings.Contains(out.String(), "0/16") || !strings.Contains(out.String(), "queue over its limit") ||
		!strings.Contains(out.String(), "POSITION") || !strings.Contains(out.String(), " 2/5 ") {
		t.Errorf("gangs table:\n%s", out.String())
	}

	// An empty cluster prints an empty JSON list, not null, for scripts.
	out.Reset()
	if err := printGet(&out, "gangs", "json", overview.Cluster{}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out.String()) != "[]" {
		t.Errorf("empty gangs -o json = %q, want []", out.String())
	}
}

func TestGetRejectsBadArguments(t *testing.T) {
	for _, args := range [][]string{{"get", "pods"}, {"get", "gangs", "-o", "xml"}} {
		cmd := newRootCommand()
		cmd.SetArgs(append(args, "--kubeconfig", "/nonexistent"))
		var stderr bytes.Buffer
		cmd.SetErr(&stderr)
		cmd.SetOut(&stderr)
		err := cmd.Execute()
		if err == nil || (!strings.Contains(err.Error(), "unknown resource") && !strings.Contains(err.Error(), "--output")) {
			t.Errorf("tessera %v: error %v, want one naming the bad argument", args, err)
		}
	}
}
