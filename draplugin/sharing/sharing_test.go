package sharing

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
)

func TestMPSLifecycle(t *testing.T) {
	tools := faketools.Install(t)
	root := t.TempDir()
	c := &Controller{Exec: executor.OS{}, MPSRoot: root}
	ctx := context.Background()

	d, err := c.StartMPS(ctx, "GPU-1")
	if err != nil {
		t.Fatal(err)
	}
	pipe, log := filepath.Join(root, "GPU-1", "pipe"), filepath.Join(root, "GPU-1", "log")
	if d.PipeDir != pipe || d.LogDir != log {
		t.Errorf("daemon = %+v", d)
	}
	if !c.Running("GPU-1") {
		t.Error("daemon not running after start")
	}
	// A second start finds the running daemon and runs nothing.
	if _, err := c.StartMPS(ctx, "GPU-1"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Daemons(); err != nil || !reflect.DeepEqual(got, []string{"GPU-1"}) {
		t.Errorf("Daemons = %v, %v", got, err)
	}
	if err := c.StopMPS(ctx, "GPU-1"); err != nil {
		t.Fatal(err)
	}
	// Stopping a stopped daemon runs nothing and succeeds.
	if err := c.StopMPS(ctx, "GPU-1"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Daemons(); err != nil || len(got) != 0 {
		t.Errorf("Daemons after stop = %v, %v", got, err)
	}
	want := []string{
		"nvidia-cuda-mps-control -d | visible=GPU-1 pipe=" + pipe + " log=" + log + " | stdin=",
		"nvidia-cuda-mps-control  | visible= pipe=" + pipe + " log=" + log + " | stdin=quit",
	}
	if got := tools.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMPSStartFailure(t *testing.T) {
	tools := faketools.Install(t)
	tools.FailMPS(t, true)
	c := &Controller{Exec: executor.OS{}, MPSRoot: t.TempDir()}
	_, err := c.StartMPS(context.Background(), "GPU-9")
	if err == nil || !strings.Contains(err.Error(), "GPU-9") || !strings.Contains(err.Error(), "fake failure") {
		t.Fatalf("err = %v", err)
	}
}

func TestSetTimeSlice(t *testing.T) {
	tools := faketools.Install(t)
	c := &Controller{Exec: executor.OS{}}
	if err := c.SetTimeSlice(context.Background(), "GPU-2", 3); err != nil {
		t.Fatal(err)
	}
	if err := c.SetTimeSlice(context.Background(), "GPU-2", 4); err == nil {
		t.Error("interval 4 accepted")
	}
	want := []string{"nvidia-smi compute-policy -i GPU-2 --set-timeslice 3"}
	if got := tools.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

func TestClientEnv(t *testing.T) {
	got := ClientEnv(&checkpoint.Sharing{Strategy: "MPS", ActiveThreadPercentage: 25, PinnedMemoryLimitBytes: 10<<30 + 5})
	want := []string{
		"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("env = %q, want %q", got, want)
	}
}
