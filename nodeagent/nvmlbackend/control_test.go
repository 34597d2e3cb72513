package nvmlbackend_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// TestControlSocket: faults sent to a mock machine's control socket from
// outside reach it as NVML sees them — an XID event on the event set, a GPU
// lost and back — bad commands are answered with the reason, and the socket
// goes with the machine's last Shutdown. The driver root goes where the
// root option says, and stays.
func TestControlSocket(t *testing.T) {
	dir := t.TempDir()
	sock, root := filepath.Join(dir, "nvml.sock"), filepath.Join(dir, "driver")
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=2&root=" + root + "&control=" + sock)
	if err != nil {
		t.Fatal(err)
	}
	shut := false
	t.Cleanup(func() {
		if !shut {
			_ = lib.Shutdown()
		}
	})
	if r, err := nvmlbackend.RootsOf(lib); err != nil || r.Driver != root {
		t.Errorf("driver root %q (%v), want %s", r.Driver, err, root)
	}
	if _, err := os.Stat(filepath.Join(root, nvmlbackend.LibDir, "libcuda.so.1")); err != nil {
		t.Errorf("no driver installation under the root option's directory: %v", err)
	}
	dev, _ := lib.DeviceGetHandleByIndex(1)
	set, _ := lib.EventSetCreate()
	if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatalf("register events: %v", ret)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nvmlbackend.SendControl(ctx, sock, "xid 1 48"); err != nil {
		t.Fatal(err)
	}
	ev, ret := set.Wait(1000)
	if ret != nvml.SUCCESS || ev.EventData != 48 || ev.EventType != nvml.EventTypeXidCriticalError {
		t.Errorf("event after `xid 1 48`: %+v, %v", ev, ret)
	}
	uuid, _ := dev.GetUUID()
	if err := nvmlbackend.SendControl(ctx, sock, "lost "+uuid); err != nil {
		t.Fatal(err)
	}
	if _, ret := dev.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("after `lost`: %v, want ERROR_GPU_IS_LOST", ret)
	}
	if err := nvmlbackend.SendControl(ctx, sock, "back 1"); err != nil {
		t.Fatal(err)
	}
	if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("after `back`: %v, want SUCCESS", ret)
	}
	for cmd, want := range map[string]string{
		"xid 7 48":     "no GPU with index 7",
		"xid 0 x":      `"x" is not a number`,
		"ecc 0 triple": "unknown command",
		"reset 0":      "unknown command",
		"lost":         "want <command> <gpu>",
		"xid 0 31":     "no event set is registered", // GPU 0 registered nothing
	} {
		if err := nvmlbackend.SendControl(ctx, sock, cmd); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error containing %q", cmd, err, want)
		}
	}
	_ = set.Free()
	shut = true
	if ret := lib.Shutdown(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("control socket still there after Shutdown: %v", err)
	}
	if err := nvmlbackend.SendControl(ctx, sock, "lost 0"); err == nil {
		t.Error("the control socket answers after Shutdown")
	}
	if _, err := os.Stat(filepath.Join(root, nvmlbackend.LibDir)); err != nil {
		t.Errorf("the root option's driver installation was removed at Shutdown: %v", err)
	}
}

// TestControlSocketListsInstances: `instances <gpu>` answers the GPU's MIG
// instances as NVML has them (the chaos run compares them with the
// plugin's checkpoint), none on a GPU without.
func TestControlSocketListsInstances(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "nvml.sock")
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=2&control=" + sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	m := lib.(*nvmlbackend.Mock)
	g := m.GPUs()[1]
	dev, _ := lib.DeviceGetHandleByIndex(1)
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("MIG mode: %v", ret)
	}
	in, err := g.CreateInstance("1g.10gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := nvmlbackend.QueryControl(ctx, sock, "instances 1")
	if err != nil || got != in.String() {
		t.Errorf("instances 1: %q (%v), want %q", got, err, in.String())
	}
	if got, err := nvmlbackend.QueryControl(ctx, sock, "instances 0"); err != nil || got != "" {
		t.Errorf("instances 0: %q (%v), want none", got, err)
	}
	if _, err := nvmlbackend.QueryControl(ctx, sock, "instances 9"); err == nil || !strings.Contains(err.Error(), "no GPU with index 9") {
		t.Errorf("instances 9: %v, want no such GPU", err)
	}
}
