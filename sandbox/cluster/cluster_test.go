package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
)

func TestMain(m *testing.M) {
	if out := os.Getenv(childEnv); out != "" {
		childThatPanics(out)
	}
	os.Exit(m.Run())
}

// childEnv makes the test binary act as the child of
// TestPanickingTestLeavesNothingBehind instead of running the tests.
const childEnv = "TESSERA_FRAMEWORK_CHILD"

func (cp *ControlPlane) pids() []int {
	var pids []int
	for _, p := range []*proc.Process{cp.etcd, cp.apiserver, cp.kcm} {
		if p != nil {
			pids = append(pids, p.Pid())
		}
	}
	return pids
}

// alive reports whether pid is a live process (a zombie counts as dead: it has
// exited and only waits to be reaped by init).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func waitDead(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is still running", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestStopLeavesNothingBehind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pids := cp.pids()
	if len(pids) != 3 {
		t.Fatalf("want etcd, kube-apiserver and kube-controller-manager, got %d processes", len(pids))
	}
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("process %d not running after Start", pid)
		}
	}
	dir := cp.Dir
	cp.Stop()
	waitDead(t, pids)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("control-plane dir %s not removed: %v", dir, err)
	}
	cp.Stop() // a second Stop is harmless
}

// TestPanickingTestLeavesNothingBehind runs a child test binary that starts a
// control plane and panics without cleaning up: its processes must die with it
// (Pdeathsig), and the next Start sweeps its directory.
func TestPanickingTestLeavesNothingBehind(t *testing.T) {
	out := filepath.Join(t.TempDir(), "child")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+out)
	output, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child test should have panicked; output:\n%s", output)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("child did not record its control plane: %v; output:\n%s", err, output)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	dir := lines[0]
	var pids []int
	for _, l := range lines[1:] {
		pid, err := strconv.Atoi(l)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	waitDead(t, pids)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("expected the dead child's dir %s to still exist before the sweep: %v", dir, err)
	}
	sweepStale()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sweep did not remove %s", dir)
	}
}

// childThatPanics starts a control plane, records its directory and processes
// in the file out, and panics without stopping it.
func childThatPanics(out string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{NoControllerManager: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	record := cp.Dir + "\n"
	for _, pid := range cp.pids() {
		record += strconv.Itoa(pid) + "\n"
	}
	if err := os.WriteFile(out, []byte(record), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	panic("a test that dies without cleaning up")
}

func TestMissingBinariesGiveAClearError(t *testing.T) {
	t.Setenv(EnvBinDir, t.TempDir())
	_, err := Start(context.Background(), Options{})
	if err == nil || !strings.Contains(err.Error(), "hack/build-k8s.sh") {
		t.Fatalf("want an error that says how to build the binaries, got %v", err)
	}
}
