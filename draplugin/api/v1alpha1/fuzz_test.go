package v1alpha1

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecode: any opaque config, tessera's or NVIDIA's, decodes or is
// refused with an error, never a panic; what decodes is within what the
// tools accept (these values reach nvidia-cuda-mps-control's environment
// and stdin and nvidia-smi's argv), and encodes and decodes to the same
// config. Seeds: testdata/fuzz/FuzzDecode (upstream-shaped configs and
// hostile values).
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode(data)
		if err != nil {
			if c != nil {
				t.Fatalf("config %+v returned with error %v", c, err)
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error")
			}
			return
		}
		if c == nil {
			t.Fatal("nil config without error")
		}
		var m *MPSConfig
		switch c := c.(type) {
		case *GpuConfig:
			if c.APIVersion != SchemeGroupVersion.String() || c.Kind != GpuConfigKind {
				t.Fatalf("decoded as %s %s", c.APIVersion, c.Kind)
			}
			if c.Sharing != nil {
				m = c.Sharing.MPS
				if ts := c.Sharing.TimeSlicing; ts != nil {
					if i, err := ts.Interval.Index(); err != nil || i < 0 || i > 3 {
						t.Fatalf("interval %q decoded", ts.Interval)
					}
				}
			}
		case *MigDeviceConfig:
			if c.APIVersion != SchemeGroupVersion.String() || c.Kind != MigDeviceConfigKind {
				t.Fatalf("decoded as %s %s", c.APIVersion, c.Kind)
			}
			if c.Sharing != nil {
				m = c.Sharing.MPS
			}
		default:
			t.Fatalf("decoded to %T", c)
		}
		if m != nil {
			if p := m.ActiveThreadPercentage; p != nil && (*p < 1 || *p > 100) {
				t.Fatalf("thread percentage %d decoded", *p)
			}
			if l := m.PinnedDeviceMemoryLimit; l != nil && (l.Cmp(minPinnedMemory) < 0 || l.Cmp(maxPinnedMemory) > 0) {
				t.Fatalf("memory limit %s decoded", l)
			}
			if p := m.SMPartition; p != nil && *p != SMPartitionRequired && *p != SMPartitionPreferred {
				t.Fatalf("smPartition %q decoded", *p)
			}
		}
		// decode(encode(x)) == x: an NVIDIA config is converted to
		// tessera's, which must mean the same when read back.
		raw, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("encode %+v: %v", c, err)
		}
		back, err := Decode(raw)
		if err != nil {
			t.Fatalf("encoded config %s refused: %v", raw, err)
		}
		if !reflect.DeepEqual(canonical(t, back), canonical(t, c)) {
			t.Fatalf("round trip changed the config:\n%s\n%s", raw, canonical(t, back))
		}
	})
}

// canonical is a config's JSON (a Quantity's cached string form is not
// part of its value, so configs are compared as they encode).
func canonical(t *testing.T, c Config) string {
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}
