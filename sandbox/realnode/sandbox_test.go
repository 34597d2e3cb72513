package realnode

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestStartForSandboxSaysWhy: where the machine cannot run a real node, the
// sandbox gets ErrUnavailable with the reason, and nothing is started.
func TestStartForSandboxSaysWhy(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(EnvBinDir, empty)
	_, err := StartForSandbox(context.Background(), SandboxOptions{NodeName: "n", Kubeconfig: "/nonexistent"})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("StartForSandbox without node binaries: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "no kubelet in "+empty) || !strings.Contains(err.Error(), "make node-bin") {
		t.Errorf("the reason does not say what is missing and how to get it: %v", err)
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
