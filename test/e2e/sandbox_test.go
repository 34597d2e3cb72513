package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/sandbox"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestSandboxDemoScenario runs the demo of `make demo` with run times cut
// short and checks its outcome: both training gangs bound whole, team B's gang
// waited for quota first, no device was prepared twice, and every prepared
// claim was unprepared when the workloads went away. Meanwhile it scrapes the
// sandbox's /metrics: every metric the chart's Grafana dashboard and alerts
// name is exported, and every tessera metric follows the naming convention.
func TestSandboxDemoScenario(t *testing.T) {
	if _, err := framework.BinDir(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var narration bytes.Buffer
	s, err := sandbox.Start(ctx, sandbox.Options{
		StateDir: shortTempDir(t),
		Out:      &narration,
		Scenario: "demo",
		Speed:    9,
	})
	if err != nil {
		t.Fatalf("start sandbox: %v\n%s", err, narration.String())
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop sandbox: %v", err)
		}
	}()

	// tessera top --once against the sandbox, through the real CLI.
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := framework.WriteKubeconfig(s.Config(), kubeconfig); err != nil {
		t.Fatal(err)
	}
	top := runCLI(t, "top", "--once", "--kubeconfig", kubeconfig)
	for _, re := range []string{
		`(?m)^tessera top  \d\d:\d\d:\d\d  GPUs 0 used of 32 \(0%\)  gangs: 0 running, 0 pending$`,
		`(?m)^NODES `,
		`(?m)^  gpu-node-0 \[········\]     0/8  NVIDIA H100 80GB HBM3$`,
		`(?m)^  gpu-node-3 \[········\]     0/8  NVIDIA H100 80GB HBM3 \(4 mig, 4 shared\)$`,
		`(?m)^QUEUES  GPU units: allocated / quota / limit$`,
		`(?m)^  research \[.*\]      0 / 24     / 24     weight 1$`,
		`(?m)^    team-a \[.*\]      0 / 16     / 24     weight 1$`,
		`(?m)^    team-b \[.*\]      0 / 8      / 24     weight 1$`,
		`(?m)^GANGS\n  \(no gangs\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(top) {
			t.Errorf("tessera top --once lacks %s:\n%s", re, top)
		}
	}
	if strings.Contains(top, "\x1b[") {
		t.Errorf("tessera top --once wrote terminal escapes when not on a terminal")
	}

	// The metrics a cluster running tessera exports, gathered while the
	// demo runs (a pending gang's series exist only while it waits).
	scraped := scrapeWhile(t, s.URL()+"metrics", 500*time.Millisecond)
	res, err := s.RunDemo(ctx)
	checkDashboardsAndAlerts(t, scraped())
	if err != nil {
		t.Fatalf("demo: %v\nnarration:\n%s", err, narration.String())
	}
	if !res.OK() {
		t.Fatalf("demo outcome: %s\nnarration:\n%s", res.Problems(), narration.String())
	}
	if !strings.Contains(res.QuotaWait, `"research"`) || !strings.Contains(res.QuotaWait, "limit 24") {
		t.Errorf("train-b's wait does not name the research queue's limit: %q", res.QuotaWait)
	}
	if res.Bound["team-b/Job/train-b"] <= res.Bound["team-a/Job/train-a"] {
		t.Errorf("train-b bound at %s, not after train-a at %s", res.Bound["team-b/Job/train-b"], res.Bound["team-a/Job/train-a"])
	}
	// 16 + 10 whole-GPU claims, 3 MIG and 2 shared.
	if res.Prepared != 31 || res.Unprepared != 31 {
		t.Errorf("prepared %d and unprepared %d claims, want 31 and 31", res.Prepared, res.Unprepared)
	}
	var mps []string
	for _, c := range res.MPSCommands {
		if strings.Contains(c, "nvidia-cuda-mps-control -d") {
			mps = append(mps, c)
		}
	}
	if len(mps) == 0 {
		t.Errorf("no MPS daemon was started for the notebooks' fractions; commands: %v", res.MPSCommands)
	}
	t.Logf("first gang bound %s after start\n%s", res.FirstGangScheduled, narration.String())
}

// shortTempDir returns a temp dir with a short path: the nodes' unix sockets
// live under it, and socket paths are limited to 108 bytes.
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "sbx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// runCLI runs the tessera CLI built from this checkout.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(buildCLI(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tessera %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}
