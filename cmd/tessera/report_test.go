package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReportShadowRejectsBadOutput(t *testing.T) {
	cmd := newRootCommand()
	cmd.SetArgs([]string{"report", "shadow", "-o", "xml", "--kubeconfig", "/nonexistent"})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `--output "xml"`) {
		t.Errorf("tessera report shadow -o xml: error %v, want one naming --output", err)
	}
}

func TestReportDiffOfSavedBaselines(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	before := write("before.json", `{"time":"2026-01-01T00:00:00Z","windowSeconds":0,"totals":{"gpuNodes":1,"gpus":8,"allocated":2},"nodes":[{"name":"a","gpus":8,"allocatable":8,"allocated":2}]}`)
	after := write("after.json", `{"time":"2026-01-02T00:00:00Z","windowSeconds":0,"totals":{"gpuNodes":1,"gpus":8,"allocated":6},"nodes":[{"name":"a","gpus":8,"allocatable":8,"allocated":6}]}`)
	bad := write("bad.json", `{"gangs":[]}`)

	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"report", "diff", before, after, "-o", "json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var changes []map[string]string
	if err := json.Unmarshal(out.Bytes(), &changes); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(changes) != 2 || changes[0]["field"] != "nodes[a].allocated" || changes[0]["before"] != "2" || changes[0]["after"] != "6" || changes[1]["field"] != "totals.allocated" {
		t.Errorf("changes = %v", changes)
	}

	cmd = newRootCommand()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"report", "diff", before, bad})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "bad.json: not a baseline report") {
		t.Errorf("diff with a file that is not a baseline: %v", err)
	}
}
