package draplugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
	"github.com/tessera-gpu/tessera/draplugin/internal/podrunner"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// The mock DGX H100 of every test: GPU 0 and 1 offer dynamic MIG, GPU 2 is
// shared through consumable capacity, GPU 3 is offered whole.
const partitionConfig = `
default:
  gpus:
  - indices: [0, 1]
    mode: dynamicMIG
  - indices: [2]
    mode: shared
  - indices: [3]
    mode: whole
`

// env is one simulated node: a mock DGX H100, the node agent publishing its
// slices to the real API server, device classes, the plugin's directories and recording
// fakes of the NVIDIA tools.
type env struct {
	t        testing.TB
	ctx      context.Context
	client   kubernetes.Interface
	ns       string
	tenants  []string // more namespaces with claims on the node
	nodeName string
	lib      *nvmlbackend.Mock
	agent    *agent.Agent
	node     *discovery.Node
	tools    *faketools.Tools
	// runner runs the node's MPS daemon pods as the kubelet would.
	runner  *podrunner.Runner
	bootID  string
	classes map[string]string // "gpu", "mig", "shared" → DeviceClass name

	registrarDir, pluginDir, cdiDir, mpsDir string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, 4, partitionConfig)
}

// newEnvWith builds a node with n mock H100 GPUs and a partition config.
func newEnvWith(t testing.TB, gpus int, config string) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if _, ok := t.(*testing.B); ok {
		// A test logger keeps every line in memory until the end: that
		// would be measured as the plugin's memory and slow the loop.
		ctx = klog.NewContext(context.Background(), klog.Background())
	}
	cp := framework.Shared(t)
	e := &env{
		t:        t,
		ctx:      ctx,
		client:   cp.Client(t),
		ns:       cp.CreateNamespace(t),
		nodeName: framework.UniqueName("node"),
		bootID:   "boot-1",
		tools:    faketools.Install(t),
		classes:  map[string]string{},
	}
	// Unix socket paths are limited to 108 bytes: keep the base short.
	base, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	e.registrarDir, e.pluginDir = filepath.Join(base, "reg"), filepath.Join(base, "plugin")
	e.cdiDir, e.mpsDir = filepath.Join(base, "cdi"), filepath.Join(base, "mps")

	e.lib, err = nvmlbackend.NewMock("dgxh100", gpus)
	if err != nil {
		t.Fatal(err)
	}
	// The machine's driver installation (DriverRoot) goes at shutdown,
	// after the agent and the plugins stopped (cleanups run last first).
	t.Cleanup(func() { _ = e.lib.Shutdown() })
	nodeObj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.nodeName}}
	if _, err := e.client.CoreV1().Nodes().Create(ctx, nodeObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.CoreV1().Nodes().Delete(context.Background(), e.nodeName, metav1.DeleteOptions{}) })
	for _, typ := range []string{"gpu", "mig", "shared"} {
		name := framework.UniqueName(typ)
		class := &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.driver == %q && device.attributes[%q].type == %q`, DriverName, DriverName, typ),
			}}}},
		}
		if _, err := e.client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.classes[typ] = name
		t.Cleanup(func() {
			_ = e.client.ResourceV1().DeviceClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}

	// The node agent applies the partition config (MIG mode on GPU 0 and 1)
	// and publishes the node's pool through its ResourceSlice controller.
	cfg, err := partition.Parse([]byte(config))
	if err != nil {
		t.Fatal(err)
	}
	features := slices.AllFeatures
	e.agent, err = agent.New(agent.Options{KubeClient: e.client, NodeName: e.nodeName, NVML: e.lib, Config: cfg, Features: &features})
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	go func() { agentDone <- e.agent.Run(agentCtx) }()
	t.Cleanup(func() {
		stopAgent()
		<-agentDone
	})
	waitPublished(t, e)
	e.node, _ = e.agent.Snapshot()
	// The kubelet's part for the MPS daemon pods the plugin creates: they
	// run, and outlive plugin restarts, as on a real node. (Started after
	// the agent so that it stops before the machine's driver root goes.)
	e.runner = podrunner.Start(ctx, e.client, e.ns, e.nodeName, 2*time.Second)
	t.Cleanup(e.runner.Stop)
	return e
}

// daemonPods lists the claims (daemon IDs) whose MPS daemon pod exists on
// the node.
func (e *env) daemonPods() []string {
	e.t.Helper()
	ids, err := e.launcher().Launched(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	sort.Strings(ids)
	return ids
}

// waitNoDaemonPods waits until no daemon pod is left on the node (the
// runner removes a deleted pod once its container stopped).
func (e *env) waitNoDaemonPods() {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return len(e.daemonPods()) == 0, nil
	})
	if err != nil {
		e.t.Errorf("daemon pods left: %v", e.daemonPods())
	}
}

// launcher is how the env's plugins start MPS daemons: a pod each.
func (e *env) launcher() *sharing.PodLauncher {
	return &sharing.PodLauncher{Client: e.client, Namespace: e.ns, NodeName: e.nodeName, Image: "tessera:test", MPSDir: e.mpsDir, HostDriverRoot: "/"}
}

// pipeDir is the host pipe directory of a claim's MPS daemon.
func (e *env) pipeDir(uid types.UID) string { return sharing.DirsOf(e.mpsDir, string(uid)).Pipe }

// waitPublished waits until the agent published the node's whole pool.
func waitPublished(t testing.TB, e *env) {
	t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if !e.agent.Ready() {
			return false, nil
		}
		list, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n, want := 0, int64(-1)
		for _, s := range list.Items {
			if s.Spec.Pool.Name == e.nodeName {
				n++
				want = s.Spec.Pool.ResourceSliceCount
			}
		}
		return int64(n) == want, nil
	})
	if err != nil {
		t.Fatalf("node agent did not publish: %v", err)
	}
}

func (e *env) options() Options {
	return Options{
		KubeClient:      e.client,
		NodeName:        e.nodeName,
		NVML:            e.lib,
		Node:            e.node,
		Health:          e.agent.Health(),
		RegistrarDir:    e.registrarDir,
		PluginDir:       e.pluginDir,
		CDIDir:          e.cdiDir,
		MPSDir:          e.mpsDir,
		BootID:          e.bootID,
		GPULocks:        e.agent.GPULocks(),
		Withdraw:        e.agent.Withdraw,
		MPSLauncher:     e.launcher(),
		MPSStartTimeout: 20 * time.Second,
	}
}

// start starts the plugin on the env's directories and stops it at the end.
func (e *env) start(mod ...func(*Options)) *Plugin {
	e.t.Helper()
	opts := e.options()
	for _, m := range mod {
		m(&opts)
	}
	p, err := Start(e.ctx, opts)
	if err != nil {
		e.t.Fatalf("start plugin: %v", err)
	}
	e.t.Cleanup(p.Stop)
	return p
}

// request describes one request of a test claim.
type request struct {
	name, class, selector string
	memory, compute       string // consumable capacity of a shared request
	count                 int64
	adminAccess           bool
	// device pins the request's device: the stock allocator picks one (it checks that
	// the request fits), then the claim gets this one instead, a published device of the
	// same profile. It stands for a scheduler's choice that a selector cannot make: CEL
	// does not see a device's name, and a dynamic MIG device has no placement attribute
	// (slices.MaxDynamicMIGAttributes).
	device string
}

// claim creates a claim and allocates it with the stock structured
// allocator against the node's slices, as a scheduler would, and stores the
// allocation in the API.
func (e *env) claim(name string, reqs []request, configs ...claimConfig) *resourceapi.ResourceClaim {
	e.t.Helper()
	return e.claimIn(e.ns, name, reqs, configs...)
}

// namespace makes another namespace for claims (another tenant).
func (e *env) namespace() string {
	e.t.Helper()
	ns := framework.Shared(e.t).CreateNamespace(e.t)
	e.tenants = append(e.tenants, ns)
	return ns
}

// claimIn is claim in the namespace ns (the env's or one from namespace).
func (e *env) claimIn(ns, name string, reqs []request, configs ...claimConfig) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	pins := map[string]string{}
	for _, r := range reqs {
		if r.device != "" {
			pins[r.name] = r.device
		}
		dr := resourceapi.DeviceRequest{Name: r.name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: e.classes[r.class], Count: max(r.count, 1)}}
		if r.adminAccess {
			dr.Exactly.AdminAccess = ptr.To(true)
		}
		if r.selector != "" {
			dr.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: r.selector}}}
		}
		if r.memory != "" || r.compute != "" {
			dr.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
			if r.memory != "" {
				dr.Exactly.Capacity.Requests["memory"] = resource.MustParse(r.memory)
			}
			if r.compute != "" {
				dr.Exactly.Capacity.Requests["compute"] = resource.MustParse(r.compute)
			}
		}
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, dr)
	}
	for _, cfg := range configs {
		c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{
			Requests: cfg.requests,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(cfg.json)},
			}},
		})
	}
	created, err := e.client.ResourceV1().ResourceClaims(ns).Create(e.ctx, c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create claim %s: %v", name, err)
	}
	return e.allocatePinned(created, pins)
}

// claimConfig is an opaque GpuConfig or MigDeviceConfig (JSON) for the
// named requests (all when empty).
type claimConfig struct {
	requests []string
	json     string
}

var allocMu sync.Mutex

// release deletes a claim so that its devices can be allocated again.
func (e *env) release(c *resourceapi.ResourceClaim) {
	e.t.Helper()
	if err := e.client.ResourceV1().ResourceClaims(c.Namespace).Delete(e.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// allocatePinned allocates claim with the stock structured allocator on this node's
// slices, then replaces the devices of the requests named in pins (request.device).
func (e *env) allocatePinned(claim *resourceapi.ResourceClaim, pins map[string]string) *resourceapi.ResourceClaim {
	e.t.Helper()
	// Allocation must see earlier allocations: serialize it like a scheduler.
	allocMu.Lock()
	defer allocMu.Unlock()
	sliceList, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var mine []*resourceapi.ResourceSlice
	for i := range sliceList.Items {
		if sliceList.Items[i].Spec.Pool.Name == e.nodeName {
			mine = append(mine, &sliceList.Items[i])
		}
	}
	var claims resourceapi.ResourceClaimList
	for _, ns := range append([]string{e.ns}, e.tenants...) {
		list, err := e.client.ResourceV1().ResourceClaims(ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		claims.Items = append(claims.Items, list.Items...)
	}
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	classList, err := e.client.ResourceV1().DeviceClasses().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	features := structured.Features{ConsumableCapacity: true, PartitionableDevices: true, DeviceTaints: true, PrioritizedList: true, AdminAccess: true}
	alloc, err := structured.NewAllocator(e.ctx, features, state, classLister(classList.Items), mine, cel.NewCache(10, cel.Features{}))
	if err != nil {
		e.t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.nodeName}}
	results, err := alloc.Allocate(e.ctx, node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		e.t.Fatalf("allocate %s: %v", claim.Name, err)
	}
	if len(results) != 1 {
		e.t.Fatalf("claim %s does not fit on node %s", claim.Name, e.nodeName)
	}
	for i := range results[0].Devices.Results {
		r := &results[0].Devices.Results[i]
		if pin, ok := pins[r.Request]; ok {
			if !samePublishedProfile(mine, r.Device, pin) {
				e.t.Fatalf("claim %s: pinned device %s is not a published device of the profile of %s", claim.Name, pin, r.Device)
			}
			r.Device = pin
		}
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = &results[0]
	updated, err := e.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(e.ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("store allocation of %s: %v", claim.Name, err)
	}
	return updated
}

// samePublishedProfile: the slices publish both devices, with the same type and profile.
func samePublishedProfile(slices []*resourceapi.ResourceSlice, a, b string) bool {
	find := func(name string) *resourceapi.Device {
		for _, s := range slices {
			for i := range s.Spec.Devices {
				if s.Spec.Devices[i].Name == name {
					return &s.Spec.Devices[i]
				}
			}
		}
		return nil
	}
	da, db := find(a), find(b)
	return da != nil && db != nil && contract.TypeOf(da) == contract.TypeOf(db) &&
		contract.StringAttr(da, contract.AttrProfile) == contract.StringAttr(db, contract.AttrProfile)
}

type classLister []resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, len(l))
	for i := range l {
		out[i] = &l[i]
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for i := range l {
		if l[i].Name == name {
			return &l[i], nil
		}
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

// kubelet talks to the plugin the way the kubelet does: registration
// socket first, then the DRA socket it names.
type kubelet struct {
	info *registerapi.PluginInfo
	conn *grpc.ClientConn
	dra  drapb.DRAPluginClient
}

func (e *env) kubelet() *kubelet {
	e.t.Helper()
	regPath := filepath.Join(e.registrarDir, DriverName+"-reg.sock")
	var regConn *grpc.ClientConn
	err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(regPath)
		return err == nil, nil
	})
	if err != nil {
		e.t.Fatalf("registration socket %s never appeared", regPath)
	}
	regConn, err = grpc.NewClient("unix://"+regPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = regConn.Close() })
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(e.ctx, &registerapi.InfoRequest{})
	if err != nil {
		e.t.Fatalf("GetInfo: %v", err)
	}
	if _, err := reg.NotifyRegistrationStatus(e.ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		e.t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	draConn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = draConn.Close() })
	return &kubelet{info: info, conn: draConn, dra: drapb.NewDRAPluginClient(draConn)}
}

func (k *kubelet) prepare(t testing.TB, ctx context.Context, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	t.Helper()
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	resp, err := k.dra.NodePrepareResources(ctx, req)
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp.Claims
}

func (k *kubelet) unprepare(t testing.TB, ctx context.Context, claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodeUnprepareResourceResponse {
	t.Helper()
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	resp, err := k.dra.NodeUnprepareResources(ctx, req)
	if err != nil {
		t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp.Claims
}

// migInstances lists "gpu<minor>:<profile>@<start>" for every GPU
// instance on the mock.
func (e *env) migInstances() []string {
	e.t.Helper()
	var out []string
	for _, g := range e.lib.GPUs() {
		for _, in := range g.Instances() {
			out = append(out, fmt.Sprintf("gpu%d:%s@%d", g.Minor, in.Profile, in.Start))
		}
	}
	sort.Strings(out)
	return out
}

// specFiles lists the claims' CDI spec files (not the base spec).
func (e *env) specFiles() []string {
	entries, _ := os.ReadDir(e.cdiDir)
	var out []string
	for _, en := range entries {
		if strings.HasSuffix(en.Name(), ".json") && strings.Contains(en.Name(), "-claim_") {
			out = append(out, en.Name())
		}
	}
	return out
}

// createStaticMIG makes a MIG instance outside the plugin, as an
// administrator does with nvidia-smi.
func (e *env) createStaticMIG(minor int, profile string, start int) {
	e.t.Helper()
	g := e.lib.GPUs()[minor]
	if !g.MIGMode().Current {
		if err := g.EnableMIG(); err != nil { // nvidia-smi -i <minor> -mig 1
			e.t.Fatal(err)
		}
	}
	if _, err := g.CreateInstance(profile, uint32(start)); err != nil {
		e.t.Fatal(err)
	}
}
