package agent_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/test/framework"

	"github.com/tessera-gpu/tessera/contract"
)

// mixedConfig offers GPU 0 shared, GPU 1 whole and every other GPU as
// dynamic MIG.
const mixedConfig = `
nodes:
- name: mixed
  nodeSelector:
    matchLabels:
      tessera.dev/test: "true"
  gpus:
  - indices: [0]
    mode: shared
  - indices: [1]
    mode: whole
  - mode: dynamicMIG
`

func TestPublishEveryMock(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	for _, machine := range nvmlbackend.MockMachines() {
		t.Run(machine, func(t *testing.T) {
			ra := startAgent(t, client, "mock:"+machine, mixedConfig, nil)
			n, _ := ra.lib.DeviceGetCount()
			wantMIG := 0
			for i := 2; i < n; i++ {
				wantMIG += nvmlPlacements(t, ra.lib, i)
			}
			want := map[string]int{string(contract.TypeGPU): n - 1, string(contract.TypeMIG): wantMIG, string(contract.TypeShared): 1}
			pool := waitPool(t, client, ra.node.Name, "every device", func(s []resourceapi.ResourceSlice) bool {
				c := countTypes(s)
				return c[string(contract.TypeGPU)] == want[string(contract.TypeGPU)] && c[string(contract.TypeMIG)] == want[string(contract.TypeMIG)] && c[string(contract.TypeShared)] == want[string(contract.TypeShared)]
			})
			// The API server accepted every slice; each is within the
			// limits, owned by the Node, and names are unique DNS labels.
			names := sets.New[string]()
			counterSets := 0
			for _, s := range pool {
				if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].UID != ra.node.UID {
					t.Errorf("slice %s not owned by node %s: %+v", s.Name, ra.node.Name, s.OwnerReferences)
				}
				if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
					t.Errorf("slice %s mixes counters and devices", s.Name)
				}
				if len(s.Spec.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
					t.Errorf("slice %s has %d counter sets", s.Name, len(s.Spec.SharedCounters))
				}
				counterSets += len(s.Spec.SharedCounters)
				advanced := false
				for _, d := range s.Spec.Devices {
					advanced = advanced || len(d.ConsumesCounters) > 0 || len(d.Taints) > 0
					if names.Has(d.Name) {
						t.Errorf("device %s published twice", d.Name)
					}
					names.Insert(d.Name)
					if _, err := devicename.Parse(d.Name); err != nil {
						t.Errorf("device name: %v", err)
					}
				}
				if advanced && len(s.Spec.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
					t.Errorf("slice %s has %d devices with counters", s.Name, len(s.Spec.Devices))
				}
			}
			if counterSets != n-2 {
				t.Errorf("%d counter sets, want one per dynamic-MIG GPU (%d)", counterSets, n-2)
			}
			if len(pool) < 2 {
				t.Errorf("an 8-GPU dynamic-MIG node should need several slices, got %d", len(pool))
			}
			if got := ra.Counts(); got.MIG != wantMIG || got.Whole != n-1 || got.Shared != 1 {
				t.Errorf("agent counts %+v, want %v", got, want)
			}
		})
	}
}

func TestStockAllocator(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	createDeviceClasses(t, client)
	ns := cp.CreateNamespace(t)
	// GPU 0 shared with 20.5Gi offered (an H100 reports 81559MiB; 59Gi kept
	// back, rounded down to the 256Mi step), GPU 1 dynamic MIG.
	cfg := `
default:
  gpus:
  - indices: [0]
    mode: shared
    shared:
      reservedMemory: 59Gi
  - indices: [1]
    mode: dynamicMIG
`
	ra := startAgent(t, client, "mock:dgxh100?gpus=2", cfg, nil)
	waitPool(t, client, ra.node.Name, "the shared and MIG devices", func(s []resourceapi.ResourceSlice) bool {
		c := countTypes(s)
		return c[string(contract.TypeShared)] == 1 && c[string(contract.TypeMIG)] > 0
	})
	ctx := context.Background()
	migGPU, _ := ra.lib.DeviceGetHandleByIndex(1)
	migUUID, _ := migGPU.GetUUID()

	type allocation struct {
		claim  *resourceapi.ResourceClaim
		result *resourceapi.AllocationResult
	}
	newState := func() *structured.AllocatedState {
		return &structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}
	}
	// allocate allocates one claim with the stock allocator on what the API
	// server holds, writes the allocation into the claim's status (the API
	// server validates it) and records it in state.
	allocate := func(t *testing.T, state *structured.AllocatedState, name, class, selector string, capacity map[resourceapi.QualifiedName]resource.Quantity) *allocation {
		t.Helper()
		req := resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
		if selector != "" {
			req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
		}
		if capacity != nil {
			req.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
		}
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}},
		}
		claim, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var all []*resourceapi.ResourceSlice
		for i := range list.Items {
			all = append(all, &list.Items[i])
		}
		features := structured.Features{
			AdminAccess: true, ConsumableCapacity: true, DeviceBindingAndStatus: true, DeviceTaints: true,
			FractionalCapacityRange: true, PartitionableDevices: true, PrioritizedList: true,
		}
		alloc, err := structured.NewAllocator(ctx, features, *state, classLister{client}, all, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
		if err != nil {
			t.Fatalf("allocator: %v", err)
		}
		results, err := alloc.Allocate(ctx, ra.node, []*resourceapi.ResourceClaim{claim})
		if err != nil {
			t.Fatalf("allocate %s: %v", name, err)
		}
		if len(results) == 0 {
			return &allocation{claim: claim}
		}
		claim.Status.Allocation = &results[0]
		if _, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("API server refused the allocation of %s: %v", name, err)
		}
		for _, r := range results[0].Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
		}
		return &allocation{claim: claim, result: &results[0]}
	}
	device := func(a *allocation) string {
		if a.result == nil {
			return ""
		}
		return a.result.Devices.Results[0].Device
	}
	onMIGGPU := `device.attributes["gpu.tessera.dev"].uuid == "` + migUUID + `"`

	t.Run("whole GPU", func(t *testing.T) {
		state := newState()
		a := allocate(t, state, "whole-1", "gpu.tessera.dev", "", nil)
		if device(a) != devicename.GPU(1) {
			t.Fatalf("whole GPU claim got %q, want %s (the only whole GPU)", device(a), devicename.GPU(1))
		}
		if b := allocate(t, state, "whole-2", "gpu.tessera.dev", "", nil); b.result != nil {
			t.Fatalf("second whole GPU claim got %q, but the node has one whole GPU", device(b))
		}
		// The whole GPU consumed every memory slice: no MIG device fits.
		if c := allocate(t, state, "mig-after-whole", "mig.gpu.tessera.dev", "", nil); c.result != nil {
			t.Fatalf("MIG claim got %q on a GPU that is allocated whole", device(c))
		}
	})

	t.Run("1g MIG then no overlapping whole GPU", func(t *testing.T) {
		state := newState()
		oneG := `device.attributes["gpu.tessera.dev"].profile.startsWith("1g.")`
		a := allocate(t, state, "mig-1g", "mig.gpu.tessera.dev", oneG, nil)
		name, err := devicename.Parse(device(a))
		if err != nil || name.Kind != devicename.KindMIG || !strings.HasPrefix(name.Profile, "1g.") || name.Minor != 1 {
			t.Fatalf("1g claim got %q (%v), want a 1g MIG device on GPU 1", device(a), err)
		}
		if b := allocate(t, state, "whole-after-mig", "gpu.tessera.dev", onMIGGPU, nil); b.result != nil {
			t.Fatalf("whole GPU claim got %q although a 1g MIG device of that GPU is allocated", device(b))
		}
		// A second 1g device fits, on a placement that does not overlap.
		c := allocate(t, state, "mig-1g-second", "mig.gpu.tessera.dev", oneG, nil)
		second, err := devicename.Parse(device(c))
		if err != nil || second.Kind != devicename.KindMIG {
			t.Fatalf("second 1g claim got %q (%v)", device(c), err)
		}
		if second.Start == name.Start {
			t.Fatalf("second 1g device %s overlaps the first %s", device(c), device(a))
		}
	})

	t.Run("fractions of a shared GPU", func(t *testing.T) {
		state := newState()
		tenGi := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}
		a := allocate(t, state, "frac-1", "shared.gpu.tessera.dev", "", tenGi)
		b := allocate(t, state, "frac-2", "shared.gpu.tessera.dev", "", tenGi)
		if device(a) != devicename.Shared(0) || device(b) != devicename.Shared(0) {
			t.Fatalf("fractions got %q and %q, want both on %s", device(a), device(b), devicename.Shared(0))
		}
		for _, x := range []*allocation{a, b} {
			got := x.result.Devices.Results[0].ConsumedCapacity["memory"]
			if got.Cmp(resource.MustParse("10Gi")) != 0 {
				t.Fatalf("consumed memory %s, want 10Gi", got.String())
			}
		}
		if c := allocate(t, state, "frac-3", "shared.gpu.tessera.dev", "", tenGi); c.result != nil {
			t.Fatalf("third 10Gi fraction got %q, but only 20.5Gi are offered", device(c))
		}
		// A smaller fraction still fits nowhere: the memory is used up.
		if d := allocate(t, state, "frac-4", "shared.gpu.tessera.dev", "", map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi")}); d.result != nil {
			t.Fatalf("1Gi fraction got %q on a full GPU", device(d))
		}
	})
}

func TestHealthTaints(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	cfg := `
default:
  gpus:
  - indices: [0]
    mode: dynamicMIG
`
	ra := startAgent(t, client, "mock:dgxa100?gpus=2", cfg, func(o *agent.Options) {
		o.Monitor = &health.MonitorOptions{ProbeInterval: 50 * time.Millisecond, WaitTimeout: 50 * time.Millisecond}
	})
	mock := ra.lib.(*nvmlbackend.Mock)
	gpus := mock.GPUs()
	waitPool(t, client, ra.node.Name, "the first publish", func(s []resourceapi.ResourceSlice) bool { return countTypes(s)[string(contract.TypeMIG)] > 0 })
	// Wait until the monitor has registered its event set.
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return mock.InjectXID(gpus[1].UUID, 43) == nil, nil
	}); err != nil {
		t.Fatal("the health monitor never registered for XID events")
	}

	taintsOf := func(s []resourceapi.ResourceSlice) map[string][]resourceapi.DeviceTaint {
		out := map[string][]resourceapi.DeviceTaint{}
		for _, d := range devices(s) {
			uuid := d.Attributes["uuid"]
			if p, ok := d.Attributes["parentUUID"]; ok {
				uuid = p
			}
			out[*uuid.StringValue] = append(out[*uuid.StringValue], d.Taints...)
		}
		return out
	}
	allTainted := func(s []resourceapi.ResourceSlice, uuid, key, value string, effect resourceapi.DeviceTaintEffect) bool {
		n := 0
		for _, d := range devices(s) {
			owner := d.Attributes["uuid"]
			if p, ok := d.Attributes["parentUUID"]; ok {
				owner = p
			}
			if *owner.StringValue != uuid {
				continue
			}
			n++
			found := false
			for _, tn := range d.Taints {
				found = found || (tn.Key == key && tn.Value == value && tn.Effect == effect)
			}
			if !found {
				return false
			}
		}
		return n > 0
	}

	// A critical XID on GPU 0 taints exactly GPU 0's devices (the whole GPU
	// and every MIG device); the benign XID 43 on GPU 1 taints nothing.
	if err := mock.InjectXID(gpus[0].UUID, 48); err != nil {
		t.Fatal(err)
	}
	s := waitPool(t, client, ra.node.Name, "the XID taint", func(s []resourceapi.ResourceSlice) bool {
		return allTainted(s, gpus[0].UUID, contract.TaintKeyXID, "48", resourceapi.DeviceTaintEffectNoSchedule)
	})
	if got := taintsOf(s)[gpus[1].UUID]; len(got) != 0 {
		t.Fatalf("GPU 1 got taints %v from a benign XID", got)
	}

	// The GPU comes back: clearing the condition removes the taint.
	ra.Health().Inject(health.Event{UUID: gpus[0].UUID, Kind: health.KindXID, Healthy: true, Message: "test"})
	waitPool(t, client, ra.node.Name, "the XID taint to go", func(s []resourceapi.ResourceSlice) bool {
		return len(taintsOf(s)[gpus[0].UUID]) == 0
	})

	// A GPU that stops answering NVML is lost (NoExecute) until it answers again.
	if err := mock.SetLost(gpus[1].UUID, true); err != nil {
		t.Fatal(err)
	}
	s = waitPool(t, client, ra.node.Name, "the gpu-lost taint", func(s []resourceapi.ResourceSlice) bool {
		return allTainted(s, gpus[1].UUID, contract.TaintKeyLost, "", resourceapi.DeviceTaintEffectNoExecute)
	})
	if got := taintsOf(s)[gpus[0].UUID]; len(got) != 0 {
		t.Fatalf("GPU 0 got taints %v when GPU 1 was lost", got)
	}
	if err := mock.SetLost(gpus[1].UUID, false); err != nil {
		t.Fatal(err)
	}
	waitPool(t, client, ra.node.Name, "the gpu-lost taint to go", func(s []resourceapi.ResourceSlice) bool {
		return len(taintsOf(s)[gpus[1].UUID]) == 0
	})
}

func TestStaticMIGLayout(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	cfg := `
default:
  gpus:
  - indices: [0]
    mode: staticMIG
    layout:
    - profile: 3g.40gb
    - profile: 2g.20gb
    - profile: 1g.10gb
`
	ra := startAgent(t, client, "mock:dgxh100?gpus=1", cfg, nil)
	s := waitPool(t, client, ra.node.Name, "the static MIG devices", func(s []resourceapi.ResourceSlice) bool { return countTypes(s)[string(contract.TypeMIG)] == 3 })
	for _, d := range devices(s) {
		if deviceType(d) != string(contract.TypeMIG) {
			t.Errorf("unexpected device %s of type %s", d.Name, deviceType(d))
			continue
		}
		if u := d.Attributes["uuid"]; u.StringValue == nil || !strings.HasPrefix(*u.StringValue, "MIG-") {
			t.Errorf("static MIG device %s has no MIG UUID", d.Name)
		}
		if len(d.ConsumesCounters) != 0 {
			t.Errorf("static MIG device %s consumes counters", d.Name)
		}
	}
	// The instances exist in NVML.
	dev, _ := ra.lib.DeviceGetHandleByIndex(0)
	if n, _ := dev.GetMaxMigDeviceCount(); n == 0 {
		t.Fatal("no MIG devices")
	}
	if _, ret := dev.GetMigDeviceHandleByIndex(2); ret != nvml.SUCCESS {
		t.Fatalf("third MIG device: %v", ret)
	}
}

func TestBadConfigFailsAtStart(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	node := createNode(t, client, nil)
	for name, tc := range map[string]struct{ cfg, want string }{
		"unsupported profile": {`
default:
  gpus:
  - mode: dynamicMIG
    profiles: [1g.5gb]
`, `default.gpus[0].profiles[0]: Unsupported value: "1g.5gb"`},
		"overlapping layout": {`
default:
  gpus:
  - indices: [1]
    mode: staticMIG
    layout:
    - {profile: 4g.40gb, start: 0}
    - {profile: 2g.20gb, start: 2}
`, `default.gpus[0].layout[1]`},
		"missing GPU": {`
default:
  gpus:
  - indices: [5]
    mode: whole
`, `default.gpus[0].indices[0]: Invalid value: 5`},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := parse(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			a, err := agent.New(agent.Options{KubeClient: client, NodeName: node.Name, NVML: lib, Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			_, ctx := ktesting.NewTestContext(t)
			err = a.Run(ctx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// Nothing was half-applied: no GPU changed MIG mode.
	for i := 0; i < 2; i++ {
		dev, _ := lib.DeviceGetHandleByIndex(i)
		if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_DISABLE {
			t.Errorf("GPU %d: MIG mode %d after a refused config", i, mode)
		}
	}
}

func TestUnreachableAPIServer(t *testing.T) {
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvmlbackend.Open("mock:dgxh100?gpus=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	a, err := agent.New(agent.Options{KubeClient: client, NodeName: "n1", NVML: lib, StartupTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	err = a.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), `get Node "n1" from the API server`) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Run: %v, want a clear API server error", err)
	}
}

func TestDegradesWithoutPartitionableDevices(t *testing.T) {
	cp := framework.StartForTest(t, framework.Options{
		FeatureGates:        map[string]bool{"DRAPartitionableDevices": false, "DRAConsumableCapacity": false},
		NoControllerManager: true,
	})
	client := cp.Client(t)
	ra := startAgent(t, client, "mock:dgxh100?gpus=3", mixedConfig, nil)
	// Every GPU is offered whole: dynamic MIG and shared need the missing features.
	s := waitPool(t, client, ra.node.Name, "whole GPUs only", func(s []resourceapi.ResourceSlice) bool {
		return countTypes(s)[string(contract.TypeGPU)] == 3
	})
	if c := countTypes(s); c[string(contract.TypeMIG)] != 0 || c[string(contract.TypeShared)] != 0 {
		t.Fatalf("devices by type %v on a cluster without partitionable devices", c)
	}
	if f := ra.Features(); f.PartitionableDevices || f.ConsumableCapacity || !f.DeviceTaints {
		t.Fatalf("detected features %+v", f)
	}
	// A GPU offered whole was not switched into MIG mode for a dynamic MIG
	// that the cluster cannot use.
	for i := 0; i < 3; i++ {
		dev, _ := ra.lib.DeviceGetHandleByIndex(i)
		if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_DISABLE {
			t.Errorf("GPU %d in MIG mode on a cluster without partitionable devices", i)
		}
	}
	// The Node has events that say why.
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		var mig, shared bool
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != ra.node.Name || e.Reason != "DRAFeatureMissing" || e.Type != v1.EventTypeWarning {
				continue
			}
			mig = mig || strings.Contains(e.Message, "DRAPartitionableDevices")
			shared = shared || strings.Contains(e.Message, "DRAConsumableCapacity")
		}
		return mig && shared, nil
	})
	if err != nil {
		t.Fatalf("no Node events explaining the degradation: %v", err)
	}
}

func TestRepublishesOnChange(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	dir := t.TempDir()
	path := dir + "/partition.yaml"
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`
default:
  gpus: [{mode: whole}]
nodes:
- name: shared-nodes
  nodeSelector: {matchLabels: {partition: shared}}
  gpus: [{mode: shared}]
- name: static-nodes
  nodeSelector: {matchLabels: {partition: static}}
  gpus: [{mode: staticMIG}]
`)
	ra := startAgent(t, client, "mock:dgxa100?gpus=2", "", func(o *agent.Options) {
		o.ConfigPath = path
		o.ResyncPeriod = 200 * time.Millisecond
	})
	waitPool(t, client, ra.node.Name, "whole GPUs", func(s []resourceapi.ResourceSlice) bool { return countTypes(s)[string(contract.TypeGPU)] == 2 })

	// A node label selects another entry.
	setLabel := func(v string) {
		t.Helper()
		node, err := client.CoreV1().Nodes().Get(context.Background(), ra.node.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Labels["partition"] = v
		if _, err := client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setLabel("shared")
	waitPool(t, client, ra.node.Name, "shared GPUs", func(s []resourceapi.ResourceSlice) bool { return countTypes(s)[string(contract.TypeShared)] == 2 })

	// The file changes: the shared entry now offers GPU 1 as dynamic MIG.
	write(`
nodes:
- nodeSelector: {matchLabels: {partition: shared}}
  gpus: [{indices: [0], mode: shared}, {indices: [1], mode: dynamicMIG}]
- nodeSelector: {matchLabels: {partition: static}}
  gpus: [{mode: staticMIG}]
`)
	waitPool(t, client, ra.node.Name, "shared + dynamic MIG", func(s []resourceapi.ResourceSlice) bool {
		c := countTypes(s)
		return c[string(contract.TypeShared)] == 1 && c[string(contract.TypeMIG)] == nvmlPlacements(t, ra.lib, 1)
	})

	// An invalid file keeps the last good config and says so on the Node.
	write("default: {gpus: [{mode: wholeish}]}")
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == ra.node.Name && e.Reason == "InvalidPartitionConfig" && strings.Contains(e.Message, `default.gpus[0].mode: Unsupported value: "wholeish"`) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no InvalidPartitionConfig event: %v", err)
	}
	if c := ra.Counts(); c.Shared != 1 || c.MIG == 0 {
		t.Fatalf("counts %+v after an invalid file, want the last good config", c)
	}

	// Static MIG: instances created behind the agent's back are published at
	// the next resync, and go again when destroyed.
	write(`
nodes:
- nodeSelector: {matchLabels: {partition: static}}
  gpus: [{mode: staticMIG}]
`)
	setLabel("static")
	waitPool(t, client, ra.node.Name, "no devices (static MIG without instances)", func(s []resourceapi.ResourceSlice) bool {
		return len(devices(s)) == 0
	})
	dev, _ := ra.lib.DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
	gi, ret := dev.CreateGpuInstance(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	ci, ret := gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	waitPool(t, client, ra.node.Name, "the new MIG instance", func(s []resourceapi.ResourceSlice) bool {
		d := devices(s)
		return len(d) == 1 && d[0].Name == devicename.MIG(0, "7g.40gb", 0)
	})
	_ = ci.Destroy()
	_ = gi.Destroy()
	waitPool(t, client, ra.node.Name, "the MIG instance to go", func(s []resourceapi.ResourceSlice) bool { return len(devices(s)) == 0 })
}
