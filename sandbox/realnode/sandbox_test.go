package realnode

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartForSandboxSaysWhy: where the machine cannot run a real node, the
// sandbox gets ErrUnavailable with the reason, and nothing is started or
// built: here either what the machine lacks (root, runc, …) or, on a machine
// that has it all, the tessera-node binary — a test binary is built in a
// checkout, so it cannot build tessera-node at a module version, and none is
// next to it or on PATH.
func TestStartForSandboxSaysWhy(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(EnvBinDir, empty)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	// PATH with the tools the machine check looks for, and no tessera-node.
	path := t.TempDir()
	for _, tool := range []string{"unshare", "nsenter", "ip", "go"} {
		if p, err := exec.LookPath(tool); err == nil {
			if err := os.Symlink(p, filepath.Join(path, tool)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("PATH", path)
	_, err := StartForSandbox(context.Background(), SandboxOptions{NodeName: "n", Kubeconfig: "/nonexistent"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("StartForSandbox: %v, want ErrUnavailable", err)
	}
	if machine := CheckMachine(); machine != nil {
		if !strings.Contains(err.Error(), machine.Error()) {
			t.Errorf("the reason %q does not say what the machine lacks (%v)", err, machine)
		}
	} else if !strings.Contains(err.Error(), "no tessera-node next to this program or on PATH") || !strings.Contains(err.Error(), "make build") {
		t.Errorf("the reason does not say that tessera-node is missing and how to get it: %v", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("node binaries were built for a node that cannot start: %v", entries)
	}
	if Running() {
		t.Error("a real node runs after a refused start")
	}
}

// TestCheckNeedsStaticBusybox: a dynamically linked busybox would not run
// in the test image, which holds no C library.
func TestCheckNeedsStaticBusybox(t *testing.T) {
	if err := checkStatic("/bin/sh"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("checkStatic(/bin/sh) = %v, want a dynamically-linked error", err)
	}
}
