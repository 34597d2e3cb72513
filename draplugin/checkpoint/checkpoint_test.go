package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func sample() *Data {
	d := NewData()
	share := types.UID("share-1")
	d.Claims["uid-1"] = &Claim{UID: "uid-1", Namespace: "ns", Name: "c", State: PrepareCompleted, Devices: []Device{{
		Requests: []string{"gpu"}, Pool: "node", Device: "gpu-0-mig-1g10gb-3", Kind: KindMIG, GPUUUID: "GPU-a", GPUMinor: 0,
		MIG:          &MIGInstance{ParentUUID: "GPU-a", Profile: "1g.10gb", GIProfileID: 19, Start: 3, Size: 1, GIID: 7, Created: true},
		CDIDeviceIDs: []string{"gpu.tessera.dev/gpu=uid-1-gpu-0-mig-1g10gb-3"},
	}, {
		Requests: []string{"share"}, Pool: "node", Device: "gpu-1", ShareID: &share, Kind: KindShared, GPUUUID: "GPU-b", GPUMinor: 1,
		Sharing: &Sharing{Strategy: "MPS", ActiveThreadPercentage: 25, PinnedMemoryLimitBytes: 10 << 30, MPSDevice: "GPU-b"},
	}}}
	return &d
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	in := sample()
	if err := Write(path, "boot-1", in); err != nil {
		t.Fatal(err)
	}
	cp, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if cp.BootID != "boot-1" {
		t.Errorf("boot ID = %q", cp.BootID)
	}
	if !reflect.DeepEqual(&cp.Data, in) {
		t.Errorf("round trip changed data:\n got %+v\nwant %+v", cp.Data, *in)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", st.Mode().Perm())
	}
	// No temporary file is left behind.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the checkpoint", len(entries))
	}
}

func TestMissingIsEmpty(t *testing.T) {
	cp, err := Read(filepath.Join(t.TempDir(), "nope.json"))
	if cp != nil || err != nil {
		t.Fatalf("Read(missing) = %v, %v; want nil, nil", cp, err)
	}
}

func TestCorrupt(t *testing.T) {
	good, err := Encode("boot", sample())
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{
		"truncated":     good[:len(good)/2],
		"flipped byte":  []byte(strings.Replace(string(good), `"gpu-1"`, `"gpu-2"`, 1)),
		"other version": []byte(strings.Replace(string(good), Version, "tessera.gpu/checkpoint-v0", 1)),
		"empty":         {},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(raw)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestMoveAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "checkpoint.json")
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst, err := MoveAside(path, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(dst), "checkpoint.json.corrupt-20260102T030405") {
		t.Errorf("moved to %s", dst)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("original still there: %v", err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "garbage" {
		t.Errorf("content changed: %q", b)
	}
}

func TestBootID(t *testing.T) {
	id, err := BootID()
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != 36 {
		t.Errorf("boot ID %q does not look like a UUID", id)
	}
}

func BenchmarkWrite(b *testing.B) {
	path := filepath.Join(b.TempDir(), "checkpoint.json")
	d := sample()
	for b.Loop() {
		if err := Write(path, "boot", d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode512 is the CPU part of one checkpoint write with 512
// prepared claims (JSON and checksum, no I/O).
func BenchmarkEncode512(b *testing.B) {
	d := NewData()
	one := sample().Claims["uid-1"]
	for i := range 512 {
		c := *one
		c.UID = types.UID(fmt.Sprintf("uid-%d", i))
		d.Claims[c.UID] = &c
	}
	for b.Loop() {
		if _, err := Encode("boot", &d); err != nil {
			b.Fatal(err)
		}
	}
}

func TestEncoderMatchesEncode(t *testing.T) {
	var enc Encoder
	d := sample()
	d.Claims["uid-2"] = &Claim{UID: "uid-2", Namespace: "ns", Name: "d", State: PrepareStarted}
	for round := 0; round < 3; round++ {
		want, err := Encode("boot", d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := enc.Encode("boot", d)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("round %d: encoder differs from Encode:\n got %s\nwant %s", round, got, want)
		}
		cp, err := Decode(got)
		if err != nil || !reflect.DeepEqual(&cp.Data, d) {
			t.Fatalf("round %d: decode = %+v, %v", round, cp, err)
		}
		// Changes between writes: a started claim completes, a completed
		// one goes away.
		switch round {
		case 0:
			d.Claims["uid-2"].State = PrepareCompleted
			d.Claims["uid-2"].Devices = []Device{{Device: "gpu-4", Kind: KindGPU}}
		case 1:
			delete(d.Claims, "uid-1")
		}
	}
	if len(enc.cache) != 1 {
		t.Errorf("cache holds %d claims, want 1", len(enc.cache))
	}
	empty := NewData()
	got, _ := enc.Encode("boot", &empty)
	want, _ := Encode("boot", &empty)
	if string(got) != string(want) {
		t.Errorf("empty: %s vs %s", got, want)
	}
}

func BenchmarkEncoder512(b *testing.B) {
	d := NewData()
	one := sample().Claims["uid-1"]
	for i := range 512 {
		c := *one
		c.UID = types.UID(fmt.Sprintf("uid-%d", i))
		d.Claims[c.UID] = &c
	}
	var enc Encoder
	for b.Loop() {
		if _, err := enc.Encode("boot", &d); err != nil {
			b.Fatal(err)
		}
	}
}
