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

func fixture(t *testing.T, name string) []byte {
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
	// Written back it is a v2 checkpoint with the same state: the v2 fixture.
	raw, err := Encode(cp.BootID, &cp.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, fixture(t, "checkpoint-v2.json")) {
		t.Fatalf("v1 converted and encoded:\n%s\nwant the v2 fixture:\n%s", raw, fixture(t, "checkpoint-v2.json"))
	}
	again, err := Decode(raw)
	if err != nil || !reflect.DeepEqual(again.Data, cp.Data) || again.ReadVersion != VersionV2 {
		t.Fatalf("v2 round trip: %v %v", err, again.ReadVersion)
	}
}

// TestReadV2RoundTrip: the current format reads and writes byte for byte.
func TestReadV2RoundTrip(t *testing.T) {
	in := fixture(t, "checkpoint-v2.json")
	cp, err := Decode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Encode(cp.BootID, &cp.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(in, out) {
		t.Fatalf("v2 round trip changed the file:\n%s\n%s", in, out)
	}
	var enc Encoder
	if cached, _ := enc.Encode(cp.BootID, &cp.Data); !bytes.Equal(cached, out) {
		t.Fatal("Encoder and Encode disagree")
	}
}

// newerFile is a v3 checkpoint: v2's data plus a field v2 does not know.
func newerFile(t *testing.T, readableAs string) []byte {
	t.Helper()
	cp, _ := Decode(fixture(t, "checkpoint-v2.json"))
	data, _ := json.Marshal(cp.Data)
	data = bytes.Replace(data, []byte(`"state":"PrepareCompleted"`), []byte(`"state":"PrepareCompleted","futureField":{"x":1}`), 1)
	head, _ := json.Marshal(envelope{Version: "tessera.gpu/checkpoint-v3", ReadableAs: readableAs, BootID: "boot-1", Checksum: checksum(data)})
	return append(append(head[:len(head)-len("null}")], data...), '}')
}

// TestDowngrade: a newer file that its writer declared readable as v2 is
// read (unknown fields ignored); one that is not is refused with
// ErrNewerVersion, not treated as corrupt, and the file stays.
func TestDowngrade(t *testing.T) {
	cp, err := Decode(newerFile(t, VersionV2))
	if err != nil {
		t.Fatalf("readable newer file: %v", err)
	}
	if cp.ReadVersion != "tessera.gpu/checkpoint-v3" || len(cp.Data.Claims) != 3 {
		t.Fatalf("read %s with %d claims", cp.ReadVersion, len(cp.Data.Claims))
	}
	path := filepath.Join(t.TempDir(), "checkpoint.json")
	raw := newerFile(t, "")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Read(path)
	if !errors.Is(err, ErrNewerVersion) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "checkpoint-v3") {
		t.Fatalf("unreadable newer file: %v, want ErrNewerVersion naming v3", err)
	}
	if kept, _ := os.ReadFile(path); !bytes.Equal(kept, raw) {
		t.Fatal("the newer file was changed")
	}
	// An altered newer file is still corrupt.
	if _, err := Decode(bytes.Replace(raw, []byte(`"uid-1"`), []byte(`"uid-9"`), 1)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("altered newer file: %v", err)
	}
}
