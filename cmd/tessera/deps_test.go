package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinariesLinkNoTestCode: the shipped binaries import nothing under
// test/ — not the framework, the operator runner or the real-node harness
// (the sandbox's are product packages under sandbox/) — so that an installed
// tessera needs no checkout, and test code stays free to change.
func TestBinariesLinkNoTestCode(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/tessera", "./cmd/tessera-node", "./cmd/tessera-scheduler")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps listed only %d packages: %q", len(deps), deps)
	}
	const test = "github.com/tessera-gpu/tessera/test/"
	for _, d := range deps {
		if strings.HasPrefix(d, test) {
			t.Errorf("a binary links test code: %s", d)
		}
	}
	for _, want := range []string{"github.com/tessera-gpu/tessera/sandbox/operators", "github.com/tessera-gpu/tessera/sandbox/realnode", "github.com/tessera-gpu/tessera/sandbox/nodebin", "github.com/tessera-gpu/tessera/sandbox/opbin"} {
		found := false
		for _, d := range deps {
			found = found || d == want
		}
		if !found {
			t.Errorf("%s is not linked: the test no longer sees what the sandbox uses", want)
		}
	}
}
