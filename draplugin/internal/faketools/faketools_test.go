package faketools

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, env []string, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("nvidia-cuda-mps-control", args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestFakeMPSDaemon(t *testing.T) {
	Install(t)
	pipe, log := filepath.Join(t.TempDir(), "pipe"), filepath.Join(t.TempDir(), "log")
	env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_LOG_DIRECTORY=" + log}

	if out, err := run(t, env, "get_server_list\n"); err == nil || !strings.Contains(out, "Cannot find MPS control daemon") {
		t.Fatalf("command without a daemon: %q, %v", out, err)
	}
	start := append(env, "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M,1=2G", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25")
	if out, err := run(t, start, "", "-d"); err != nil {
		t.Fatalf("-d: %q, %v", out, err)
	}
	if out, err := run(t, start, "", "-d"); err == nil || !strings.Contains(out, "already running") {
		t.Errorf("second -d: %q, %v", out, err)
	}
	out, err := run(t, env, "get_default_device_pinned_mem_limit 1\nget_default_active_thread_percentage\nget_server_list\n")
	if err != nil || out != "2G\n25.0\n" {
		t.Errorf("limits: %q, %v", out, err)
	}
	cl, err := Connect(Container{Env: []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G"}, Mounts: map[string]string{"/tmp/nvidia-mps": pipe}, UID: 1000})
	if err != nil || !cl.MPS || cl.PinnedMemLimitMiB[0] != 1024 || cl.PinnedMemLimitMiB[1] != 2048 || cl.ActiveThreadPercentage != 25 {
		t.Errorf("client raising its own limit = %+v, %v; want the daemon's 1024/2048 MiB and 25%%", cl, err)
	}
	if _, err := Connect(Container{Mounts: map[string]string{"/tmp/nvidia-mps": pipe}, UID: 2000}); err != ErrQueued {
		t.Errorf("second user while the first has clients: %v, want queued", err)
	}
	if out, _ := run(t, env, "get_server_list\n"); strings.TrimSpace(out) == "" {
		t.Error("no server listed after a client connected")
	}
	// Killed: the pipe stays, commands fail, quit fails, -d fails until the
	// stale pipe is removed.
	if err := KillDaemon(pipe); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(pipe, "control")); err != nil {
		t.Errorf("killed daemon's pipe gone: %v", err)
	}
	if out, err := run(t, env, "quit\n"); err == nil || !strings.Contains(out, "Cannot find") {
		t.Errorf("quit on a dead daemon: %q, %v", out, err)
	}
	if out, err := run(t, start, "", "-d"); err == nil || !strings.Contains(out, "stale") {
		t.Errorf("-d on a stale pipe: %q, %v", out, err)
	}
	if _, err := Connect(Container{Mounts: map[string]string{"/tmp/nvidia-mps": pipe}}); err == nil {
		t.Error("client connected to a dead daemon")
	}
	_ = os.Remove(filepath.Join(pipe, "control"))
	if out, err := run(t, start, "", "-d"); err != nil {
		t.Fatalf("-d after cleaning: %q, %v", out, err)
	}
	if out, err := run(t, env, "quit\n"); err != nil {
		t.Fatalf("quit: %q, %v", out, err)
	}
	if Alive(pipe) {
		t.Error("alive after quit")
	}
	if d, _ := Daemon(pipe); d.Starts != 2 {
		t.Errorf("starts = %d", d.Starts)
	}
	// No pipe at all: the client runs without MPS.
	if cl, err := Connect(Container{Mounts: map[string]string{"/tmp/nvidia-mps": pipe}}); err != nil || cl.MPS {
		t.Errorf("client without a daemon's pipe: %+v, %v", cl, err)
	}
}

func TestFakeStaticPartitioning(t *testing.T) {
	tools := Install(t)
	pipe := filepath.Join(t.TempDir(), "pipe")
	env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + pipe, "CUDA_MPS_LOG_DIRECTORY=" + t.TempDir(), "CUDA_VISIBLE_DEVICES=GPU-a"}
	if out, err := run(t, env, "", "-d", "-S"); err == nil || !strings.Contains(out, "13010") {
		t.Fatalf("-S on 12080: %q, %v", out, err)
	}
	tools.SetMPSVersion(t, "13010")
	if out, _ := run(t, env, "", "-v"); !strings.Contains(out, "13010") {
		t.Errorf("-v = %q", out)
	}
	if out, err := run(t, env, "", "-d", "-S"); err != nil {
		t.Fatalf("-d -S: %q, %v", out, err)
	}
	out, err := run(t, env, "sm_partition add GPU-a 4\n")
	if err != nil || !strings.HasPrefix(out, "Partition GPU-a/") || !strings.HasSuffix(out, " created\n") {
		t.Fatalf("add: %q, %v", out, err)
	}
	id := strings.TrimSuffix(strings.TrimPrefix(out, "Partition "), " created\n")
	if out, _ := run(t, env, "sm_partition add GPU-a 13\n"); !strings.Contains(out, "Failed to fulfill") {
		t.Errorf("oversubscribed add: %q", out)
	}
	if out, _ := run(t, env, "lspart\n"); !strings.Contains(out, "free chunks 12, used chunks 4") {
		t.Errorf("lspart = %q", out)
	}
	mounts := map[string]string{"/tmp/nvidia-mps": pipe}
	if _, err := Connect(Container{Mounts: mounts}); err == nil || !strings.Contains(err.Error(), "INVALID_RESOURCE_CONFIGURATION") {
		t.Errorf("client without a partition: %v", err)
	}
	if cl, err := Connect(Container{Env: []string{"CUDA_MPS_SM_PARTITION=" + id}, Mounts: mounts}); err != nil || cl.Partition != id {
		t.Errorf("client in the partition: %+v, %v", cl, err)
	}
}

func TestFakeSMI(t *testing.T) {
	tools := Install(t)
	smi := func(args ...string) (string, error) {
		out, err := exec.Command("nvidia-smi", args...).CombinedOutput()
		return string(out), err
	}
	if _, err := smi("compute-policy", "-i", "GPU-1", "--set-timeslice", "3"); err != nil {
		t.Fatal(err)
	}
	if _, err := smi("compute-policy", "-i", "GPU-1", "--set-timeslice", "4"); err == nil {
		t.Error("interval 4 accepted")
	}
	if _, err := smi("compute-policy", "-i", "MIG-1", "--set-timeslice", "1"); err == nil {
		t.Error("time slice on a MIG device accepted")
	}
	if _, err := smi("-i", "GPU-1", "-c", "EXCLUSIVE_PROCESS"); err != nil {
		t.Fatal(err)
	}
	if mode, ts := tools.GPU("GPU-1"); mode != "Exclusive_Process" || ts != 3 {
		t.Errorf("GPU-1 = %s, %d", mode, ts)
	}
	if out, _ := smi("--query-gpu=compute_mode", "--format=csv,noheader", "-i", "GPU-1"); out != "Exclusive_Process\n" {
		t.Errorf("query = %q", out)
	}
	tools.FailSMI(t, true)
	if _, err := smi("-i", "GPU-1", "-c", "DEFAULT"); err == nil {
		t.Error("FailSMI had no effect")
	}
	if got := len(tools.Calls()); got != 6 {
		t.Errorf("%d calls recorded: %q", got, tools.Calls())
	}
}
