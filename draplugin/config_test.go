package draplugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	configapi "github.com/tessera-gpu/tessera/draplugin/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
)

func allocConfig(source resourceapi.AllocationConfigSource, requests []string, json string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(json)},
		}},
	}
}

const (
	tsShort = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Short"}}}`
	tsLong  = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`
	migMPS  = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`
)

func TestConfigResolution(t *testing.T) {
	// The claim's config is listed first but still overrides the class's.
	in := []resourceapi.DeviceAllocationConfiguration{
		allocConfig(resourceapi.AllocationConfigSourceClaim, nil, tsLong),
		allocConfig(resourceapi.AllocationConfigSourceClass, []string{"gpu"}, tsShort),
		allocConfig(resourceapi.AllocationConfigSourceClass, []string{"gpu"}, migMPS), // class config for another kind: ignored
		{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte(`not json`)}}}},
	}
	configs, err := decodeConfigs(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := make([]bool, len(configs))
	cfg := configFor(configs, used, "gpu", configapi.GpuConfigKind).(*configapi.GpuConfig)
	if cfg.Sharing.TimeSlicing.Interval != configapi.LongTimeSlice {
		t.Errorf("interval = %s, want the claim's Long", cfg.Sharing.TimeSlicing.Interval)
	}
	if err := unusedConfig(configs, used); err != nil {
		t.Errorf("unused class config reported: %v", err)
	}
	// The same MigDeviceConfig from the claim is a mistake.
	configs, _ = decodeConfigs([]resourceapi.DeviceAllocationConfiguration{allocConfig(resourceapi.AllocationConfigSourceClaim, nil, migMPS)}, nil)
	used = make([]bool, 1)
	configFor(configs, used, "gpu", configapi.GpuConfigKind)
	if err := unusedConfig(configs, used); err == nil || !strings.Contains(err.Error(), "config[0] (from FromClaim): the MigDeviceConfig configures none") {
		t.Errorf("err = %v", err)
	}
	// A subrequest matches a config for its parent request.
	configs, _ = decodeConfigs([]resourceapi.DeviceAllocationConfiguration{allocConfig(resourceapi.AllocationConfigSourceClaim, []string{"gpu"}, tsLong)}, nil)
	used = make([]bool, 1)
	if configFor(configs, used, "gpu/big", configapi.GpuConfigKind) == nil {
		t.Error("config for request gpu does not apply to subrequest gpu/big")
	}
	// Bad parameters name the config.
	_, err = decodeConfigs([]resourceapi.DeviceAllocationConfiguration{allocConfig(resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{}}`)}, nil)
	if err == nil || !strings.Contains(err.Error(), "config[0] (from FromClass)") || !strings.Contains(err.Error(), "sharing.strategy") {
		t.Errorf("err = %v", err)
	}
}

// TestNVIDIADriverConfigIsNotSkipped: a config left addressed to NVIDIA's
// driver in a claim of tessera's devices is an error naming it; NVIDIA's
// kinds addressed to tessera are accepted.
func TestNVIDIADriverConfigIsNotSkipped(t *testing.T) {
	nvidiaMPS := `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":40}}}`
	ported := allocConfig(resourceapi.AllocationConfigSourceClaim, nil, nvidiaMPS)
	ported.Opaque.Driver = configapi.NVIDIADriverName
	ours := []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: DriverName, Pool: "node", Device: "gpu-0"}}
	if _, err := decodeConfigs([]resourceapi.DeviceAllocationConfiguration{ported}, ours); err == nil || !strings.Contains(err.Error(), "config[0] (from FromClaim) is for driver gpu.nvidia.com") || !strings.Contains(err.Error(), "set opaque.driver to gpu.tessera.dev") {
		t.Fatalf("ported config: %v", err)
	}
	// A claim that really has devices of both drivers keeps NVIDIA's for NVIDIA.
	both := append(ours, resourceapi.DeviceRequestAllocationResult{Request: "other", Driver: configapi.NVIDIADriverName, Pool: "node", Device: "gpu-0"})
	if configs, err := decodeConfigs([]resourceapi.DeviceAllocationConfiguration{ported}, both); err != nil || len(configs) != 0 {
		t.Fatalf("mixed claim: %v %v", configs, err)
	}
	configs, err := decodeConfigs([]resourceapi.DeviceAllocationConfiguration{allocConfig(resourceapi.AllocationConfigSourceClaim, nil, nvidiaMPS)}, ours)
	if err != nil || len(configs) != 1 || *configs[0].config.(*configapi.GpuConfig).Sharing.MPS.ActiveThreadPercentage != 40 {
		t.Fatalf("NVIDIA kind for tessera: %v %v", configs, err)
	}
}

func TestGPUSharing(t *testing.T) {
	share := checkpoint.Device{Kind: checkpoint.KindShared, GPUUUID: "GPU-x"}
	consumed := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "compute": resource.MustParse("30")}
	s, err := gpuSharing(share, nil, consumed)
	if err != nil || s.Strategy != "MPS" || s.PinnedMemoryLimitBytes != 10<<30 || s.ActiveThreadPercentage != 30 || s.MPSDevice != "GPU-x" {
		t.Errorf("share default = %+v, %v", s, err)
	}
	lower := int32(20)
	gc := &configapi.GpuConfig{Sharing: &configapi.GpuSharing{Strategy: configapi.MPSStrategy, MPS: &configapi.MPSConfig{ActiveThreadPercentage: &lower}}}
	if s, err := gpuSharing(share, gc, consumed); err != nil || s.ActiveThreadPercentage != 20 {
		t.Errorf("lowered = %+v, %v", s, err)
	}
	higher := int32(50)
	gc.Sharing.MPS.ActiveThreadPercentage = &higher
	if _, err := gpuSharing(share, gc, consumed); err == nil || !strings.Contains(err.Error(), "sharing.mps.activeThreadPercentage 50 exceeds the allocated compute share (30%)") {
		t.Errorf("raised: %v", err)
	}
	whole := checkpoint.Device{Kind: checkpoint.KindGPU, GPUUUID: "GPU-y"}
	if s, err := gpuSharing(whole, nil, nil); s != nil || err != nil {
		t.Errorf("exclusive whole GPU = %+v, %v", s, err)
	}
}

func TestConflict(t *testing.T) {
	mig := func(start, size uint32) checkpoint.Device {
		return checkpoint.Device{Kind: checkpoint.KindMIG, GPUUUID: "A", MIG: &checkpoint.MIGInstance{Start: start, Size: size}}
	}
	gpu := checkpoint.Device{Kind: checkpoint.KindGPU, GPUUUID: "A"}
	share := checkpoint.Device{Kind: checkpoint.KindShared, GPUUUID: "A"}
	admin := checkpoint.Device{Kind: checkpoint.KindGPU, GPUUUID: "A", AdminAccess: true}
	other := checkpoint.Device{Kind: checkpoint.KindGPU, GPUUUID: "B"}
	for _, tc := range []struct {
		name string
		a, b checkpoint.Device
		want bool
	}{
		{"gpu/gpu", gpu, gpu, true},
		{"gpu/share", gpu, share, true},
		{"gpu/mig", gpu, mig(0, 1), true},
		{"share/share", share, share, false},
		{"share/mig", share, mig(0, 1), true},
		{"mig overlap", mig(0, 4), mig(2, 2), true},
		{"mig apart", mig(0, 2), mig(2, 2), false},
		{"admin", admin, gpu, false},
		{"other GPU", gpu, other, false},
	} {
		if got := conflict(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: conflict = %v, want %v", tc.name, got, tc.want)
		}
	}
}
