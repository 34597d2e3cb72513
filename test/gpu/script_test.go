// Package gpu holds the read-only real-GPU check (check.sh, gpucheck,
// modelcheck); this test runs the script itself on a mock machine.
package gpu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckScriptIsReadOnly runs check.sh with a fake nvidia-smi that
// records its arguments and with gpucheck and tessera-node built from this
// tree on a mock DGX H100: the script finishes with status 0, its log says
// the model matches, and every nvidia-smi call is a query.
func TestCheckScriptIsReadOnly(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	build := func(name, pkg string) string {
		bin := filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
		return bin
	}
	gpucheck := build("gpucheck", "github.com/tessera-gpu/tessera/test/gpu/gpucheck")
	node := build("tessera-node", "github.com/tessera-gpu/tessera/cmd/tessera-node")
	calls := filepath.Join(dir, "nvidia-smi.calls")
	fake := "#!/bin/sh\necho \"$@\" >> " + calls + "\necho fake nvidia-smi\n"
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "nvidia-smi"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "check.sh")
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"),
		"OUT="+dir, "BACKEND=mock:dgxh100?gpus=2", "GPUCHECK="+gpucheck, "TESSERA_NODE="+node)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("check.sh: %v\n%s", err, out)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "tessera-gpu-check.log"))
	for _, want := range []string{"matches the model h100-80gb", "RESULT: OK", "gpu-1: validates", "status 0"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	raw, _ := os.ReadFile(calls)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 5 {
		t.Errorf("nvidia-smi calls %q, want 5", lines)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		query := len(f) > 0 && strings.HasPrefix(f[0], "--query-gpu=") ||
			len(f) == 2 && f[0] == "mig" && (f[1] == "-lgip" || f[1] == "-lgipp" || f[1] == "-lgi" || f[1] == "-lci")
		if !query {
			t.Errorf("nvidia-smi %s is not a query", l)
		}
	}
}
