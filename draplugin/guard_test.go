package draplugin

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/component-base/metrics/testutil"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/nodeagent/health"
)

// staleCopy creates a claim whose allocation is a copy of another claim's:
// what two schedulers or a stale allocation would produce. The API server
// accepts it; only the plugin can refuse.
func (e *env) staleCopy(name string, of *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: of.Spec}
	created, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	created.Status.Allocation = of.Status.Allocation.DeepCopy()
	updated, err := e.client.ResourceV1().ResourceClaims(e.ns).UpdateStatus(e.ctx, created, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return updated
}

func TestExclusiveDeviceGuard(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	first := e.claim("first", []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
	second := e.staleCopy("second", first)
	if r := k.prepare(t, e.ctx, first)[string(first.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	r := k.prepare(t, e.ctx, second)[string(second.UID)]
	for _, want := range []string{"exclusive-device guard", e.ns + "/second", e.ns + "/first", "gpu-3"} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("guard error %q does not contain %q", r.Error, want)
		}
	}
	if len(e.specFiles()) != 1 {
		t.Errorf("refused claim left a spec: %v", e.specFiles())
	}

	// The same for a MIG placement: an occupied placement names the claim
	// and the device, and nothing is created elsewhere.
	migA := e.claim("mig-a", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 0`}})
	migB := e.staleCopy("mig-b", migA)
	if r := k.prepare(t, e.ctx, migA)[string(migA.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	r = k.prepare(t, e.ctx, migB)[string(migB.UID)]
	dev := migA.Status.Allocation.Devices.Results[0].Device
	for _, want := range []string{"MIG placement", "is occupied", e.ns + "/mig-b", e.ns + "/mig-a", dev} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("MIG guard error %q does not contain %q", r.Error, want)
		}
	}
	if got := e.migInstances(); len(got) != 1 {
		t.Errorf("MIG instances = %v, want only mig-a's", got)
	}

	// After the first claim is gone, the second may have the GPU.
	k.unprepare(t, e.ctx, first)
	if r := k.prepare(t, e.ctx, second)[string(second.UID)]; r.Error != "" {
		t.Errorf("second after first left: %s", r.Error)
	}
}

// TestAdminAccess: a monitoring claim with admin access reaches a device
// that another claim holds without tripping the guard, and its unprepare
// leaves the other claim's devices alone.
func TestAdminAccess(t *testing.T) {
	e := newEnv(t)
	ns, err := e.client.CoreV1().Namespaces().Get(e.ctx, e.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"resource.kubernetes.io/admin-access": "true"}
	if _, err := e.client.CoreV1().Namespaces().Update(e.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.start()
	k := e.kubelet()
	user := e.claim("user", []request{
		{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`},
		{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 1 && device.attributes["gpu.tessera.dev"].profile == "3g.40gb"`},
	})
	if r := k.prepare(t, e.ctx, user)[string(user.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	// The stock allocator charges counters even for admin access, so a
	// monitoring claim can look at a whole GPU, not at a MIG device in use.
	monitor := e.claim("monitor", []request{
		{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`, adminAccess: true},
	})
	if r := k.prepare(t, e.ctx, monitor)[string(monitor.UID)]; r.Error != "" || len(r.Devices) != 1 {
		t.Fatalf("admin prepare: %+v", r)
	}
	k.unprepare(t, e.ctx, monitor)
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("admin unprepare touched the user's MIG instance: %v", got)
	}
	k.unprepare(t, e.ctx, user)
	if got := e.migInstances(); len(got) != 0 {
		t.Fatalf("MIG instances left: %v", got)
	}
}

// TestUnprepareRetries: a failing undo step keeps the claim recorded and
// reports the error; the kubelet's retry finishes the job.
func TestUnprepareRetries(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	c := e.claim("share", []request{{name: "s", class: "shared", memory: "1Gi"}},
		claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`})
	if r := k.prepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	e.tools.FailSMI(t, true)
	if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; !strings.Contains(r.Error, "set time slice") {
		t.Fatalf("unprepare error = %q, want the time-slice reset failure", r.Error)
	}
	e.tools.FailSMI(t, false)
	if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
		t.Fatalf("retry: %s", r.Error)
	}
	if st := e.state(nil); len(st.specs)+len(st.daemons)+len(st.recorded) != 0 {
		t.Fatalf("left: %+v", st)
	}
}

func TestBadConfigFailsCleanly(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	for name, tc := range map[string]struct {
		cfg  claimConfig
		want string
	}{
		"bad-strategy":  {claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Spatial"}}`}, `sharing.strategy: Unsupported value: "Spatial"`},
		"unknown-field": {claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"threads":3}}}`}, `unknown field "sharing.mps.threads"`},
		"wrong-kind":    {claimConfig{requests: []string{"gpu"}, json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"MigDeviceConfig"}`}, "the MigDeviceConfig configures none of the claim's devices"},
		"over-limit":    {claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"8Gi"}}}`}, "sharing.mps.pinnedDeviceMemoryLimit 8Gi exceeds the allocated memory"},
		// Hostile values: a newline then an MPS control command for the
		// daemon's stdin, shell characters for nvidia-smi's argv, a
		// percentage out of range. Refused before any tool runs (no calls
		// below), naming the field as written.
		"hostile-memory":     {claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"pinnedDeviceMemoryLimit":"1Gi\nquit"}}}`}, `sharing.mps.pinnedDeviceMemoryLimit: Invalid value: "1Gi\nquit"`},
		"hostile-interval":   {claimConfig{json: `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long; nvidia-smi -r"}}}`}, `sharing.timeSlicingConfig.interval: Unsupported value: "Long; nvidia-smi -r"`},
		"hostile-percentage": {claimConfig{json: `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":101}}}`}, "sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 101"},
	} {
		req := request{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}
		if name == "over-limit" || name == "hostile-memory" || name == "hostile-percentage" {
			req = request{name: "gpu", class: "shared", memory: "4Gi"}
		}
		c := e.claim(name, []request{req}, tc.cfg)
		r := k.prepare(t, e.ctx, c)[string(c.UID)]
		if !strings.Contains(r.Error, tc.want) || !strings.Contains(r.Error, e.ns+"/"+name) {
			t.Errorf("%s: error %q, want it to name the claim and contain %q", name, r.Error, tc.want)
		}
		e.release(c)
	}
	cp, err := checkpoint.Read(filepath.Join(e.pluginDir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cp != nil && len(cp.Data.Claims) != 0 {
		t.Errorf("failed claims recorded: %v", cp.Data.Claims)
	}
	if len(e.specFiles()) != 0 || len(e.tools.Calls()) != 0 {
		t.Errorf("failed prepares had side effects: specs %v, calls %v", e.specFiles(), e.tools.Calls())
	}
}

func TestTimeSlicingAndClassConfig(t *testing.T) {
	e := newEnv(t)
	// A class config applies first; the claim's own config overrides it.
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: e.classes["gpu"] + "-ts"},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.tessera.dev" && device.attributes["gpu.tessera.dev"].type == "gpu"`}}},
			Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: DriverName, Parameters: rawJSON(`{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Short"}}}`),
			}}}},
		},
	}
	if _, err := e.client.ResourceV1().DeviceClasses().Create(e.ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.ResourceV1().DeviceClasses().Delete(e.ctx, class.Name, metav1.DeleteOptions{}) })
	e.classes["ts"] = class.Name
	e.start()
	k := e.kubelet()
	byClass := e.claim("by-class", []request{{name: "gpu", class: "ts", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
	if r := k.prepare(t, e.ctx, byClass)[string(byClass.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	k.unprepare(t, e.ctx, byClass)
	e.release(byClass)
	byClaim := e.claim("by-claim", []request{{name: "gpu", class: "ts", selector: `device.attributes["gpu.tessera.dev"].index == 3`}},
		claimConfig{json: `{"apiVersion":"gpu.tessera.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`})
	if r := k.prepare(t, e.ctx, byClaim)[string(byClaim.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	k.unprepare(t, e.ctx, byClaim)
	uuid := gpuUUID(e, 3)
	want := []string{
		"nvidia-smi compute-policy -i " + uuid + " --set-timeslice 1",
		"nvidia-smi compute-policy -i " + uuid + " --set-timeslice 0",
		"nvidia-smi compute-policy -i " + uuid + " --set-timeslice 3",
		"nvidia-smi compute-policy -i " + uuid + " --set-timeslice 0",
	}
	if got := e.tools.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// TestParallelClaims prepares and unprepares 64 claims at once over the
// sockets (run with -race): 48 shares of one GPU, 14 MIG devices on two
// GPUs, one whole GPU and one more share. No device is prepared twice and
// nothing is left.
func TestParallelClaims(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	k := e.kubelet()
	var claims []*resourceapi.ResourceClaim
	for i := 0; i < 49; i++ {
		claims = append(claims, e.claim("share-"+itoa(i), []request{{name: "s", class: "shared", memory: "1Gi", compute: "1"}}))
	}
	for i := 0; i < 14; i++ {
		claims = append(claims, e.claim("mig-"+itoa(i), []request{{name: "m", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "1g.10gb"`}}))
	}
	claims = append(claims, e.claim("whole", []request{{name: "g", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}}))
	if len(claims) != 64 {
		t.Fatalf("%d claims", len(claims))
	}
	var wg sync.WaitGroup
	errs := make([]string, len(claims))
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = k.prepare(t, e.ctx, c)[string(c.UID)].Error
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != "" {
			t.Errorf("prepare %s: %s", claims[i].Name, err)
		}
	}
	if got := len(e.migInstances()); got != 14 {
		t.Errorf("%d MIG instances, want 14", got)
	}
	if got := len(e.specFiles()); got != 64 {
		t.Errorf("%d CDI specs, want 64", got)
	}
	if got := len(p.PreparedClaims()); got != 64 {
		t.Errorf("%d prepared claims, want 64", got)
	}
	// Each share claim has its own daemon, in a pod of its own.
	if starts := len(e.tools.CallsMatching("mps-control -d")); starts != 49 {
		t.Errorf("MPS daemons started %d times, want once per share claim (49)", starts)
	}
	if pods := len(e.daemonPods()); pods != 49 {
		t.Errorf("%d daemon pods, want 49", pods)
	}
	for kind, want := range map[string]float64{"shared": 49, "mig": 14, "gpu": 1} {
		if got, err := testutil.GetGaugeMetricValue(p.metrics.preparedDevices.WithLabelValues(kind)); err != nil || got != want {
			t.Errorf("prepared_devices{kind=%s} = %v, %v; want %v", kind, got, err, want)
		}
	}
	ops, err := testutil.GetCounterValuesFromGatherer(p.Registry(), "tessera_draplugin_claim_operations_total", map[string]string{}, "operation")
	if err != nil || ops["prepare"] != 64 {
		t.Errorf("claim_operations_total = %v, %v; want 64 prepares", ops, err)
	}

	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = k.unprepare(t, e.ctx, c)[string(c.UID)].Error
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != "" {
			t.Errorf("unprepare %s: %s", claims[i].Name, err)
		}
	}
	st := e.state(p)
	if len(st.migs)+len(st.specs)+len(st.daemons)+len(st.recorded) != 0 {
		t.Errorf("left after unprepare: %+v", st)
	}
	e.waitNoDaemonPods()
}

// TestHealth feeds a GPU's XID through the node agent's broadcaster to the
// kubelet's health stream.
func TestHealth(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	conn := k.conn
	// A deadline so that a missing report fails the test instead of hanging.
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range first.Devices {
		if d.Health != drahealthv1.HealthStatus_HEALTHY {
			t.Fatalf("initially %s/%s is %v", d.Device.PoolName, d.Device.DeviceName, d.Health)
		}
	}
	uuid := gpuUUID(e, 1)
	e.agent.Health().Publish(health.Event{UUID: uuid, Kind: health.KindXID, XID: 79, Message: "fell off the bus"})
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		states := map[string]drahealthv1.HealthStatus{}
		for _, d := range r.Devices {
			states[d.Device.DeviceName] = d.Health
			if d.Device.PoolName != e.nodeName {
				t.Fatalf("pool %q", d.Device.PoolName)
			}
		}
		if states["gpu-1"] != drahealthv1.HealthStatus_UNHEALTHY {
			continue
		}
		if states["gpu-1-mig-1g-10gb-0"] != drahealthv1.HealthStatus_UNHEALTHY || states["gpu-0"] != drahealthv1.HealthStatus_HEALTHY {
			t.Errorf("states after XID on GPU 1: %v", states)
		}
		break
	}
	// The GPU recovers: its devices are healthy again.
	e.agent.Health().Publish(health.Event{UUID: uuid, Healthy: true})
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		healthy := true
		for _, d := range r.Devices {
			healthy = healthy && d.Health == drahealthv1.HealthStatus_HEALTHY
		}
		if healthy {
			break
		}
	}
}

// TestNoHealthSource: without a health source the plugin does not offer
// the health service to the kubelet.
func TestNoHealthSource(t *testing.T) {
	e := newEnv(t)
	e.start(func(o *Options) { o.Health = nil })
	k := e.kubelet()
	for _, s := range k.info.SupportedVersions {
		if strings.Contains(s, "DRAResourceHealth") {
			t.Errorf("health service %s advertised without a health source", s)
		}
	}
}

func rawJSON(s string) runtime.RawExtension { return runtime.RawExtension{Raw: []byte(s)} }

// TestOccupiedPlacement: a GPU instance that NVML reports over the
// allocated placement (made outside the plugin) fails the prepare with an
// error naming claim and device; no instance is created anywhere else.
func TestOccupiedPlacement(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	c := e.claim("blocked", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 1 && device.attributes["gpu.tessera.dev"].profile == "2g.20gb"`, device: "gpu-1-mig-2g-20gb-0"}})
	e.createStaticMIG(1, "1g.10gb", 1) // overlaps memory slices 0..1
	before := e.migInstances()
	r := k.prepare(t, e.ctx, c)[string(c.UID)]
	dev := c.Status.Allocation.Devices.Results[0].Device
	for _, want := range []string{"MIG placement is occupied", e.ns + "/blocked", dev} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("error %q does not contain %q", r.Error, want)
		}
	}
	if got := e.migInstances(); !reflect.DeepEqual(got, before) {
		t.Errorf("MIG instances changed: %v, want %v", got, before)
	}
	if len(e.specFiles()) != 0 {
		t.Errorf("specs left: %v", e.specFiles())
	}
}
