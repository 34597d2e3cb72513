package deviceplugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	sigsyaml "sigs.k8s.io/yaml"
)

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ResourceName != "tessera.dev/gpu" || cfg.MIGStrategy != MIGStrategyNone || cfg.TimeSlicing != nil ||
		cfg.PluginDir != "/var/lib/kubelet/device-plugins/" || cfg.KubeletSocket != "kubelet.sock" ||
		len(cfg.DeviceListStrategy) != 1 || cfg.DeviceListStrategy[0] != DeviceListEnvVar || cfg.CDIKind != "nvidia.com/gpu" {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = ParseConfig([]byte(`
resourceName: nvidia.com/gpu
migStrategy: mixed
timeSlicing:
  replicas: 4
  renameByDefault: true
  failRequestsGreaterThanOne: true
deviceListStrategy: [cdi-cri, envvar]
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ResourceName != "nvidia.com/gpu" || cfg.MIGStrategy != MIGStrategyMixed || cfg.TimeSlicing.Replicas != 4 ||
		!cfg.TimeSlicing.RenameByDefault || !cfg.TimeSlicing.FailRequestsGreaterThanOne || cfg.TimeSlicing.Policy != ReplicaPolicySpread {
		t.Errorf("parsed: %+v %+v", cfg, cfg.TimeSlicing)
	}
}

// TestBadConfigRejected: each bad config fails at start (ParseConfig and
// New) with an error naming the field.
func TestBadConfigRejected(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, field string
	}{
		{"replicas 0", "timeSlicing: {replicas: 0}", "timeSlicing.replicas"},
		{"replicas missing", "timeSlicing: {renameByDefault: true}", "timeSlicing.replicas"},
		{"negative replicas", "timeSlicing: {replicas: -2}", "timeSlicing.replicas"},
		{"unknown MIG strategy", "migStrategy: auto", "migStrategy"},
		{"bad character in resource name", "resourceName: tessera.dev/gpu!", "resourceName"},
		{"space in resource name", "resourceName: tessera.dev/my gpu", "resourceName"},
		{"resource name without domain", "resourceName: gpu", "resourceName"},
		{"kubernetes.io resource", "resourceName: kubernetes.io/gpu", "resourceName"},
		{"shared name too long", "resourceName: tessera.dev/" + strings.Repeat("g", 60) + "\ntimeSlicing: {replicas: 2, renameByDefault: true}", "resourceName"},
		{"unknown replica policy", "timeSlicing: {replicas: 2, policy: random}", "timeSlicing.policy"},
		{"unknown device list strategy", "deviceListStrategy: [volume-mounts]", "deviceListStrategy[0]"},
		{"duplicate device list strategy", "deviceListStrategy: [envvar, envvar]", "deviceListStrategy[1]"},
		{"bad CDI kind", "cdiKind: nvidia.com", "cdiKind"},
		{"relative plugin dir", "pluginDir: var/lib/kubelet", "pluginDir"},
		{"kubelet socket with a path", "kubeletSocket: /run/kubelet.sock", "kubeletSocket"},
		{"unknown field", "replicas: 4", `unknown field "replicas"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("ParseConfig: %v, want an error naming %s", err, tc.field)
			}
			if strings.HasPrefix(tc.field, "unknown field") {
				return
			}
			// The same config given to New in code.
			var cfg Config
			if err := yamlInto(tc.yaml, &cfg); err != nil {
				t.Fatal(err)
			}
			if _, err := New(Options{Config: cfg}); err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("New: %v, want an error naming %s", err, tc.field)
			}
		})
	}
}

func TestHardwareMismatchRejected(t *testing.T) {
	t.Run("single with MIG on some GPUs", func(t *testing.T) {
		m := newMock(t, 2)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
		_, gpus := discover(t, m)
		_, err := New(Options{Config: Config{MIGStrategy: MIGStrategySingle}, GPUs: gpus})
		if !errors.Is(err, ErrHardwareMismatch) || !strings.Contains(err.Error(), "migStrategy") || !strings.Contains(err.Error(), gpus[1].UUID) {
			t.Fatalf("New: %v, want a hardware mismatch naming migStrategy and GPU 1", err)
		}
	})
	t.Run("single with two profiles", func(t *testing.T) {
		m := newMock(t, 1)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
		_, gpus := discover(t, m)
		_, err := New(Options{Config: Config{MIGStrategy: MIGStrategySingle}, GPUs: gpus})
		if !errors.Is(err, ErrHardwareMismatch) || !strings.Contains(err.Error(), "1g.10gb, 3g.40gb") {
			t.Fatalf("New: %v, want a hardware mismatch naming both profiles", err)
		}
	})
	t.Run("GPU listed twice", func(t *testing.T) {
		m := newMock(t, 1)
		_, gpus := discover(t, m)
		_, err := New(Options{GPUs: append(gpus, gpus[0])})
		if err == nil || !strings.Contains(err.Error(), "GPUs[1]") {
			t.Fatalf("New: %v, want an error naming GPUs[1]", err)
		}
	})
}

func yamlInto(s string, cfg *Config) error {
	return sigsyaml.Unmarshal([]byte(s), cfg)
}
