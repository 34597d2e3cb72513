package checkpoint

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// fuzzVersions are the envelope versions FuzzDecode wraps fuzzed data in:
// every version Decode reads, a newer one declared readable (a downgrade)
// and one not, and an unknown one.
var fuzzVersions = []struct{ version, readableAs string }{
	{VersionV3, VersionV2},
	{VersionV2, ""},
	{VersionV1, ""},
	{"tessera.gpu/checkpoint-v4", VersionV3},
	{"tessera.gpu/checkpoint-v4", ""},
	{"tessera.gpu/checkpoint-x", ""},
}

// envelopeFor wraps data like a writer of that version would, with the
// right checksum: without it the fuzzer would hardly get past the CRC.
func envelopeFor(version, readableAs, bootID string, data []byte) []byte {
	head, _ := json.Marshal(envelope{Version: version, ReadableAs: readableAs, BootID: bootID, Checksum: checksum(data)})
	return append(append(head[:len(head)-len("null}")], data...), '}')
}

// FuzzDecode: any file either decodes to a state that every later step can
// use (no nil claim, each under its own UID, known states and kinds, a MIG
// record on every MIG device), which re-encodes and decodes to the same
// state, or is refused with an error wrapping ErrCorrupt or ErrNewerVersion;
// never a panic. The fuzzed bytes are used both as a whole file and as the
// data of an envelope of each version, checksum included.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"checkpoint-v1.json", "checkpoint-v2.json", "checkpoint-v3.json", "checkpoint-v3-mps.json"} {
		raw := fixture(f, name)
		var env envelope
		if err := json.Unmarshal(raw, &env); err != nil {
			f.Fatal(err)
		}
		for i, v := range fuzzVersions {
			if v.version == env.Version {
				f.Add(raw, []byte(env.Data), uint8(i))
			}
		}
	}
	f.Fuzz(func(t *testing.T, raw, data []byte, which uint8) {
		check(t, raw)
		v := fuzzVersions[int(which)%len(fuzzVersions)]
		check(t, envelopeFor(v.version, v.readableAs, "boot-1", data))
	})
}

func check(t *testing.T, raw []byte) {
	cp, err := Decode(raw)
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNewerVersion) {
			t.Fatalf("error wraps neither ErrCorrupt nor ErrNewerVersion: %v", err)
		}
		if cp != nil {
			t.Fatalf("a checkpoint (%+v) returned with error %v", cp, err)
		}
		return
	}
	if cp.Data.Claims == nil {
		t.Fatal("decoded state has a nil claims map")
	}
	if err := cp.Data.Validate(); err != nil {
		t.Fatalf("decoded state does not validate: %v", err)
	}
	again, err := Encode(cp.BootID, &cp.Data)
	if err != nil {
		t.Fatalf("encode decoded state: %v", err)
	}
	back, err := Decode(again)
	if err != nil {
		t.Fatalf("re-encoded state refused: %v\n%s", err, again)
	}
	if !reflect.DeepEqual(back.Data, cp.Data) || back.BootID != cp.BootID {
		t.Fatalf("round trip changed the state:\n%+v\n%+v", cp.Data, back.Data)
	}
	var enc Encoder
	cached, err := enc.Encode(cp.BootID, &cp.Data)
	if err != nil || string(cached) != string(again) {
		t.Fatalf("Encoder and Encode differ (%v):\n%s\n%s", err, cached, again)
	}
}
