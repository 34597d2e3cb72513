package cdi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestWriteReadRemove(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	uid := types.UID("0b7d3c6e-1111-2222-3333-444455556666")
	ids, err := w.Write(uid, []byte(`{"uid":"x"}`), []Device{
		{Name: "gpu-0", DeviceNodes: []string{GPUNode(0)}},
		{Name: "gpu-1", DeviceNodes: []string{GPUNode(1)}, Env: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
			Mounts: []Mount{{HostPath: "/run/mps/GPU-1/pipe", ContainerPath: "/tmp/nvidia-mps"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"k8s.gpu.tessera.dev/claim=" + string(uid) + "-gpu-0", "k8s.gpu.tessera.dev/claim=" + string(uid) + "-gpu-1"}
	if !reflect.DeepEqual(ids, want) {
		t.Errorf("ids = %q, want %q", ids, want)
	}

	// A fresh CDI cache, as a container runtime would build it, resolves
	// the IDs and injects the device nodes, env and mounts.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("spec errors: %v", errs)
	}
	dev := cache.GetDevice(ids[1])
	if dev == nil {
		t.Fatalf("runtime cannot resolve %s; devices: %v", ids[1], cache.ListDevices())
	}
	raw, _ := os.ReadFile(w.SpecPath(uid))
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "/run/mps/GPU-1/pipe"} {
		if !strings.Contains(string(raw), s) {
			t.Errorf("spec lacks %q: %s", s, raw)
		}
	}

	records, broken, err := w.Claims()
	if err != nil || len(broken) != 0 {
		t.Fatal(err, broken)
	}
	if string(records[uid]) != `{"uid":"x"}` || len(records) != 1 {
		t.Errorf("records = %q", records)
	}

	if err := w.Remove(uid); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove(uid); err != nil {
		t.Fatalf("second remove: %v", err)
	}
	if _, err := os.Stat(w.SpecPath(uid)); !os.IsNotExist(err) {
		t.Errorf("spec still there: %v", err)
	}
}

func TestWriteRejectsInvalid(t *testing.T) {
	w, err := NewWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Write("uid", nil, []Device{{Name: "bad name!", DeviceNodes: []string{"/dev/nvidia0"}}})
	if err == nil || !strings.Contains(err.Error(), "uid") {
		t.Fatalf("err = %v, want a validation error naming the claim", err)
	}
	if entries, _ := os.ReadDir(w.dir); len(entries) != 0 {
		t.Errorf("invalid spec left files: %v", entries)
	}
}

func TestMIGCaps(t *testing.T) {
	// Without the driver's table the fixed layout is used.
	nodes, err := MIGCaps{MinorsFile: filepath.Join(t.TempDir(), "none")}.Nodes(1, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157"}; !reflect.DeepEqual(nodes, want) {
		t.Errorf("computed nodes = %q, want %q", nodes, want)
	}
	// The driver's table wins.
	table := filepath.Join(t.TempDir(), "mig-minors")
	if err := os.WriteFile(table, []byte("config 1\nmonitor 2\ngpu1/gi2/access 40\ngpu1/gi2/ci0/access 41\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes, err = MIGCaps{MinorsFile: table}.Nodes(1, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/dev/nvidia-caps/nvidia-cap40", "/dev/nvidia-caps/nvidia-cap41"}; !reflect.DeepEqual(nodes, want) {
		t.Errorf("table nodes = %q, want %q", nodes, want)
	}
	if _, err := (MIGCaps{MinorsFile: table}).Nodes(0, 0, 0); err == nil {
		t.Error("missing table entry accepted")
	}
}
