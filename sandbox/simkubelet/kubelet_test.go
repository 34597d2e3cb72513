package simkubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// recordingPlugin is a DRA driver served through the upstream kubeletplugin
// helper, so the simulated kubelet talks to real registration and DRA sockets.
type recordingPlugin struct {
	mu         sync.Mutex
	prepared   map[types.UID]int
	unprepared map[types.UID]int
	attempts   map[types.UID]int // prepare calls, failed ones included
	failClaim  string            // prepare of a claim with this name fails
	// failUnprepare makes every unprepare fail (a plugin that is down).
	failUnprepare bool
}

func (p *recordingPlugin) setFailUnprepare(fail bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failUnprepare = fail
}

func (p *recordingPlugin) setFailClaim(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failClaim = name
}

func (p *recordingPlugin) attemptsOf(uid types.UID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attempts[uid]
}

func (p *recordingPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		if p.attempts != nil {
			p.attempts[c.UID]++
		}
		if c.Name == p.failClaim {
			out[c.UID] = kubeletplugin.PrepareResult{Err: errors.New("device gpu-0 is broken")}
			continue
		}
		p.prepared[c.UID]++
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			devs = append(devs, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				CDIDeviceIDs: []string{"test.example.com/gpu=" + string(c.UID) + "-" + r.Device},
			})
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p *recordingPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]error{}
	if p.failUnprepare {
		return nil, errors.New("plugin unavailable")
	}
	for _, c := range claims {
		p.unprepared[c.UID]++
		out[c.UID] = nil
	}
	return out, nil
}

func (p *recordingPlugin) HandleError(context.Context, error, string) {}

// WatchHealthStatus reports nothing: the simulated kubelet does not use health.
func (p *recordingPlugin) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func (p *recordingPlugin) counts(uid types.UID) (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepared[uid], p.unprepared[uid]
}

const driver = "sim.test.tessera.dev"

func startNode(t *testing.T, ctx context.Context, client kubernetes.Interface, node string, plugin *recordingPlugin) *Kubelet {
	t.Helper()
	registry := startPlugin(t, ctx, client, node, plugin)
	k, _ := startKubelet(t, ctx, client, Options{NodeName: node, Client: client, RegistryDir: registry})
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	return k
}

// startPlugin serves plugin through the upstream helper and returns its
// registry directory.
func startPlugin(t *testing.T, ctx context.Context, client kubernetes.Interface, node string, plugin *recordingPlugin) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "simkubelet") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	registry := filepath.Join(dir, "registry")
	pluginDir := filepath.Join(dir, "plugin")
	for _, d := range []string{registry, pluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(driver), kubeletplugin.KubeClient(client), kubeletplugin.NodeName(node),
		kubeletplugin.RegistrarDirectoryPath(registry), kubeletplugin.PluginDataDirectoryPath(pluginDir))
	if err != nil {
		t.Fatalf("start test DRA plugin: %v", err)
	}
	t.Cleanup(helper.Stop)
	return registry
}

// TestFollowsRollingUpdate: as the real kubelet (test/e2e/realnode
// TestRollingUpgrade), a second instance of the driver registered during a
// rolling update gets the new calls, and after the first one is gone it
// unprepares the claim the first one prepared.
func TestFollowsRollingUpdate(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("sim-node")
	dir, err := os.MkdirTemp("", "simkubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	registry, pluginDir := filepath.Join(dir, "registry"), filepath.Join(dir, "plugin")
	for _, d := range []string{registry, pluginDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := func(uid types.UID, p *recordingPlugin) *kubeletplugin.Helper {
		h, err := kubeletplugin.Start(ctx, p,
			kubeletplugin.DriverName(driver), kubeletplugin.KubeClient(client), kubeletplugin.NodeName(node),
			kubeletplugin.RegistrarDirectoryPath(registry), kubeletplugin.PluginDataDirectoryPath(pluginDir),
			kubeletplugin.RollingUpdate(uid))
		if err != nil {
			t.Fatalf("start plugin instance %s: %v", uid, err)
		}
		t.Cleanup(h.Stop)
		return h
	}
	oldPlugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}}
	newPlugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}}
	oldHelper := start("uid-old", oldPlugin)
	startKubelet(t, ctx, client, Options{NodeName: node, Client: client, RegistryDir: registry})
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })

	first, firstClaim := runOnNode(t, ctx, client, ns, node, "first", "first-gpu")
	waitPhase(t, ctx, client, first, corev1.PodRunning)
	start("uid-new", newPlugin)
	second, secondClaim := runOnNode(t, ctx, client, ns, node, "second", "second-gpu")
	waitPhase(t, ctx, client, second, corev1.PodRunning)
	if p, _ := newPlugin.counts(secondClaim.UID); p != 1 {
		t.Errorf("the newer instance prepared the second claim %d times, want 1", p)
	}
	oldHelper.Stop()
	if err := client.CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = Wait(ctx, 30*time.Second, func(context.Context) (bool, error) {
		_, u := newPlugin.counts(firstClaim.UID)
		return u == 1, nil
	})
	if err != nil {
		t.Fatalf("the newer instance did not unprepare the first claim")
	}
	if p, _ := oldPlugin.counts(firstClaim.UID); p != 1 {
		t.Errorf("the old instance prepared the first claim %d times, want 1", p)
	}
}

// startKubelet runs a simulated kubelet until the test ends or stop is called.
func startKubelet(t *testing.T, ctx context.Context, client kubernetes.Interface, opts Options) (*Kubelet, func()) {
	t.Helper()
	k := New(opts)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(runCtx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("kubelet Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return k, stop
}

// allocatedClaim creates a claim and writes an allocation reserved for podUID,
// as a scheduler would.
func allocatedClaim(t *testing.T, ctx context.Context, client kubernetes.Interface, ns, name, node string) *resourceapi.ResourceClaim {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "sim-gpu"},
		}}}},
	}
	claim, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim: %v", err)
	}
	return claim
}

func reserve(t *testing.T, ctx context.Context, client kubernetes.Interface, claim *resourceapi.ResourceClaim, node string, pod *corev1.Pod) {
	t.Helper()
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driver, Pool: node, Device: "gpu-0",
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim: %v", err)
	}
}

func podWithClaim(ns, name, claim string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "main", Image: "example.com/train:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
		},
	}
}

func bind(t *testing.T, ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, node string) {
	t.Helper()
	err := client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bind %s: %v", pod.Name, err)
	}
}

func waitPhase(t *testing.T, ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	err := Wait(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = p
		return p.Status.Phase == phase, nil
	})
	if err != nil {
		t.Fatalf("pod %s did not reach %s (phase %q, message %q): %v", pod.Name, phase, got.Status.Phase, got.Status.Message, err)
	}
	return got
}

func TestPrepareRunCompleteUnprepare(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("sim-node")
	plugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}}
	k := startNode(t, ctx, client, node, plugin)

	pod, claim := runOnNode(t, ctx, client, ns, node, "train-0", "train-0-gpu")

	running := waitPhase(t, ctx, client, pod, corev1.PodRunning)
	if running.Status.StartTime == nil || len(running.Status.ContainerStatuses) != 1 || running.Status.ContainerStatuses[0].State.Running == nil {
		t.Errorf("running pod status incomplete: %+v", running.Status)
	}
	// Without a duration the pod runs until told otherwise; give it one that
	// has already passed, and it completes.
	patch := []byte(`{"metadata":{"annotations":{"` + AnnotationDuration + `":"1ms"}}}`)
	if _, err := client.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, ctx, client, pod, corev1.PodSucceeded)
	err := Wait(ctx, 10*time.Second, func(context.Context) (bool, error) {
		_, u := plugin.counts(claim.UID)
		return u == 1, nil
	})
	if err != nil {
		t.Fatalf("claim not unprepared after the pod succeeded")
	}
	if p, u := plugin.counts(claim.UID); p != 1 || u != 1 {
		t.Errorf("plugin saw %d prepares and %d unprepares, want 1 and 1", p, u)
	}
	calls := k.Ledger().Calls()
	if len(calls) != 2 || calls[0].Unprepare || !calls[1].Unprepare {
		t.Fatalf("ledger = %+v, want one prepare then one unprepare", calls)
	}
	if want := fmt.Sprintf("test.example.com/gpu=%s-gpu-0", claim.UID); len(calls[0].CDIDevice) != 1 || calls[0].CDIDevice[0] != want {
		t.Errorf("CDI IDs %v, want [%s]", calls[0].CDIDevice, want)
	}
	if out := k.Ledger().Outstanding(); len(out) != 0 {
		t.Errorf("outstanding claims: %+v", out)
	}
}

// TestPluginErrorKeepsPodPendingAndDeletionUnprepares: as the real kubelet
// (test/e2e/realnode TestPrepareErrorRetried), a failed prepare leaves the pod
// Pending with a FailedPrepareDynamicResources event carrying the plugin's
// error, and is retried until it succeeds; a graceful deletion completes
// after the claim is unprepared.
func TestPluginErrorKeepsPodPendingAndDeletionUnprepares(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("sim-node")
	plugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}, attempts: map[types.UID]int{}, failClaim: "bad-gpu"}
	startNode(t, ctx, client, node, plugin)

	badPod, bad := runOnNode(t, ctx, client, ns, node, "bad", "bad-gpu")
	var events []string
	err := Wait(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(badPod.UID)})
		if err != nil {
			return false, err
		}
		events = nil
		for _, ev := range list.Items {
			if ev.Reason == EventFailedPrepare {
				events = append(events, ev.Message)
			}
		}
		return len(events) > 0 && plugin.attemptsOf(bad.UID) >= 3, nil
	})
	if err != nil {
		t.Fatalf("no retried prepare with a %s event (attempts %d, events %q): %v", EventFailedPrepare, plugin.attemptsOf(bad.UID), events, err)
	}
	want := "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for ResourceClaim bad-gpu: device gpu-0 is broken"
	if events[0] != want {
		t.Errorf("event %q, want the kubelet's %q", events[0], want)
	}
	if p, err := client.CoreV1().Pods(ns).Get(ctx, badPod.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
		t.Errorf("pod after failed prepares: %v %v, want Pending", p.Status.Phase, err)
	}
	plugin.setFailClaim("")
	waitPhase(t, ctx, client, badPod, corev1.PodRunning)

	goodPod, good := runOnNode(t, ctx, client, ns, node, "forever", "good-gpu")
	waitPhase(t, ctx, client, goodPod, corev1.PodRunning)
	if err := client.CoreV1().Pods(ns).Delete(ctx, goodPod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A graceful deletion completes only when the kubelet confirms it.
	err = Wait(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, goodPod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod deletion not finished by the simulated kubelet: %v", err)
	}
	if p, u := plugin.counts(good.UID); p != 1 || u != 1 {
		t.Errorf("deleted pod's claim: %d prepares and %d unprepares, want 1 and 1", p, u)
	}
}

// TestRestartWithStateFile: as the real kubelet with its DRA checkpoint
// (test/e2e/realnode TestKubeletRestart), a simulated kubelet restarted on
// its StateFile does not prepare a running pod's claim again, and unprepares
// it when the pod is deleted.
func TestRestartWithStateFile(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("sim-node")
	plugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}, attempts: map[types.UID]int{}}
	registry := startPlugin(t, ctx, client, node, plugin)
	opts := Options{NodeName: node, Client: client, RegistryDir: registry, StateFile: filepath.Join(t.TempDir(), "dra_state.json")}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	_, stop := startKubelet(t, ctx, client, opts)

	pod, claim := runOnNode(t, ctx, client, ns, node, "long", "long-gpu")
	waitPhase(t, ctx, client, pod, corev1.PodRunning)
	stop()
	restarted, _ := startKubelet(t, ctx, client, opts)
	// Touch the pod so that the restarted kubelet syncs it for sure.
	patch := []byte(`{"metadata":{"labels":{"touched":"yes"}}}`)
	if _, err := client.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n := plugin.attemptsOf(claim.UID); n != 1 {
		t.Errorf("prepare calls after the restart: %d, want 1 (no second prepare)", n)
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := Wait(ctx, 30*time.Second, func(context.Context) (bool, error) {
		_, u := plugin.counts(claim.UID)
		return u == 1, nil
	})
	if err != nil {
		t.Fatalf("claim not unprepared by the restarted kubelet (ledger %+v)", restarted.Ledger().Calls())
	}
}

// runOnNode creates a pod with an allocated claim, reserves the claim for it
// and binds it to node, as a scheduler would.
func runOnNode(t *testing.T, ctx context.Context, client kubernetes.Interface, ns, node, podName, claimName string) (*corev1.Pod, *resourceapi.ResourceClaim) {
	t.Helper()
	claim := allocatedClaim(t, ctx, client, ns, claimName, node)
	pod, err := client.CoreV1().Pods(ns).Create(ctx, podWithClaim(ns, podName, claim.Name, nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reserve(t, ctx, client, claim, node, pod)
	bind(t, ctx, client, pod, node)
	return pod, claim
}

// TestDeletedPodUnpreparedOncePluginAnswers: a pod whose object goes while
// its plugin cannot unprepare (killed, restarting) has its claims
// unprepared once the plugin answers again, as the real kubelet retries.
// Found by the chaos run: the deleted pod's unprepare was tried once, and the
// claim stayed prepared in the plugin's checkpoint for ever.
func TestDeletedPodUnpreparedOncePluginAnswers(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("sim-node")
	plugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}, attempts: map[types.UID]int{}}
	startNode(t, ctx, client, node, plugin)

	pod, claim := runOnNode(t, ctx, client, ns, node, "doomed", "doomed-gpu")
	waitPhase(t, ctx, client, pod, corev1.PodRunning)
	plugin.setFailUnprepare(true)
	// Gone at once, as a terminal pod is on deletion.
	if err := client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the kubelet sees the deletion and fails to unprepare
	if _, u := plugin.counts(claim.UID); u != 0 {
		t.Fatalf("unprepared %d times while the plugin fails", u)
	}
	plugin.setFailUnprepare(false)
	err := Wait(ctx, 60*time.Second, func(context.Context) (bool, error) {
		_, u := plugin.counts(claim.UID)
		return u == 1, nil
	})
	if err != nil {
		t.Fatal("the deleted pod's claim was not unprepared once the plugin answered again")
	}
}

// TestRestartUnpreparesPodsDeletedMeanwhile: a kubelet restarted on its
// StateFile unprepares the claims of pods deleted while it was down (the
// real kubelet's DRA manager reconciles its checkpoint with the active pods).
func TestRestartUnpreparesPodsDeletedMeanwhile(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("sim-node")
	plugin := &recordingPlugin{prepared: map[types.UID]int{}, unprepared: map[types.UID]int{}, attempts: map[types.UID]int{}}
	registry := startPlugin(t, ctx, client, node, plugin)
	opts := Options{NodeName: node, Client: client, RegistryDir: registry, StateFile: filepath.Join(t.TempDir(), "dra_state.json")}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	_, stop := startKubelet(t, ctx, client, opts)
	pod, claim := runOnNode(t, ctx, client, ns, node, "while-down", "while-down-gpu")
	waitPhase(t, ctx, client, pod, corev1.PodRunning)
	stop()
	if err := client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	startKubelet(t, ctx, client, opts)
	err := Wait(ctx, 30*time.Second, func(context.Context) (bool, error) {
		_, u := plugin.counts(claim.UID)
		return u == 1, nil
	})
	if err != nil {
		t.Fatal("the claim of a pod deleted while the kubelet was down was not unprepared after its restart")
	}
}

// TestConcurrentStateSavesKeepTheNewest: saves from several workers at once
// leave the newest state in the file. Found by the chaos run ("rename
// ….tmp: no such file or directory"): concurrent saves shared one temporary
// file, and an older snapshot could be written over a newer one.
func TestConcurrentStateSavesKeepTheNewest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	k := New(Options{NodeName: "n", StateFile: path})
	ctx := context.Background()
	for round := range 50 {
		var wg sync.WaitGroup
		for i := range 8 {
			uid := types.UID(fmt.Sprintf("pod-%d-%d", round, i))
			wg.Go(func() {
				k.mu.Lock()
				k.state[uid] = &podState{prepared: true, claims: map[string][]*drapb.Claim{driver: {{Namespace: "ns", Name: string(uid), Uid: string(uid)}}}}
				k.mu.Unlock()
				k.saveState(ctx)
			})
		}
		wg.Wait()
		reloaded := New(Options{NodeName: "n", StateFile: path})
		if err := reloaded.loadState(); err != nil {
			t.Fatal(err)
		}
		if got, want := len(reloaded.state), 8*(round+1); got != want {
			t.Fatalf("round %d: the state file has %d pods, want %d", round, got, want)
		}
	}
}
