package v1alpha1

import (
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		wantErr string // substring; empty means success
		check   func(t *testing.T, c Config)
	}{
		{
			name: "gpu config without sharing",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig"}`,
			check: func(t *testing.T, c Config) {
				if g := c.(*GpuConfig); g.Sharing != nil {
					t.Errorf("sharing = %+v, want nil", g.Sharing)
				}
			},
		},
		{
			name: "time slicing defaults interval",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`,
			check: func(t *testing.T, c Config) {
				g := c.(*GpuConfig)
				if g.Sharing.TimeSlicing == nil || g.Sharing.TimeSlicing.Interval != DefaultTimeSlice {
					t.Errorf("interval not defaulted: %+v", g.Sharing.TimeSlicing)
				}
			},
		},
		{
			name: "time slicing long",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`,
			check: func(t *testing.T, c Config) {
				i, err := c.(*GpuConfig).Sharing.TimeSlicing.Interval.Index()
				if err != nil || i != 3 {
					t.Errorf("index = %d, %v; want 3", i, err)
				}
			},
		},
		{
			name: "mps limits",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"activeThreadPercentage":40,"pinnedDeviceMemoryLimit":"10Gi"}}}`,
			check: func(t *testing.T, c Config) {
				m := c.(*GpuConfig).Sharing.MPS
				if *m.ActiveThreadPercentage != 40 || m.PinnedDeviceMemoryLimit.Value() != 10<<30 {
					t.Errorf("mps = %+v", m)
				}
			},
		},
		{
			name: "mig mps",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mps":{"activeThreadPercentage":50}}}`,
			check: func(t *testing.T, c Config) {
				if c.ConfigKind() != MigDeviceConfigKind {
					t.Errorf("kind = %s", c.ConfigKind())
				}
			},
		},
		{name: "wrong api version", in: `{"apiVersion":"gpu.tessera.dev/v1","kind":"GpuConfig"}`, wantErr: `apiVersion: Unsupported value: "gpu.tessera.dev/v1"`},
		{name: "unknown kind", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"TpuConfig"}`, wantErr: `kind: Unsupported value: "TpuConfig"`},
		{name: "unknown field", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"activeThreads":5}}}`, wantErr: `unknown field "sharing.mps.activeThreads"`},
		{name: "case mismatch is unknown", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","Sharing":{"strategy":"MPS"}}`, wantErr: `unknown field "Sharing"`},
		{name: "duplicate field", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","strategy":"MPS"}}`, wantErr: `duplicate field "sharing.strategy"`},
		{name: "bad strategy", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Spatial"}}`, wantErr: `sharing.strategy: Unsupported value: "Spatial"`},
		{name: "bad interval", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Tiny"}}}`, wantErr: `sharing.timeSlicing.interval: Unsupported value: "Tiny"`},
		{name: "mps block with time slicing", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","mps":{}}}`, wantErr: `sharing.mps: Forbidden`},
		{name: "time slicing block with mps", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","timeSlicing":{}}}`, wantErr: `sharing.timeSlicing: Forbidden`},
		{name: "percentage too high", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"activeThreadPercentage":101}}}`, wantErr: `sharing.mps.activeThreadPercentage: Invalid value: 101`},
		{name: "memory too small", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"100Ki"}}}`, wantErr: `sharing.mps.pinnedDeviceMemoryLimit: Invalid value: "100Ki"`},
		{name: "bad quantity", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"lots"}}}`, wantErr: `sharing.mps.pinnedDeviceMemoryLimit: Invalid value: "lots": must be a quantity`},
		{name: "mig time slicing", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":{"strategy":"TimeSlicing"}}`, wantErr: `sharing.strategy: Unsupported value: "TimeSlicing"`},
		{name: "not json", in: `apiVersion: x`, wantErr: `decode opaque config`},
		{
			name: "sm partition",
			in:   `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"smPartition":"Required"}}}`,
			check: func(t *testing.T, c Config) {
				if p := c.(*GpuConfig).Sharing.MPS.SMPartition; p == nil || *p != SMPartitionRequired {
					t.Errorf("smPartition = %v", p)
				}
			},
		},
		{name: "bad sm partition", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mps":{"smPartition":"Always"}}}`, wantErr: `sharing.mps.smPartition: Unsupported value: "Always"`},
		{name: "memory too large", in: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"2Pi"}}}`, wantErr: `must be at most 1Pi`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Decode([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			tc.check(t, c)
		})
	}
}
