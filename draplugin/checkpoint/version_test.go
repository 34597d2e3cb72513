package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Round trips per version, as dra-example-driver tests its checkpoint:
// every fixture decodes, re-encodes as the current version and decodes to
// the same state again.

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(raw)
}

// TestReadV1Converts: a wave-1 checkpoint is read and converted: MIG
// records tessera created (or found) get the boot of the file.
func TestReadV1Converts(t *testing.T) {
	cp, err := Decode(fixture(t, "checkpoint-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cp.ReadVersion != VersionV1 || cp.BootID != "boot-1" || len(cp.Data.Claims) != 3 {
		t.Fatalf("read %s boot %s with %d claims", cp.ReadVersion, cp.BootID, len(cp.Data.Claims))
	}
	created := cp.Data.Claims["uid-1"].Devices[0].MIG
	if !created.Created || created.GIID != 10 || created.BootID != "boot-1" {
		t.Fatalf("created MIG record %+v", created)
	}
	if static := cp.Data.Claims["uid-3"].Devices[0].MIG; !static.Static || static.BootID != "boot-1" {
		t.Fatalf("static MIG record %+v", static)
	}
	if s := cp.Data.Claims["uid-2"].Devices[0].Sharing; s == nil || s.PinnedMemoryLimitBytes != 10<<30 {
		t.Fatalf("share %+v", s)
	}
	// Written back it is a v3 checkpoint with the same state: the v3 fixture.
	raw, err := Encode(cp.BootID, &cp.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, fixture(t, "checkpoint-v3.json")) {
		t.Fatalf("v1 converted and encoded:\n%s\nwant the v3 fixture:\n%s", raw, fixture(t, "checkpoint-v3.json"))
	}
	again, err := Decode(raw)
	if err != nil || !reflect.DeepEqual(again.Data, cp.Data) || again.ReadVersion != VersionV3 {
		t.Fatalf("v3 round trip: %v %v", err, again.ReadVersion)
	}
}

// TestReadV2Converts: a v2 checkpoint (MPS daemons per device) is read and
// written back as v3 with the same state; its share keeps its per-device
// daemon (Sharing.MPSDevice, no Claim.MPS).
func TestReadV2Converts(t *testing.T) {
	cp, err := Decode(fixture(t, "checkpoint-v2.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cp.ReadVersion != VersionV2 {
		t.Fatalf("read version %s", cp.ReadVersion)
	}
	share := cp.Data.Claims["uid-2"]
	if share.MPS != nil || share.Devices[0].Sharing.MPSDevice != "GPU-b" {
		t.Fatalf("v2 share converted to %+v / %+v", share.MPS, share.Devices[0].Sharing)
	}
	out, err := Encode(cp.BootID, &cp.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, fixture(t, "checkpoint-v3.json")) {
		t.Fatalf("v2 converted:\n%s\nwant the v3 fixture", out)
	}
}

// TestReadV3RoundTrip: the current format, with a claim's own MPS daemon
// over a MIG device and a share (two device ordinals, static partitions)
// and a whole GPU in exclusive-process mode, reads and writes byte for byte.
func TestReadV3RoundTrip(t *testing.T) {
	in := fixture(t, "checkpoint-v3-mps.json")
	cp, err := Decode(in)
	if err != nil {
		t.Fatal(err)
	}
	d := cp.Data.Claims["uid-4"].MPS
	if d == nil || !reflect.DeepEqual(d.Devices, []string{"MIG-d", "GPU-e"}) || !reflect.DeepEqual(d.PinnedMemoryMiB, []int64{4096, 10240}) || cp.Data.Claims["uid-4"].Devices[1].Sharing.DeviceIndex != 1 {
		t.Fatalf("claim daemon %+v", d)
	}
	if !cp.Data.Claims["uid-5"].Devices[0].Sharing.ExclusiveProcess {
		t.Fatal("exclusive-process record lost")
	}
	out, err := Encode(cp.BootID, &cp.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatalf("v3 round trip changed the file:\n%s\n%s", in, out)
	}
	var enc Encoder
	if cached, _ := enc.Encode(cp.BootID, &cp.Data); !bytes.Equal(cached, out) {
		t.Fatal("Encoder and Encode disagree")
	}
	// A v2 reader (readableAs) keeps what it knows: the same claims and
	// devices without the v3 additions.
	var env envelope
	if err := json.Unmarshal(in, &env); err != nil || env.ReadableAs != VersionV2 {
		t.Fatalf("readableAs = %q, %v", env.ReadableAs, err)
	}
	var v2 dataV2
	if err := json.Unmarshal(env.Data, &v2); err != nil || len(v2.Claims) != 5 || v2.Claims["uid-4"].Devices[1].Sharing.MPSDevice != "GPU-e" {
		t.Fatalf("as v2: %v %+v", err, v2.Claims["uid-4"])
	}
}

// newerFile is a v4 checkpoint: v3's data plus a field v3 does not know.
func newerFile(t *testing.T, readableAs string) []byte {
	t.Helper()
	cp, _ := Decode(fixture(t, "checkpoint-v3.json"))
	data, _ := json.Marshal(cp.Data)
	data = bytes.Replace(data, []byte(`"state":"PrepareCompleted"`), []byte(`"state":"PrepareCompleted","futureField":{"x":1}`), 1)
	head, _ := json.Marshal(envelope{Version: "tessera.gpu/checkpoint-v4", ReadableAs: readableAs, BootID: "boot-1", Checksum: checksum(data)})
	return append(append(head[:len(head)-len("null}")], data...), '}')
}

// TestDowngrade: a newer file that its writer declared readable as v3 (or
// v2) is read (unknown fields ignored); one that is not is refused with
// ErrNewerVersion, not treated as corrupt, and the file stays.
func TestDowngrade(t *testing.T) {
	for _, as := range []string{VersionV3, VersionV2} {
		cp, err := Decode(newerFile(t, as))
		if err != nil {
			t.Fatalf("newer file readable as %s: %v", as, err)
		}
		if cp.ReadVersion != "tessera.gpu/checkpoint-v4" || len(cp.Data.Claims) != 3 {
			t.Fatalf("read %s with %d claims", cp.ReadVersion, len(cp.Data.Claims))
		}
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	raw := newerFile(t, "")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Read(path)
	if !errors.Is(err, ErrNewerVersion) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "checkpoint-v4") {
		t.Fatalf("unreadable newer file: %v, want ErrNewerVersion naming v4", err)
	}
	if kept, _ := os.ReadFile(path); !bytes.Equal(kept, raw) {
		t.Fatal("the newer file was changed")
	}
	// An altered newer file is still corrupt.
	if _, err := Decode(bytes.Replace(raw, []byte(`"uid-1"`), []byte(`"uid-9"`), 1)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("altered newer file: %v", err)
	}
}
