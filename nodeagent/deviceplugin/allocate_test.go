package deviceplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func allocate(t *testing.T, c pluginapi.DevicePluginClient, containers ...[]string) (*pluginapi.AllocateResponse, error) {
	t.Helper()
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	return c.Allocate(t.Context(), req)
}

func devicePaths(specs []*pluginapi.DeviceSpec) []string {
	var out []string
	for _, s := range specs {
		if s.HostPath != s.ContainerPath || s.Permissions != "rw" {
			return []string{"bad spec " + s.String()}
		}
		out = append(out, s.HostPath)
	}
	return out
}

func TestAllocateEnvVar(t *testing.T) {
	m := newMock(t, 4)
	c, uuids, _ := preferredClient(t, m, Config{})
	resp, err := allocate(t, c, []string{uuids[3], uuids[1]}, []string{uuids[0]})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 {
		t.Fatalf("%d container responses, want 2", len(resp.ContainerResponses))
	}
	first, second := resp.ContainerResponses[0], resp.ContainerResponses[1]
	if got, want := first.Envs["NVIDIA_VISIBLE_DEVICES"], uuids[3]+","+uuids[1]; got != want {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want %q", got, want)
	}
	if got, want := devicePaths(first.Devices), []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia3", "/dev/nvidia1"}; !slices.Equal(got, want) {
		t.Errorf("device specs %v, want %v", got, want)
	}
	if got := second.Envs["NVIDIA_VISIBLE_DEVICES"]; got != uuids[0] {
		t.Errorf("second container NVIDIA_VISIBLE_DEVICES %q, want %q", got, uuids[0])
	}
	if len(first.Annotations) != 0 || len(first.CdiDevices) != 0 {
		t.Errorf("envvar strategy produced CDI output: %v %v", first.Annotations, first.CdiDevices)
	}

	_, err = allocate(t, c, []string{uuids[0], "GPU-unknown"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"GPU-unknown"`) {
		t.Errorf("unknown device: %v, want InvalidArgument naming it", err)
	}
}

func TestAllocateCDI(t *testing.T) {
	m := newMock(t, 2)
	c, uuids, _ := preferredClient(t, m, Config{
		DeviceListStrategy: []DeviceListStrategy{DeviceListCDIAnnotations, DeviceListCDICRI},
		CDIKind:            "k8s.gpu.tessera.dev/gpu",
	})
	resp, err := allocate(t, c, []string{uuids[1], uuids[0]})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.ContainerResponses[0]
	want := []string{"k8s.gpu.tessera.dev/gpu=" + uuids[1], "k8s.gpu.tessera.dev/gpu=" + uuids[0]}
	var cri []string
	for _, d := range r.CdiDevices {
		cri = append(cri, d.Name)
	}
	if !slices.Equal(cri, want) {
		t.Errorf("CDI devices %v, want %v", cri, want)
	}
	keys, annotated, err := cdi.ParseAnnotations(r.Annotations)
	if err != nil || len(keys) != 1 || !strings.HasPrefix(keys[0], "cdi.k8s.io/tessera-device-plugin_") {
		t.Fatalf("CDI annotations %v: keys %v, err %v", r.Annotations, keys, err)
	}
	if !slices.Equal(annotated, want) {
		t.Errorf("annotated CDI devices %v, want %v", annotated, want)
	}
	if len(r.Envs) != 0 || len(r.Devices) != 0 {
		t.Errorf("CDI-only strategy produced env/device specs: %v %v", r.Envs, r.Devices)
	}
}

func TestAllocateReplicasAndMIG(t *testing.T) {
	t.Run("replicas of one GPU collapse", func(t *testing.T) {
		m := newMock(t, 2)
		c, uuids, _ := preferredClient(t, m, Config{TimeSlicing: &TimeSlicing{Replicas: 4}})
		resp, err := allocate(t, c, []string{uuids[1] + "::2", uuids[1] + "::0", uuids[0] + "::3"})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.ContainerResponses[0]
		if got, want := r.Envs["NVIDIA_VISIBLE_DEVICES"], uuids[1]+","+uuids[0]; got != want {
			t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want %q", got, want)
		}
		if got, want := devicePaths(r.Devices), []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidia0"}; !slices.Equal(got, want) {
			t.Errorf("device specs %v, want %v", got, want)
		}
	})
	t.Run("more than one replica refused", func(t *testing.T) {
		m := newMock(t, 2)
		c, uuids, p := preferredClient(t, m, Config{TimeSlicing: &TimeSlicing{Replicas: 4, FailRequestsGreaterThanOne: true}})
		if _, err := allocate(t, c, []string{uuids[0] + "::1"}); err != nil {
			t.Fatalf("one replica: %v", err)
		}
		_, err := allocate(t, c, []string{uuids[0] + "::1", uuids[1] + "::1"})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "timeSlicing.failRequestsGreaterThanOne") {
			t.Errorf("two replicas: %v, want InvalidArgument naming timeSlicing.failRequestsGreaterThanOne", err)
		}
		waitMetrics(t, p, `
# HELP tessera_deviceplugin_allocation_errors_total [ALPHA] Allocate calls refused (unknown device, too many replicas), by resource.
# TYPE tessera_deviceplugin_allocation_errors_total counter
tessera_deviceplugin_allocation_errors_total{resource="tessera.dev/gpu"} 1
# HELP tessera_deviceplugin_container_allocations_total [ALPHA] Containers given devices by Allocate, by resource.
# TYPE tessera_deviceplugin_container_allocations_total counter
tessera_deviceplugin_container_allocations_total{resource="tessera.dev/gpu"} 1
`, "tessera_deviceplugin_allocation_errors_total", "tessera_deviceplugin_container_allocations_total")
	})
	t.Run("MIG device", func(t *testing.T) {
		m := newMock(t, 2)
		createMIG(t, m, 1, nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0)
		node, gpus := discover(t, m)
		dir := shortTempDir(t)
		k := startFakeKubelet(t, dir)
		mig := node.GPUs[1].MigInstances[0]
		minors := filepath.Join(dir, "mig-minors")
		table := fmt.Sprintf("config 1\nmonitor 2\ngpu1/gi%d/access 140\ngpu1/gi%d/ci%d/access 141\n", mig.GIID, mig.GIID, mig.CIID)
		if err := os.WriteFile(minors, []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
		runPlugin(t, newPlugin(t, Options{Config: Config{PluginDir: dir, MIGStrategy: MIGStrategyMixed}, GPUs: gpus, NVML: m, MIGMinorsFile: minors}))
		regs := k.registrationsByResource(2)
		resp, err := allocate(t, k.dial(regs["tessera.dev/mig-7g.80gb"].Endpoint), []string{mig.UUID})
		if err != nil {
			t.Fatal(err)
		}
		r := resp.ContainerResponses[0]
		if got := r.Envs["NVIDIA_VISIBLE_DEVICES"]; got != mig.UUID {
			t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want the MIG UUID %q", got, mig.UUID)
		}
		want := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap140", "/dev/nvidia-caps/nvidia-cap141"}
		if got := devicePaths(r.Devices); !slices.Equal(got, want) {
			t.Errorf("device specs %v, want %v", got, want)
		}
	})
}
