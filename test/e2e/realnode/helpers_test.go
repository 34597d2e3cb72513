package realnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/deployments/deviceclasses"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
	"github.com/tessera-gpu/tessera/test/framework"
)

// partitionConfig is the mock DGX H100 of every test: GPU 0 and 1 offer
// dynamic MIG, GPU 2 is shared through consumable capacity, GPU 3 is whole.
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

// env is one test's real node and namespace.
type env struct {
	t      *testing.T
	ctx    context.Context
	cp     *framework.ControlPlane
	client kubernetes.Interface
	ns     string
	node   *realnode.Node
}

// newEnv starts a real node for the test (and skips the test where the
// machine cannot run one). mod changes the node's options.
func newEnv(t *testing.T, mod ...func(*realnode.Options)) *env {
	t.Helper()
	if unavailable != "" {
		if os.Getenv(EnvRequire) != "" {
			t.Fatalf("%s is set but this machine cannot run a real node: %s", EnvRequire, unavailable)
		}
		t.Skipf("this machine cannot run a real node: %s", unavailable)
	}
	_, ctx := ktesting.NewTestContext(t)
	cp := framework.Shared(t)
	e := &env{t: t, ctx: ctx, cp: cp, client: cp.Client(t), ns: cp.CreateNamespace(t)}
	installDeviceClasses(t, ctx, e.client)
	opts := realnode.Options{
		NodeName:        framework.UniqueName("real"),
		Kubeconfig:      cp.KubeconfigPath,
		TesseraNode:     tesseraNode,
		PartitionConfig: partitionConfig,
		Log:             t.Logf,
	}
	for _, m := range mod {
		m(&opts)
	}
	startCtx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	start := time.Now()
	node, err := realnode.Start(startCtx, opts)
	if err != nil {
		t.Fatalf("start real node: %v", err)
	}
	t.Logf("real node %s up in %s", node.Name(), time.Since(start).Round(10*time.Millisecond))
	e.node = node
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLogs()
		}
		if err := node.Stop(); err != nil {
			t.Errorf("tear down the real node: %v", err)
		}
	})
	return e
}

func (e *env) dumpLogs() {
	e.t.Logf("kubelet log (end):\n%s", e.node.KubeletLog(60))
	e.t.Logf("containerd log (end):\n%s", e.node.ContainerdLog(30))
	if e.node.Plugin != nil {
		e.t.Logf("tessera-node log (end):\n%s", e.node.Plugin.Log(40))
	}
}

var classesOnce sync.Mutex

// installDeviceClasses applies the DeviceClasses users install
// (deployments/deviceclasses), once per control plane.
func installDeviceClasses(t *testing.T, ctx context.Context, client kubernetes.Interface) {
	t.Helper()
	classesOnce.Lock()
	defer classesOnce.Unlock()
	err := fs.WalkDir(deviceclasses.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(deviceclasses.FS, path)
		if err != nil {
			return err
		}
		var class resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict(data, &class); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		_, err = client.ResourceV1().DeviceClasses().Create(ctx, &class, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatalf("install DeviceClasses: %v", err)
	}
}

// request is one device request of a test claim.
type request struct {
	class    string // contract.ClassGPU, ClassMIG, ClassShared
	selector string // CEL, optional
	memory   string // consumed capacity of a share
	compute  string
}

// claim creates a ResourceClaim with one request "gpu".
func (e *env) claim(name string, r request) *resourceapi.ResourceClaim {
	e.t.Helper()
	dr := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: r.class}}
	if r.selector != "" {
		dr.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: r.selector}}}
	}
	if r.memory != "" || r.compute != "" {
		dr.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		if r.memory != "" {
			dr.Exactly.Capacity.Requests[contract.CapMemory] = resource.MustParse(r.memory)
		}
		if r.compute != "" {
			dr.Exactly.Capacity.Requests[contract.CapCompute] = resource.MustParse(r.compute)
		}
	}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{dr}}},
	}
	created, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create claim %s: %v", name, err)
	}
	return created
}

// allocationAt is allocation for a claim of one MIG device, moved to the placement
// starting at start on the same GPU: a scheduler's choice that a selector cannot make (CEL
// does not see a device's name, and a dynamic MIG device has no placement attribute:
// slices.MaxDynamicMIGAttributes). The device must be published.
func (e *env) allocationAt(claim *resourceapi.ResourceClaim, start int) *resourceapi.AllocationResult {
	e.t.Helper()
	alloc := e.allocation(claim)
	r := &alloc.Devices.Results[0]
	n, err := devicename.Parse(r.Device)
	if err != nil || n.Kind != devicename.KindMIG {
		e.t.Fatalf("allocated device %s is not a MIG device: %v", r.Device, err)
	}
	r.Device = devicename.MIG(n.Minor, n.Profile, start)
	e.sliceDevice(r.Device)
	return alloc
}

// allocation finds devices for claim on the node with the stock structured
// allocator, against the node's published ResourceSlices and every
// allocation in the namespace, as the kube-scheduler's DRA plugin does.
func (e *env) allocation(claim *resourceapi.ResourceClaim) *resourceapi.AllocationResult {
	e.t.Helper()
	sliceList, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var mine []*resourceapi.ResourceSlice
	for i := range sliceList.Items {
		if sliceList.Items[i].Spec.Pool.Name == e.node.Name() {
			mine = append(mine, &sliceList.Items[i])
		}
	}
	claims, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
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
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.node.Name()}}
	results, err := alloc.Allocate(e.ctx, node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		e.t.Fatalf("allocate %s: %v", claim.Name, err)
	}
	if len(results) != 1 {
		e.t.Fatalf("claim %s does not fit on node %s", claim.Name, e.node.Name())
	}
	return &results[0]
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

// reportScript prints what the container got — its NVIDIA device nodes with
// their numbers, its environment, its mounts, the MPS pipe directory, the
// driver's files (libraries and binaries: symlinks with their targets,
// files with their SHA-256), the dynamic linker's configuration and cache
// that nvidia-cdi-hook's update-ldcache wrote, and what the driver's
// nvidia-smi says when run — between markers, then stays up.
const reportScript = `echo '== dev'
for f in $(find /dev -name 'nvidia*' ! -type d | sort); do stat -c '%n %F %t:%T' "$f"; done
echo '== env'
env | sort
echo '== mounts'
cat /proc/self/mounts
echo '== mps'
ls -l /tmp/nvidia-mps 2>/dev/null || true
echo '== driver'
for f in $(find /usr/lib/x86_64-linux-gnu /usr/bin \( -name 'lib*' -o -name 'nvidia-*' \) 2>/dev/null | sort); do
  if [ -L "$f" ]; then echo "L $f $(readlink "$f")"; else echo "F $f $(sha256sum < "$f" | cut -d' ' -f1)"; fi
done
echo '== ldconf'
for f in /etc/ld.so.conf /etc/ld.so.conf.d/*; do [ -f "$f" ] && sed "s|^|$f: |" "$f"; done
echo '== ldcache'
base64 /etc/ld.so.cache 2>/dev/null | tr -d '\n'; echo
echo '== smi'
/usr/bin/nvidia-smi 2>&1; echo "exit $?"
echo '== end'
exec sleep 3600
`

// pod returns a busybox pod that uses claim (by name) in its container and
// runs script.
func (e *env) pod(name, claim, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: realnode.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", script},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
			TerminationGracePeriodSeconds: ptr.To[int64](1),
		},
	}
}

// schedule does what a scheduler does for a pod with one claim: create the
// pod, allocate the claim (unless alloc is given: a stale or foreign
// allocation) and reserve it for the pod, then bind the pod to the node.
func (e *env) schedule(pod *corev1.Pod, claim *resourceapi.ResourceClaim, alloc *resourceapi.AllocationResult) (*corev1.Pod, *resourceapi.ResourceClaim) {
	e.t.Helper()
	created, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	if alloc == nil {
		alloc = e.allocation(claim)
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = alloc
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: created.Name, UID: created.UID}}
	claim, err = e.client.ResourceV1().ResourceClaims(e.ns).UpdateStatus(e.ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("allocate and reserve claim %s: %v", claim.Name, err)
	}
	err = e.client.CoreV1().Pods(e.ns).Bind(e.ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: created.Name, UID: created.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: e.node.Name()},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("bind %s: %v", pod.Name, err)
	}
	return created, claim
}

// waitFor polls cond every 200ms until it holds or timeout passes.
// describe, when given, adds what was seen last to the failure.
func (e *env) waitFor(what string, timeout time.Duration, cond func(ctx context.Context) (bool, error), describe ...func() string) {
	e.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		seen := ""
		for _, d := range describe {
			seen += "; " + d()
		}
		e.t.Fatalf("%s: not within %s (last error: %v)%s", what, timeout, last, seen)
	}
}

// waitRunning waits until the pod's container runs and returns the pod.
func (e *env) waitRunning(pod *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	start := time.Now()
	defer func() { e.t.Logf("pod %s running after %s", pod.Name, time.Since(start).Round(10*time.Millisecond)) }()
	var got *corev1.Pod
	e.waitFor("pod "+pod.Name+" running", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = p
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod ended: %s %s", p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil, nil
	})
	return got
}

// report is what a container printed with reportScript.
type report struct {
	devices  map[string]string // path → "<major>:<minor>" (decimal)
	devTypes map[string]string // path → stat's file type
	env      map[string]string
	mounts   map[string]string // container path → "<source> <fstype> <options>"
	mps      []string          // ls -l of the MPS pipe directory
	links    map[string]string // driver symlink → target
	files    map[string]string // driver file → SHA-256
	ldconf   []string          // "<file>: <line>" of /etc/ld.so.conf and its drop-ins
	ldcache  string            // /etc/ld.so.cache, base64
	smi      []string          // nvidia-smi's output and "exit <code>"
}

// readReport reads the pod's log through the API server (which fetches it
// from the kubelet, which reads the file containerd's shim wrote) and parses
// it.
func (e *env) readReport(pod *corev1.Pod) report {
	e.t.Helper()
	var raw string
	e.waitFor("report of "+pod.Name, time.Minute, func(ctx context.Context) (bool, error) {
		data, err := e.client.CoreV1().Pods(e.ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "main"}).DoRaw(ctx)
		if err != nil {
			return false, err
		}
		raw = string(data)
		return strings.Contains(raw, "== end"), nil
	})
	r := report{devices: map[string]string{}, devTypes: map[string]string{}, env: map[string]string{}, mounts: map[string]string{},
		links: map[string]string{}, files: map[string]string{}}
	section := ""
	for _, line := range strings.Split(raw, "\n") {
		if s, ok := strings.CutPrefix(line, "== "); ok {
			section = s
			continue
		}
		if line == "" {
			continue
		}
		switch section {
		case "dev":
			// "/dev/nvidia3 character special file c3:0" — %t:%T are hex.
			f := strings.Fields(line)
			var major, minor int
			if _, err := fmt.Sscanf(f[len(f)-1], "%x:%x", &major, &minor); err != nil {
				e.t.Fatalf("device line %q: %v", line, err)
			}
			r.devices[f[0]] = fmt.Sprintf("%d:%d", major, minor)
			r.devTypes[f[0]] = strings.Join(f[1:len(f)-1], " ")
		case "env":
			k, v, _ := strings.Cut(line, "=")
			r.env[k] = v
		case "mounts":
			f := strings.Fields(line)
			if len(f) >= 4 {
				r.mounts[f[1]] = f[0] + " " + f[2] + " " + f[3]
			}
		case "mps":
			r.mps = append(r.mps, line)
		case "driver":
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "L" {
				r.links[f[1]] = f[2]
			} else if len(f) == 3 && f[0] == "F" {
				r.files[f[1]] = f[2]
			}
		case "ldconf":
			r.ldconf = append(r.ldconf, line)
		case "ldcache":
			r.ldcache += line
		case "smi":
			r.smi = append(r.smi, line)
		}
	}
	return r
}

// nvidiaEnv returns the variables that a GPU claim can set (CUDA_*, NVIDIA_*).
func (r report) nvidiaEnv() map[string]string {
	out := map[string]string{}
	for k, v := range r.env {
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "NVIDIA_") {
			out[k] = v
		}
	}
	return out
}

// runtimeSpec is the part of the OCI runtime spec that containerd wrote for
// a container, read with `ctr containers info`.
type runtimeSpec struct {
	Process struct {
		Env []string `json:"env"`
	} `json:"process"`
	Mounts []struct {
		Destination string   `json:"destination"`
		Source      string   `json:"source"`
		Options     []string `json:"options"`
	} `json:"mounts"`
	Linux struct {
		Devices []struct {
			Path  string `json:"path"`
			Type  string `json:"type"`
			Major int64  `json:"major"`
			Minor int64  `json:"minor"`
		} `json:"devices"`
	} `json:"linux"`
}

// containerSpec reads the runtime spec of the pod's container from containerd.
func (e *env) containerSpec(pod *corev1.Pod) runtimeSpec {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(p.Status.ContainerStatuses) != 1 {
		e.t.Fatalf("pod %s has %d container statuses", pod.Name, len(p.Status.ContainerStatuses))
	}
	id, ok := strings.CutPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !ok {
		e.t.Fatalf("container ID %q is not containerd's", p.Status.ContainerStatuses[0].ContainerID)
	}
	out, err := e.node.Ctr(e.ctx, "containers", "info", id)
	if err != nil {
		e.t.Fatal(err)
	}
	var info struct {
		Spec runtimeSpec `json:"Spec"`
	}
	if err := json.NewDecoder(bytes.NewReader(out)).Decode(&info); err != nil {
		e.t.Fatalf("decode ctr containers info: %v", err)
	}
	return info.Spec
}

// nvidiaDevices returns the spec's NVIDIA device nodes as path → "major:minor".
func (s runtimeSpec) nvidiaDevices() map[string]string {
	out := map[string]string{}
	for _, d := range s.Linux.Devices {
		if strings.HasPrefix(d.Path, "/dev/nvidia") {
			out[d.Path] = fmt.Sprintf("%d:%d", d.Major, d.Minor)
		}
	}
	return out
}

// deletePod deletes a pod (grace period 1s) and waits until it is gone.
func (e *env) deletePod(pod *corev1.Pod) {
	e.t.Helper()
	start := time.Now()
	defer func() { e.t.Logf("pod %s gone after %s", pod.Name, time.Since(start).Round(10*time.Millisecond)) }()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
		e.t.Fatalf("delete pod %s: %v", pod.Name, err)
	}
	e.waitFor("pod "+pod.Name+" gone", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// claimSpecFiles lists the claims' CDI specs tessera-node has written (not
// the base spec with the driver's common edits, which stays).
func (e *env) claimSpecFiles() []string {
	var out []string
	for _, f := range e.specFiles() {
		if strings.HasPrefix(f, "k8s.gpu.tessera.dev-claim_") {
			out = append(out, f)
		} else if f != "k8s.gpu.tessera.dev-driver.json" {
			e.t.Errorf("unexpected file %s in the CDI directory", f)
		}
	}
	return out
}

// specFiles lists the CDI specs tessera-node has written.
func (e *env) specFiles() []string {
	entries, err := os.ReadDir(e.node.CDIDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		e.t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	sort.Strings(out)
	return out
}

// hasSpec reports whether a CDI spec of the claim is on disk.
func (e *env) hasSpec(claim *resourceapi.ResourceClaim) bool {
	for _, f := range e.specFiles() {
		if strings.Contains(f, string(claim.UID)) {
			return true
		}
	}
	return false
}

// events returns the messages of the pod's events with the given reason.
func (e *env) events(pod *corev1.Pod, reason string) []string {
	e.t.Helper()
	list, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		if ev.Reason == reason {
			out = append(out, fmt.Sprintf("%s (x%d)", ev.Message, max(ev.Count, 1)))
		}
	}
	return out
}

// eventCount is the number of times the pod's events with reason happened.
func (e *env) eventCount(pod *corev1.Pod, reason string) int {
	e.t.Helper()
	list, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.Reason == reason {
			n += int(max(ev.Count, 1))
		}
	}
	return n
}

// equalMaps reports a readable difference between two string maps.
func diffMaps(got, want map[string]string) string {
	var diffs []string
	for k, v := range want {
		if g, ok := got[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("missing %s=%s", k, v))
		} else if g != v {
			diffs = append(diffs, fmt.Sprintf("%s: got %s, want %s", k, g, v))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("unexpected %s=%s", k, v))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// checkpoint returns the claims of tessera-node's checkpoint by UID.
func (e *env) checkpoint() map[types.UID]*checkpoint.Claim {
	e.t.Helper()
	cp, err := checkpoint.Read(filepath.Join(e.node.PluginDir(), "checkpoint.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	if cp == nil {
		return nil
	}
	return cp.Data.Claims
}

// preparedDevices is tessera-node's gauge tessera_draplugin_prepared_devices
// of kind (gpu, mig, shared).
func (e *env) preparedDevices(p *realnode.Plugin, kind string) int {
	e.t.Helper()
	return e.metric(p, `tessera_draplugin_prepared_devices{kind="`+kind+`"}`)
}

// claimOperations is tessera-node's counter of claims prepared or unprepared
// (operation "prepare" or "unprepare") since the instance started.
func (e *env) claimOperations(p *realnode.Plugin, operation string) int {
	e.t.Helper()
	return e.metric(p, `tessera_draplugin_claim_operations_total{operation="`+operation+`"}`)
}

// metric reads one sample ("name{labels}") from the instance's /metrics; 0
// when absent.
func (e *env) metric(p *realnode.Plugin, sample string) int {
	e.t.Helper()
	body, err := p.Metrics(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var n float64
			if _, err := fmt.Sscanf(v, "%g", &n); err != nil {
				e.t.Fatalf("metric line %q: %v", line, err)
			}
			return int(n)
		}
	}
	return 0
}

// sliceDevice returns the named device of the node's ResourceSlices.
func (e *env) sliceDevice(name string) *resourceapi.Device {
	e.t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range list.Items {
		if s.Spec.Pool.Name != e.node.Name() {
			continue
		}
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == name {
				return &s.Spec.Devices[i]
			}
		}
	}
	e.t.Fatalf("device %s is not published by node %s", name, e.node.Name())
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }

// allEvents returns "reason: message" of every event of the pod.
func (e *env) allEvents(pod *corev1.Pod) []string {
	list, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, ev := range list.Items {
		out = append(out, fmt.Sprintf("%s: %s (x%d)", ev.Reason, ev.Message, max(ev.Count, 1)))
	}
	return out
}
