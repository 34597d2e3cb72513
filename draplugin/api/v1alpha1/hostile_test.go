package v1alpha1

import (
	"strings"
	"testing"
)

// TestHostileValuesNameTheirField: values built to break out of a tool's
// stdin (a newline then an MPS control command), argv (shell characters)
// or range are refused at decode, before anything runs, with an error that
// names the field as the author wrote it — tessera's or NVIDIA's.
func TestHostileValuesNameTheirField(t *testing.T) {
	const (
		tessera = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":`
		mig     = `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig","sharing":`
		nvidia  = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":`
	)
	for _, tc := range []struct{ name, in, field string }{
		{"memory limit with a newline and quit", tessera + `{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"10Gi\nquit"}}}`, "sharing.mps.pinnedDeviceMemoryLimit"},
		{"memory limit with a second command", mig + `{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"1Gi\nset_default_active_thread_percentage 100"}}}`, "sharing.mps.pinnedDeviceMemoryLimit"},
		{"memory limit with shell characters", tessera + `{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"$(reboot)"}}}`, "sharing.mps.pinnedDeviceMemoryLimit"},
		{"memory limit not a string", tessera + `{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":{"a":1}}}}`, "sharing.mps.pinnedDeviceMemoryLimit"},
		{"negative memory limit", tessera + `{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"-1Gi"}}}`, "sharing.mps.pinnedDeviceMemoryLimit"},
		{"thread percentage with a newline", tessera + `{"strategy":"MPS","mps":{"activeThreadPercentage":"40\nquit"}}}`, "sharing.mps.activeThreadPercentage"},
		{"thread percentage 0", tessera + `{"strategy":"MPS","mps":{"activeThreadPercentage":0}}}`, "sharing.mps.activeThreadPercentage"},
		{"thread percentage 101", mig + `{"strategy":"MPS","mps":{"activeThreadPercentage":101}}}`, "sharing.mps.activeThreadPercentage"},
		{"thread percentage negative", tessera + `{"strategy":"MPS","mps":{"activeThreadPercentage":-5}}}`, "sharing.mps.activeThreadPercentage"},
		{"thread percentage beyond int32", tessera + `{"strategy":"MPS","mps":{"activeThreadPercentage":4294967336}}}`, "sharing.mps.activeThreadPercentage"},
		{"thread percentage fraction", tessera + `{"strategy":"MPS","mps":{"activeThreadPercentage":40.5}}}`, "sharing.mps.activeThreadPercentage"},
		{"interval with shell characters", tessera + `{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long; nvidia-smi -r"}}}`, "sharing.timeSlicing.interval"},
		{"interval as a number", tessera + `{"strategy":"TimeSlicing","timeSlicing":{"interval":"3"}}}`, "sharing.timeSlicing.interval"},
		{"interval with a newline", tessera + `{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long\n"}}}`, "sharing.timeSlicing.interval"},
		{"sm partition with a newline", mig + `{"strategy":"MPS","mps":{"smPartition":"Required\nquit"}}}`, "sharing.mps.smPartition"},
		{"NVIDIA memory limit with a newline", nvidia + `{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"10Gi\nquit"}}}`, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"},
		{"NVIDIA per-device limit with a newline", nvidia + `{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"0":"1Gi\nquit"}}}}`, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]"},
		{"NVIDIA memory limit too small", nvidia + `{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"1Ki"}}}`, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"},
		{"NVIDIA thread percentage 150", nvidia + `{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":150}}}`, "sharing.mpsConfig.defaultActiveThreadPercentage"},
		{"NVIDIA thread percentage as a string", nvidia + `{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":"50; quit"}}}`, "sharing.mpsConfig.defaultActiveThreadPercentage"},
		{"NVIDIA interval with shell characters", nvidia + `{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"$(reboot)"}}}`, "sharing.timeSlicingConfig.interval"},
		{"NVIDIA MPS block with time slicing", nvidia + `{"strategy":"TimeSlicing","mpsConfig":{}}}`, "sharing.mpsConfig"},
		{"strategy with a newline", tessera + `{"strategy":"MPS\n"}}`, "sharing.strategy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Decode([]byte(tc.in))
			if err == nil {
				t.Fatalf("accepted: %+v", c)
			}
			if c != nil {
				t.Errorf("a config came back with the error: %+v", c)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name the field %s", err, tc.field)
			}
		})
	}
}
