package deployments_test

import (
	"context"
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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestSwitchingAndBack walks docs/install.md's switching steps with the binaries, the chart's
// flags and service accounts and a simulated kubelet: the stock kube-scheduler runs a GPU
// pod; tessera-scheduler in shadow mode reports on it and changes nothing; tessera-scheduler
// acting runs a pod of its own; tessera stops and the kube-scheduler runs a third. The pods
// of every step keep running on their nodes with their claims' devices throughout.
func TestSwitchingAndBack(t *testing.T) {
	c := getCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shadowNS, shadowPrefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}, scheduler: {shadow: {enabled: true}}")
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	r := render(t, ns, "")
	for _, dc := range ofKind(r, "DeviceClass") {
		obj := dc.DeepCopy()
		if _, err := c.resource(t, c.dyn, obj, "").Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, q := range exampleObjects(t)["08-queues.yaml"] {
		if q.GetKind() == "Queue" {
			c.create(t, q, "")
		}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
		Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: contract.ClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}},
	}}}
	if _, err := c.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	nodeName := framework.UniqueName("dgx")
	dir := nodeDir(t)
	kubelet := simkubelet.New(simkubelet.Options{NodeName: nodeName, Client: c.client, RegistryDir: filepath.Join(dir, "reg")})
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := kubelet.Run(ctx); err != nil {
			t.Errorf("simulated kubelet: %v", err)
		}
	})
	defer wg.Wait()
	defer cancel()
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })
	startNode(t, c, ns, prefix, nodeName, `{partition: {default: {gpus: [{mode: whole}]}}}`, dir)

	stock := startKubeScheduler(t, c)
	placed := map[string]string{} // pod → node/devices when it started
	createPod := func(name, scheduler string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tessera.dev/queue": "team-a-experiments"}},
			Spec: corev1.PodSpec{SchedulerName: scheduler, RestartPolicy: corev1.RestartPolicyNever,
				NodeSelector:   map[string]string{"kubernetes.io/hostname": nodeName},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}},
				Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04", Command: []string{"sleep", "infinity"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
		if _, err := c.client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && got.Status.Phase == corev1.PodRunning, nil
		}); err != nil {
			dumpScheduling(t, c, ns)
			t.Fatalf("pod %s (%s) not running: %v", name, scheduler, err)
		}
		placed[name] = where(ctx, t, c, ns, name)
	}
	stillRunning := func(step string) {
		t.Helper()
		for name, was := range placed {
			p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				t.Errorf("%s: pod %s is not running any more: %v", step, name, err)
				continue
			}
			if now := where(ctx, t, c, ns, name); now != was {
				t.Errorf("%s: pod %s moved from %s to %s", step, name, was, now)
			}
		}
	}

	// 1. The stock scheduler alone.
	createPod("stock-before", corev1.DefaultSchedulerName)

	// 2. Shadow: a report about the stock scheduler's pod, nothing changed.
	shadow := startSchedulerWith(t, c, shadowNS, shadowPrefix, ", scheduler: {shadow: {enabled: true}}")
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := shadow.running(); err != nil {
			return false, err
		}
		reports, err := shadowreport.Load(ctx, c.dyn, shadowNS)
		if err != nil {
			return false, nil
		}
		for _, r := range reports {
			if r.Gang.Namespace == ns && r.Actual.Bound == 1 && r.Tessera.Decision != "" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no shadow report on the stock scheduler's pod: %v", err)
	}
	stillRunning("shadow")
	if err := shadow.stop(10 * time.Second); err != nil {
		t.Errorf("shadow stop: %v", err)
	}

	// 3. tessera acting, for the pods that name it.
	sched := startScheduler(t, c, ns, prefix)
	createPod("tessera", "tessera-scheduler")
	stillRunning("tessera acting")

	// Back: tessera stops, the stock scheduler places new pods; everything keeps running.
	if err := sched.stop(10 * time.Second); err != nil {
		t.Errorf("tessera-scheduler stop: %v", err)
	}
	createPod("stock-after", corev1.DefaultSchedulerName)
	stillRunning("back to the stock scheduler")
	if err := stock.running(); err != nil {
		t.Error(err)
	}
	seen := map[string]string{}
	for name, w := range placed {
		if other, ok := seen[w]; ok {
			t.Errorf("pods %s and %s share %s", name, other, w)
		}
		seen[w] = name
	}
}

// where is the pod's node and its claim's devices.
func where(ctx context.Context, t *testing.T, c *cluster, ns, name string) string {
	t.Helper()
	p, err := c.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := p.Spec.NodeName
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			continue
		}
		cl, err := c.client.ResourceV1().ResourceClaims(ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil || cl.Status.Allocation == nil {
			return out + " (claim not allocated)"
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			out += " " + r.Pool + "/" + r.Device
		}
	}
	return out
}

// startKubeScheduler runs the control plane's kube-scheduler (v1.37.2) as the admin.
func startKubeScheduler(t *testing.T, c *cluster) *process {
	t.Helper()
	bin := filepath.Join(c.cp.BinDir, "kube-scheduler")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kube-scheduler: %v", err)
	}
	return startProcess(t, "kube-scheduler", bin, []string{"--kubeconfig=" + c.cp.KubeconfigPath,
		"--authentication-kubeconfig=" + c.cp.KubeconfigPath, "--authorization-kubeconfig=" + c.cp.KubeconfigPath,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0", fmt.Sprintf("--v=%d", 1)}, nil)
}
