package nvmlbackend_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// TestControlHold: a hold sent over the control socket parks the method's
// calls at their entry — the instance is not there while the call is parked,
// `held` names the GPU — and release lets the call finish. A method a hold
// cannot park is refused with the reason.
func TestControlHold(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "nvml.sock")
	lib, err := nvmlbackend.Open("mock:dgxa100?gpus=1&root=" + filepath.Join(dir, "driver") + "&control=" + sock)
	if err != nil {
		t.Fatal(err)
	}
	m := lib.(*nvmlbackend.Mock)
	t.Cleanup(func() { _ = lib.Shutdown() })
	gpu := m.GPUs()[0]
	if err := gpu.EnableMIG(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	if err := nvmlbackend.SendControl(ctx, sock, "hold GetName"); err == nil || !strings.Contains(err.Error(), "not a method a hold can park") {
		t.Errorf("hold GetName: %v, want a refusal", err)
	}
	if err := nvmlbackend.SendControl(ctx, sock, "hold CreateComputeInstance"); err != nil {
		t.Fatal(err)
	}
	if out, err := nvmlbackend.QueryControl(ctx, sock, "held CreateComputeInstance"); err != nil || out != "0" {
		t.Errorf("held before any call: %q, %v; want 0", out, err)
	}
	done := make(chan error, 1)
	go func() { _, err := gpu.CreateInstance("1g.5gb", 0); done <- err }()
	want := "1 " + gpu.UUID
	var out string
	for ctx.Err() == nil {
		if out, err = nvmlbackend.QueryControl(ctx, sock, "held CreateComputeInstance"); err != nil || out == want {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out != want {
		t.Fatalf("held: %q, %v; want %q", out, err, want)
	}
	select {
	case err := <-done:
		t.Fatalf("the held call returned (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	// The GPU instance is there (its create was not held), no compute
	// instance yet: no MIG device.
	for _, in := range gpu.Instances() {
		if in.UUID != "" {
			t.Errorf("a MIG device exists while its create is parked: %v", in)
		}
	}
	if err := nvmlbackend.SendControl(ctx, sock, "release CreateComputeInstance"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the released call: %v", err)
	}
	if n := len(gpu.Instances()); n != 1 {
		t.Errorf("%d instances after the release, want 1", n)
	}
	if out, err := nvmlbackend.QueryControl(ctx, sock, "held CreateComputeInstance"); err != nil || out != "0" {
		t.Errorf("held after release: %q, %v; want 0", out, err)
	}

	// GetMigMode (a whole GPU's prepare asks it) parks the same way.
	if err := nvmlbackend.SendControl(ctx, sock, "hold GetMigMode"); err != nil {
		t.Fatal(err)
	}
	modes := make(chan int, 1)
	go func() { cur, _, _ := gpu.GetMigMode(); modes <- cur }()
	for ctx.Err() == nil {
		if out, err = nvmlbackend.QueryControl(ctx, sock, "held GetMigMode"); err != nil || out == want {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out != want {
		t.Fatalf("held GetMigMode: %q, %v; want %q", out, err, want)
	}
	select {
	case <-modes:
		t.Fatal("the held GetMigMode returned")
	case <-time.After(100 * time.Millisecond):
	}
	if err := nvmlbackend.SendControl(ctx, sock, "release GetMigMode"); err != nil {
		t.Fatal(err)
	}
	if cur := <-modes; cur != 1 {
		t.Errorf("GetMigMode after the release: current %d, want 1 (enabled)", cur)
	}
}
