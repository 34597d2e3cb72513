package v1alpha1

import (
	"strings"
	"testing"
)

// TestNVIDIAConfigs: NVIDIA's resource.nvidia.com/v1beta1 GpuConfig and
// MigDeviceConfig are accepted and mean the same; what tessera does not
// support is an error naming the field, never silently dropped.
func TestNVIDIAConfigs(t *testing.T) {
	c, err := Decode([]byte(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if i, err := c.(*GpuConfig).Sharing.TimeSlicing.Interval.Index(); err != nil || i != 3 {
		t.Fatalf("time slice %d %v", i, err)
	}
	c, err = Decode([]byte(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := c.(*GpuConfig).Sharing.MPS; m == nil || *m.ActiveThreadPercentage != 50 || m.PinnedDeviceMemoryLimit.String() != "10Gi" {
		t.Fatalf("MPS %+v", m)
	}
	c, err = Decode([]byte(`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":25}}}`))
	if err != nil || *c.(*MigDeviceConfig).Sharing.MPS.ActiveThreadPercentage != 25 {
		t.Fatalf("MIG MPS: %+v %v", c, err)
	}
	for in, want := range map[string]string{
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"0":"2Gi"}}}}`: "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: Forbidden",
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"multiUser":true}}}`:                                "sharing.mpsConfig.multiUser: Forbidden",
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"TimeSlicing"}}`:                                                 `sharing.strategy: Unsupported value: "TimeSlicing"`,
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{}}}`:                                                      `unknown field "sharing.mps"`,
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"ComputeDomainConfig"}`:                                                                                  `kind: Unsupported value: "ComputeDomainConfig"`,
		`{"apiVersion":"resource.nvidia.com/v1","kind":"GpuConfig"}`:                                                                                                 `supported values: "gpu.tessera.dev/v1alpha1", "resource.nvidia.com/v1beta1"`,
	} {
		if _, err := Decode([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Decode(%s) = %v, want an error containing %q", in, err, want)
		}
	}
}
