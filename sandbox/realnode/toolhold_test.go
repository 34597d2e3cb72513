package realnode

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestFakeToolHold: a held fake tool parks before it takes effect, reports
// what it was asked, and goes on (and takes effect) once released; other
// invocations of the tools do not park.
func TestFakeToolHold(t *testing.T) {
	dir := t.TempDir()
	bin, holds, pipe := filepath.Join(dir, "bin"), filepath.Join(dir, "holds"), filepath.Join(dir, "mps")
	if err := WriteFakeTools(bin); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "FAKE_TOOLS_LOG="+filepath.Join(dir, "tools.log"), "FAKE_TOOLS_HOLD_DIR="+holds, "CUDA_MPS_PIPE_DIRECTORY="+pipe)
	run := func(name string, stdin string, args ...string) (*exec.Cmd, chan error) {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Env, cmd.Stdin = env, strings.NewReader(stdin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	waitParked := func(name string, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := HeldTool(holds, name)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(got, []string{want}) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("held %s: %q, want [%q]", name, got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := HoldTool(holds, "nvidia-smi"); err == nil {
		t.Error("a hold of an unknown name was armed")
	}

	for _, name := range []string{HoldMPSDaemonStart, HoldSMIComputePolicy, HoldMPSDaemonQuit} {
		if err := HoldTool(holds, name); err != nil {
			t.Fatal(err)
		}
	}
	// Not held: a control command, another nvidia-smi call.
	if out, err := exec.Command("sh", "-c", "printf 'get_server_list\\n' | "+filepath.Join(bin, "nvidia-cuda-mps-control")).CombinedOutput(); err == nil {
		t.Errorf("a control command with no daemon succeeded: %s", out)
	} else if !strings.Contains(string(out), "Cannot find MPS control daemon") {
		t.Errorf("control command without a daemon: %s", out)
	}
	if _, done := run("nvidia-smi", "", "-i", "GPU-0", "-c", "DEFAULT"); <-done != nil {
		t.Error("nvidia-smi -c did not exit")
	}

	_, daemon := run("nvidia-cuda-mps-control", "", "-d")
	waitParked(HoldMPSDaemonStart, pipe)
	if _, err := os.Stat(filepath.Join(pipe, "control")); !os.IsNotExist(err) {
		t.Fatalf("the daemon's control pipe exists while its start is parked (%v)", err)
	}
	// PassTool lets the parked call go on; the hold stays armed.
	_, reset := run("nvidia-smi", "", "compute-policy", "-i", "GPU-0", "--set-timeslice", "0")
	waitParked(HoldSMIComputePolicy, "compute-policy -i GPU-0 --set-timeslice 0")
	if err := PassTool(holds, HoldSMIComputePolicy); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-reset:
		if err != nil {
			t.Fatalf("the passed call: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the passed call did not go on")
	}
	smi, policy := run("nvidia-smi", "", "compute-policy", "-i", "GPU-0", "--set-timeslice", "3")
	waitParked(HoldSMIComputePolicy, "compute-policy -i GPU-0 --set-timeslice 3")

	// A parked invocation that is killed stays listed until the release.
	_ = smi.Process.Kill()
	<-policy
	waitParked(HoldSMIComputePolicy, "compute-policy -i GPU-0 --set-timeslice 3")
	if err := ReleaseTool(holds, HoldSMIComputePolicy); err != nil {
		t.Fatal(err)
	}
	if got, _ := HeldTool(holds, HoldSMIComputePolicy); len(got) != 0 {
		t.Errorf("after the release: held %q", got)
	}

	if err := ReleaseTool(holds, HoldMPSDaemonStart); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-daemon:
		if err != nil {
			t.Fatalf("daemon start after the release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon start did not go on after the release")
	}
	if fi, err := os.Stat(filepath.Join(pipe, "control")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("no control pipe after the released start: %v", err)
	}

	// A quit parks while the daemon still runs (other commands do not), and
	// the daemon goes once it is released.
	if _, done := run("nvidia-cuda-mps-control", "get_server_list\n"); <-done != nil {
		t.Error("a control command parked or failed on the quit hold")
	}
	_, stop := run("nvidia-cuda-mps-control", "get_server_list\nquit\n")
	waitParked(HoldMPSDaemonQuit, pipe)
	if fi, err := os.Stat(filepath.Join(pipe, "control")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the daemon is gone while its quit is parked: %v", err)
	}
	if err := ReleaseTool(holds, HoldMPSDaemonQuit); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stop:
		if err != nil {
			t.Fatalf("quit after the release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the quit did not go on after the release")
	}
	if _, err := os.Stat(filepath.Join(pipe, "control")); !os.IsNotExist(err) {
		t.Errorf("the control pipe is still there after the released quit (%v)", err)
	}
}
