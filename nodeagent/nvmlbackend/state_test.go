package nvmlbackend_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// openMachine opens the mock machine a tessera-node process would: the same
// serial and state file each time.
func openMachine(t *testing.T, state string) *nvmlbackend.Mock {
	t.Helper()
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=2&serial=node-1&state=" + state)
	if err != nil {
		t.Fatal(err)
	}
	return lib.(*nvmlbackend.Mock)
}

// TestStateOutlivesTheProcess: MIG mode and instances, with their IDs and
// MIG device UUIDs, are where the previous mock of the machine left them,
// as the driver keeps them over a tessera-node restart; a GPU reset clears
// them for every later mock too.
func TestStateOutlivesTheProcess(t *testing.T) {
	state := filepath.Join(t.TempDir(), "driver.json")
	first := openMachine(t, state)
	gpu := first.GPUs()[1]
	if err := gpu.EnableMIG(); err != nil {
		t.Fatal(err)
	}
	a, err := gpu.CreateInstance("3g.40gb", 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gpu.CreateInstance("1g.10gb", 0); err != nil {
		t.Fatal(err)
	}
	before := fmt.Sprint(gpu.Instances())

	second := openMachine(t, state)
	g2 := second.GPUs()[1]
	if got := fmt.Sprint(g2.Instances()); got != before {
		t.Fatalf("after a restart: %s, want %s", got, before)
	}
	if cur, _, ret := g2.GetMigMode(); ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode after a restart: %d %v", cur, ret)
	}
	if cur, _, _ := second.GPUs()[0].GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE {
		t.Fatalf("GPU 0 MIG mode %d, never enabled", cur)
	}
	// The MIG device is found by its UUID, as NVML's clients find it.
	h, ret := second.DeviceGetHandleByUUID(a.UUID)
	if ret != nvml.SUCCESS {
		t.Fatalf("MIG device %s after a restart: %v", a.UUID, ret)
	}
	if isMig, _ := h.IsMigDeviceHandle(); !isMig {
		t.Fatal("not a MIG device handle")
	}
	// The restored instances occupy their slices: nothing overlaps them.
	if _, err := g2.CreateInstance("2g.20gb", 4); err == nil || !strings.Contains(err.Error(), "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("2g over a restored 3g: %v", err)
	}
	// Destroying through NVML is kept as well.
	gi, ret := g2.GetGpuInstanceById(int(a.GIID))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ci, ret := gi.GetComputeInstanceById(int(a.CIID))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	third := openMachine(t, state)
	if got := fmt.Sprint(third.GPUs()[1].Instances()); got != "[1g.10gb@0(gi7/ci0)]" {
		t.Fatalf("after destroy and restart: %s", got)
	}
	// A reset takes every instance, and the machine stays that way.
	if ret := third.ResetGPU(third.GPUs()[1].UUID); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if got := openMachine(t, state).GPUs()[1].Instances(); len(got) != 0 {
		t.Fatalf("after a reset and restart: %v", got)
	}
}

// TestStateOfAnotherMachineIsRefused: a file that does not describe this
// machine fails the open with a reason naming the file, and is left as it
// was.
func TestStateOfAnotherMachineIsRefused(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "driver.json")
	m := openMachine(t, good)
	if err := m.GPUs()[0].EnableMIG(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GPUs()[0].CreateInstance("7g.80gb", 0); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		spec, content, want string
	}{
		"another serial": {"mock:dgxh100?gpus=2&serial=node-2", string(data), "another machine"},
		"fewer GPUs":     {"mock:dgxh100?gpus=1&serial=node-1", string(data), "with 2 GPUs, this is dgxh100 with 1"},
		"corrupt":        {"mock:dgxh100?gpus=2&serial=node-1", `{"version":1,`, "unexpected end of JSON input"},
		"newer version":  {"mock:dgxh100?gpus=2&serial=node-1", strings.Replace(string(data), `"version": 1`, `"version": 2`, 1), "version 2"},
		"overlap":        {"mock:dgxh100?gpus=2&serial=node-1", strings.Replace(string(data), `"gpuInstances": [`, `"gpuInstances": [{"id": 1, "profileID": 9, "start": 0, "size": 4},`, 1), "cannot exist here"},
		"MIG mode off":   {"mock:dgxh100?gpus=2&serial=node-1", strings.Replace(string(data), `"migCurrent": 1`, `"migCurrent": 0`, 1), "GPU instances outside MIG mode"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "driver.json")
			if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := nvmlbackend.Open(c.spec + "&state=" + path)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("open: %v, want an error naming %s and saying %q", err, path, c.want)
			}
			if after, _ := os.ReadFile(path); string(after) != c.content {
				t.Fatal("the refused file was changed")
			}
		})
	}
	if _, err := nvmlbackend.Open("mock:dgxh100?state=" + good); err == nil || !strings.Contains(err.Error(), "state needs serial") {
		t.Fatalf("state without serial: %v", err)
	}
}

// TestStateConcurrentChanges: changes on several GPUs at once all reach the
// file (-race).
func TestStateConcurrentChanges(t *testing.T) {
	state := filepath.Join(t.TempDir(), "driver.json")
	m := openMachine(t, state)
	var wg sync.WaitGroup
	errs := make(chan error, 2*7)
	for _, g := range m.GPUs() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.EnableMIG(); err != nil {
				errs <- err
				return
			}
			for start := uint32(0); start < 7; start++ {
				if _, err := g.CreateInstance("1g.10gb", start); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	again := openMachine(t, state)
	for i, g := range again.GPUs() {
		if n := len(g.Instances()); n != 7 {
			t.Fatalf("GPU %d: %d instances after a restart, want 7", i, n)
		}
	}
}
