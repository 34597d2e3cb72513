package deviceplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

func newMock(t testing.TB, gpus int) *nvmlbackend.Mock {
	t.Helper()
	m, err := nvmlbackend.NewMock("dgxh100", gpus)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// createMIG makes a MIG device (GPU instance + full compute instance) of
// the GPU instance profile at the placement start, enabling MIG mode first.
func createMIG(t testing.TB, lib nvml.Interface, gpu, giProfile, start int) {
	t.Helper()
	dev, ret := lib.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(giProfile)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	// The placement NVML lists at start (its size is in memory slices, not
	// the profile's compute slices: 3g spans 4 of 8).
	pls, _ := dev.GetGpuInstancePossiblePlacements(&info)
	pl := nvml.GpuInstancePlacement{Start: uint32(start)}
	for _, p := range pls {
		if p.Start == uint32(start) {
			pl = p
		}
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &pl)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU %d: GPU instance of profile %d at %d: %v", gpu, giProfile, start, ret)
	}
	ciProfile := map[uint32]int{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, 3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE}[info.SliceCount]
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}

// discover runs the node agent's discovery on lib and converts the result.
func discover(t *testing.T, lib nvml.Interface) (*discovery.Node, []GPU) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return discoverTB(t, ctx, lib)
}

func discoverTB(t testing.TB, ctx context.Context, lib nvml.Interface) (*discovery.Node, []GPU) {
	t.Helper()
	node, err := discovery.Discover(ctx, lib)
	if err != nil {
		t.Fatal(err)
	}
	return node, FromDiscovery(ctx, node.GPUs)
}

func newPlugin(t *testing.T, opts Options) *Plugin {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func deviceIDs(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.ID)
	}
	return out
}

func allHealthy(t *testing.T, devs []*pluginapi.Device) {
	t.Helper()
	for _, d := range devs {
		if d.Health != pluginapi.Healthy {
			t.Errorf("device %s is %s, want Healthy", d.ID, d.Health)
		}
	}
}

func TestRegisterAndListWholeGPUs(t *testing.T) {
	m := newMock(t, 8)
	node, gpus := discover(t, m)
	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	p := newPlugin(t, Options{Config: Config{PluginDir: dir}, GPUs: gpus, NVML: m})
	runPlugin(t, p)

	reg := k.nextRegistration()
	if reg.ResourceName != "tessera.dev/gpu" || reg.Endpoint != "tessera-tessera.dev_gpu.sock" || reg.Version != "v1beta1" {
		t.Fatalf("registration %+v", reg)
	}
	if !reg.Options.GetGetPreferredAllocationAvailable() || reg.Options.GetPreStartRequired() {
		t.Errorf("registration options %+v, want preferred allocation and no pre-start", reg.Options)
	}
	ctx := t.Context()
	opts, err := k.dial(reg.Endpoint).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions: %+v, %v", opts, err)
	}
	if _, err := k.dial(reg.Endpoint).PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{node.GPUs[0].UUID}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}

	devs := nextList(t, k.watch(ctx, reg.Endpoint))
	var want []string
	for _, g := range node.GPUs {
		want = append(want, g.UUID)
	}
	if got := deviceIDs(devs); !slices.Equal(got, want) {
		t.Fatalf("devices %v, want the 8 GPU UUIDs in index order %v", got, want)
	}
	allHealthy(t, devs)
}

// TestListAndWatchResources covers the MIG strategies and time-slicing: each
// case registers the expected resources and lists exactly their devices.
func TestListAndWatchResources(t *testing.T) {
	// A 4-GPU H100 box: GPU 0 has two 3g.40gb devices, GPU 1 two 1g.10gb and
	// a 2g.20gb device, GPUs 2 and 3 are whole.
	mixedBox := func(t *testing.T) (*nvmlbackend.Mock, map[string][]string) {
		m := newMock(t, 4)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
		createMIG(t, m, 1, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1)
		createMIG(t, m, 1, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
		createMIG(t, m, 1, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2)
		node, _ := discover(t, m)
		byProfile := map[string][]string{}
		for _, g := range node.GPUs {
			if !g.MigEnabled {
				byProfile["whole"] = append(byProfile["whole"], g.UUID)
			}
			for _, mi := range g.MigInstances { // sorted by placement start
				byProfile[mi.Profile] = append(byProfile[mi.Profile], mi.UUID)
			}
		}
		return m, byProfile
	}
	replicas := func(ids []string, n int) []string {
		var out []string
		for _, id := range ids {
			for i := 0; i < n; i++ {
				out = append(out, fmt.Sprintf("%s::%d", id, i))
			}
		}
		return out
	}

	t.Run("mixed", func(t *testing.T) {
		m, ids := mixedBox(t)
		if len(ids["1g.10gb"]) != 2 || len(ids["2g.20gb"]) != 1 || len(ids["3g.40gb"]) != 2 || len(ids["whole"]) != 2 {
			t.Fatalf("mock set-up: %v", ids)
		}
		want := map[string][]string{
			"tessera.dev/gpu":         ids["whole"],
			"tessera.dev/mig-1g.10gb": ids["1g.10gb"],
			"tessera.dev/mig-2g.20gb": ids["2g.20gb"],
			"tessera.dev/mig-3g.40gb": ids["3g.40gb"],
		}
		checkResources(t, m, Config{MIGStrategy: MIGStrategyMixed}, want)
	})
	t.Run("mixed with renamed replicas", func(t *testing.T) {
		m, ids := mixedBox(t)
		want := map[string][]string{
			"tessera.dev/gpu.shared":         replicas(ids["whole"], 2),
			"tessera.dev/mig-1g.10gb.shared": replicas(ids["1g.10gb"], 2),
			"tessera.dev/mig-2g.20gb.shared": replicas(ids["2g.20gb"], 2),
			"tessera.dev/mig-3g.40gb.shared": replicas(ids["3g.40gb"], 2),
		}
		checkResources(t, m, Config{MIGStrategy: MIGStrategyMixed, TimeSlicing: &TimeSlicing{Replicas: 2, RenameByDefault: true}}, want)
	})
	t.Run("none ignores MIG", func(t *testing.T) {
		m, _ := mixedBox(t)
		node, _ := discover(t, m)
		var all []string
		for _, g := range node.GPUs {
			all = append(all, g.UUID)
		}
		checkResources(t, m, Config{MIGStrategy: MIGStrategyNone}, map[string][]string{"tessera.dev/gpu": all})
	})
	t.Run("replicas under nvidia.com/gpu", func(t *testing.T) {
		m := newMock(t, 2)
		node, _ := discover(t, m)
		want := replicas([]string{node.GPUs[0].UUID, node.GPUs[1].UUID}, 3)
		checkResources(t, m, Config{ResourceName: "nvidia.com/gpu", TimeSlicing: &TimeSlicing{Replicas: 3}}, map[string][]string{"nvidia.com/gpu": want})
	})
	t.Run("single", func(t *testing.T) {
		m := newMock(t, 2)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 3)
		createMIG(t, m, 1, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
		createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0)
		node, _ := discover(t, m)
		want := []string{node.GPUs[0].MigInstances[0].UUID, node.GPUs[0].MigInstances[1].UUID, node.GPUs[1].MigInstances[0].UUID}
		checkResources(t, m, Config{MIGStrategy: MIGStrategySingle}, map[string][]string{"tessera.dev/gpu": want})
	})
}

// checkResources runs a plugin on the mock's GPUs and checks that it
// registers exactly the wanted resources, each listing exactly the wanted
// device IDs in order, all healthy.
func checkResources(t *testing.T, m *nvmlbackend.Mock, cfg Config, want map[string][]string) {
	t.Helper()
	_, gpus := discover(t, m)
	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	cfg.PluginDir = dir
	p := newPlugin(t, Options{Config: cfg, GPUs: gpus, NVML: m})
	runPlugin(t, p)
	regs := k.registrationsByResource(len(want))
	for name, ids := range want {
		reg, ok := regs[name]
		if !ok {
			t.Errorf("resource %s not registered (got %v)", name, sortedKeys(regs))
			continue
		}
		devs := nextList(t, k.watch(t.Context(), reg.Endpoint))
		if got := deviceIDs(devs); !slices.Equal(got, ids) {
			t.Errorf("%s: devices %v, want %v", name, got, ids)
		}
		allHealthy(t, devs)
	}
	if got := p.ResourceNames(); len(got) != len(want) {
		t.Errorf("serving %v, want %v", got, sortedKeys(want))
	}
}

// TestHealthFlipsAndRecovers: health events from the node agent's
// broadcaster mark a GPU Unhealthy in ListAndWatch (and, for a MIG GPU, its
// MIG devices), and clearing them marks the devices Healthy again.
func TestHealthFlipsAndRecovers(t *testing.T) {
	m := newMock(t, 3)
	createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0)
	createMIG(t, m, 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	node, gpus := discover(t, m)
	gpu0, gpu1, gpu2 := node.GPUs[0].UUID, node.GPUs[1].UUID, node.GPUs[2].UUID
	mig0, mig1 := node.GPUs[0].MigInstances[0].UUID, node.GPUs[0].MigInstances[1].UUID

	b := health.NewBroadcaster()
	// A condition that holds before the plugin starts is replayed to it.
	b.Inject(health.Event{UUID: gpu1, Kind: health.KindECC})

	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	p := newPlugin(t, Options{Config: Config{PluginDir: dir, MIGStrategy: MIGStrategyMixed}, GPUs: gpus, NVML: m, Health: b})
	runPlugin(t, p)
	regs := k.registrationsByResource(2)
	whole := k.watch(t.Context(), regs["tessera.dev/gpu"].Endpoint)
	migs := k.watch(t.Context(), regs["tessera.dev/mig-3g.40gb"].Endpoint)

	waitHealth(t, whole, map[string]string{gpu1: "Unhealthy", gpu2: "Healthy"})
	waitHealth(t, migs, map[string]string{mig0: "Healthy", mig1: "Healthy"})

	b.Inject(health.Event{UUID: gpu2, Kind: health.KindXID, XID: 48})
	waitHealth(t, whole, map[string]string{gpu1: "Unhealthy", gpu2: "Unhealthy"})
	waitMetrics(t, p, `
# HELP tessera_deviceplugin_devices [ALPHA] Devices advertised to the kubelet, by resource and health (Healthy, Unhealthy).
# TYPE tessera_deviceplugin_devices gauge
tessera_deviceplugin_devices{health="Healthy",resource="tessera.dev/gpu"} 0
tessera_deviceplugin_devices{health="Healthy",resource="tessera.dev/mig-3g.40gb"} 2
tessera_deviceplugin_devices{health="Unhealthy",resource="tessera.dev/gpu"} 2
tessera_deviceplugin_devices{health="Unhealthy",resource="tessera.dev/mig-3g.40gb"} 0
`, "tessera_deviceplugin_devices")
	// A second condition, then clearing the first: still unhealthy.
	b.Inject(health.Event{UUID: gpu2, Kind: health.KindLost})
	b.Inject(health.Event{UUID: gpu2, Kind: health.KindXID, Healthy: true})
	b.Inject(health.Event{UUID: gpu1, Kind: health.KindECC, Healthy: true})
	waitHealth(t, whole, map[string]string{gpu1: "Healthy", gpu2: "Unhealthy"})
	b.Inject(health.Event{UUID: gpu2, Kind: health.KindLost, Healthy: true})
	waitHealth(t, whole, map[string]string{gpu1: "Healthy", gpu2: "Healthy"})

	// The parent GPU failing takes both MIG devices down; an event naming
	// one MIG device takes only that one.
	b.Inject(health.Event{UUID: mig1, Kind: health.KindXID, XID: 94})
	waitHealth(t, migs, map[string]string{mig0: "Healthy", mig1: "Unhealthy"})
	b.Inject(health.Event{UUID: gpu0, Kind: health.KindLost})
	waitHealth(t, migs, map[string]string{mig0: "Unhealthy", mig1: "Unhealthy"})
	// A healthy event without kind clears every condition of the GPU.
	b.Inject(health.Event{UUID: gpu0, Healthy: true})
	waitHealth(t, migs, map[string]string{mig0: "Healthy", mig1: "Unhealthy"})
	b.Inject(health.Event{UUID: mig1, Healthy: true})
	waitHealth(t, migs, map[string]string{mig0: "Healthy", mig1: "Healthy"})
}

// TestHealthFromNVMLEvents runs the whole health path: an XID event from
// the (mock) driver and a GPU that stops answering reach ListAndWatch
// through the node agent's health monitor, and both recover.
func TestHealthFromNVMLEvents(t *testing.T) {
	m := newMock(t, 2)
	node, gpus := discover(t, m)
	gpu0, gpu1 := node.GPUs[0].UUID, node.GPUs[1].UUID
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	b := health.NewBroadcaster()
	mon := health.NewMonitor(m, b, health.MonitorOptions{
		GPUs:          []string{gpu0, gpu1},
		ProbeInterval: 10 * time.Millisecond,
		WaitTimeout:   10 * time.Millisecond,
		XIDRecovery:   300 * time.Millisecond,
	})
	monDone := make(chan error, 1)
	go func() { monDone <- mon.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-monDone; err != nil {
			t.Errorf("health monitor: %v", err)
		}
	})

	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	runPlugin(t, newPlugin(t, Options{Config: Config{PluginDir: dir}, GPUs: gpus, NVML: m, Health: b}))
	lists := k.watch(t.Context(), k.nextRegistration().Endpoint)
	waitHealth(t, lists, map[string]string{gpu0: "Healthy", gpu1: "Healthy"})

	// The monitor registers for events asynchronously: retry until the
	// injection finds its event set.
	deadline := time.Now().Add(waitTimeout)
	for err := m.InjectXID(gpu1, 48); err != nil; err = m.InjectXID(gpu1, 48) {
		if time.Now().After(deadline) {
			t.Fatalf("inject XID: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitHealth(t, lists, map[string]string{gpu0: "Healthy", gpu1: "Unhealthy"})
	waitHealth(t, lists, map[string]string{gpu0: "Healthy", gpu1: "Healthy"})

	if err := m.SetLost(gpu0, true); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, lists, map[string]string{gpu0: "Unhealthy", gpu1: "Healthy"})
	if err := m.SetLost(gpu0, false); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, lists, map[string]string{gpu0: "Healthy", gpu1: "Healthy"})
}

// TestKubeletRestart: the kubelet restarts (its socket and the plugin
// sockets vanish, kubelet.sock is created anew); the plugin serves again and
// registers again, and the new kubelet can list its devices.
func TestKubeletRestart(t *testing.T) {
	m := newMock(t, 2)
	node, gpus := discover(t, m)
	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	p := newPlugin(t, Options{Config: Config{PluginDir: dir, ResourceName: "nvidia.com/gpu"}, GPUs: gpus})
	runPlugin(t, p)
	first := k.nextRegistration()
	oldStream := k.watch(t.Context(), first.Endpoint)
	nextList(t, oldStream)
	// The fake kubelet records a registration before its answer reaches
	// the plugin; restarting it in between would make the plugin see a
	// failed call (and retry). Wait until the plugin has counted it.
	registered := func(n int) {
		t.Helper()
		waitMetrics(t, p, fmt.Sprintf(`
# HELP tessera_deviceplugin_registrations_total [ALPHA] Successful registrations with the kubelet, by resource; more than one means the kubelet restarted.
# TYPE tessera_deviceplugin_registrations_total counter
tessera_deviceplugin_registrations_total{resource="nvidia.com/gpu"} %d
`, n), "tessera_deviceplugin_registrations_total")
	}
	registered(1)

	for i := 0; i < 2; i++ {
		k.restart()
		again := k.nextRegistration()
		if again.ResourceName != "nvidia.com/gpu" || again.Endpoint != first.Endpoint {
			t.Fatalf("re-registration %+v, want the same resource and endpoint as %+v", again, first)
		}
		if _, err := os.Stat(filepath.Join(dir, again.Endpoint)); err != nil {
			t.Fatalf("plugin socket after kubelet restart: %v", err)
		}
		devs := nextList(t, k.watch(t.Context(), again.Endpoint))
		if got, want := deviceIDs(devs), []string{node.GPUs[0].UUID, node.GPUs[1].UUID}; !slices.Equal(got, want) {
			t.Fatalf("after restart %d: devices %v, want %v", i+1, got, want)
		}
		registered(i + 2)
	}
	// The stream of the old kubelet ended with the old server.
	for range oldStream {
	}
}

// TestRestartWithoutWatchEvents: when the file watch misses a kubelet
// restart, the periodic check sees the replaced kubelet socket, or the
// plugin's own socket gone, and the plugin serves and registers again.
func TestRestartWithoutWatchEvents(t *testing.T) {
	m := newMock(t, 1)
	_, gpus := discover(t, m)
	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	p := newPlugin(t, Options{Config: Config{PluginDir: dir}, GPUs: gpus})
	p.noWatch = true
	p.recheckInterval = 20 * time.Millisecond
	runPlugin(t, p)
	reg := k.nextRegistration()
	registered := func(n int) {
		t.Helper()
		waitMetrics(t, p, fmt.Sprintf(`
# HELP tessera_deviceplugin_registrations_total [ALPHA] Successful registrations with the kubelet, by resource; more than one means the kubelet restarted.
# TYPE tessera_deviceplugin_registrations_total counter
tessera_deviceplugin_registrations_total{resource="tessera.dev/gpu"} %d
`, n), "tessera_deviceplugin_registrations_total")
	}
	registered(1)

	k.restart()
	k.nextRegistration()
	nextList(t, k.watch(t.Context(), reg.Endpoint))
	registered(2)

	// Only the plugin's socket removed, the kubelet unchanged.
	if err := os.Remove(filepath.Join(dir, reg.Endpoint)); err != nil {
		t.Fatal(err)
	}
	k.nextRegistration()
	nextList(t, k.watch(t.Context(), reg.Endpoint))
	registered(3)
}

// TestRegistersWhenKubeletAppears: a plugin started before the kubelet
// registers once kubelet.sock exists.
func TestRegistersWhenKubeletAppears(t *testing.T) {
	m := newMock(t, 1)
	_, gpus := discover(t, m)
	dir := shortTempDir(t)
	p := newPlugin(t, Options{Config: Config{PluginDir: dir}, GPUs: gpus})
	runPlugin(t, p)
	k := startFakeKubelet(t, dir)
	if reg := k.nextRegistration(); reg.ResourceName != DefaultResourceName {
		t.Fatalf("registration %+v", reg)
	}
}

func TestRunFailsWithoutPluginDir(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := filepath.Join(shortTempDir(t), "missing")
	p := newPlugin(t, Options{Config: Config{PluginDir: dir}})
	err := p.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "pluginDir") {
		t.Fatalf("Run with a missing plugin dir: %v, want an error naming pluginDir", err)
	}
	if err := p.Run(ctx); err == nil {
		t.Fatal("second Run: want an error")
	}
}

// TestNUMATopology: a GPU's NUMA node from sysfs reaches the kubelet as
// TopologyInfo (for the topology manager); -1 or no entry means none.
func TestNUMATopology(t *testing.T) {
	m := newMock(t, 3)
	node, _ := discover(t, m)
	sysfs := t.TempDir()
	old := sysfsPCIDevices
	sysfsPCIDevices = sysfs
	t.Cleanup(func() { sysfsPCIDevices = old })
	for i, numa := range []string{"1\n", "-1\n"} { // GPU 2 has no entry
		// NVML's 8-digit PCI domain becomes sysfs's 4 digits, lower case.
		id := strings.ToLower(node.GPUs[i].PCIBusID)
		if d, rest, _ := strings.Cut(id, ":"); len(d) == 8 {
			id = d[4:] + ":" + rest
		}
		if err := os.MkdirAll(filepath.Join(sysfs, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sysfs, id, "numa_node"), []byte(numa), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, ctx := ktesting.NewTestContext(t)
	gpus := FromDiscovery(ctx, node.GPUs)
	if node.GPUs[0].PCIBusID == "" || gpus[0].NUMANode == nil || *gpus[0].NUMANode != 1 || gpus[1].NUMANode != nil || gpus[2].NUMANode != nil {
		t.Fatalf("NUMA nodes from sysfs for bus IDs %q: %v %v %v", node.GPUs[0].PCIBusID, gpus[0].NUMANode, gpus[1].NUMANode, gpus[2].NUMANode)
	}
	dir := shortTempDir(t)
	k := startFakeKubelet(t, dir)
	runPlugin(t, newPlugin(t, Options{Config: Config{PluginDir: dir}, GPUs: gpus}))
	devs := nextList(t, k.watch(t.Context(), k.nextRegistration().Endpoint))
	if got := devs[0].GetTopology().GetNodes(); len(got) != 1 || got[0].ID != 1 {
		t.Errorf("GPU 0 topology %v, want NUMA node 1", devs[0].Topology)
	}
	if devs[1].Topology != nil || devs[2].Topology != nil {
		t.Errorf("GPUs 1 and 2 report topology %v %v, want none", devs[1].Topology, devs[2].Topology)
	}
}
