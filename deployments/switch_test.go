package deployments_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/contract"
	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestSwitchingAndBack walks docs/install.md's "Switching step by step, and back" with the
// Helm CLI against a control plane of its own, a simulated kubelet on a simulated DGX H100 and
// the stock kube-scheduler (v1.37.2). After each `helm install`/`helm upgrade` it checks what
// the chart changed on the API server (the scheduler Deployment's flags and replicas, its
// RBAC, the PodDisruptionBudget, the leader-election Role) and runs tessera-scheduler as that
// Deployment would: with the live Deployment's args and its service account. The steps:
//
//  1. install with scheduler.shadow.enabled: a shadow reports on the stock scheduler's pod
//     and writes nothing but its report (its RBAC is read-only, the pod, its claim and the
//     cluster's PodGroups, Leases and Events are untouched);
//  2. upgrade to acting (shadow off): one namespace opts in (team-a's pods name
//     tessera-scheduler), the other (team-b) stays with the stock scheduler;
//  3. all namespaces: team-b's new pods name tessera-scheduler too;
//  4. back: upgrade with scheduler.enabled=false removes the scheduler (Deployment, RBAC,
//     PDB), and the stock scheduler places new pods in both namespaces.
//
// Throughout, every pod started in an earlier step keeps running on its node with its
// claim's devices, and no two pods share a device.
func TestSwitchingAndBack(t *testing.T) {
	helm := helmBinary(t)
	cp := framework.StartForTest(t, framework.Options{})
	c, err := setUpCluster(t, cp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns, release = "tessera-system", "tessera"
	schedulerSA := "system:serviceaccount:" + ns + ":" + release + "-scheduler"
	home := t.TempDir()
	runHelm := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", cp.KubeconfigPath)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	chart := deployments.ChartDir()
	// The scheduler Deployment as Helm left it, run as it would run: its args, its service
	// account.
	runDeployment := func(step string) (*process, *appsv1.Deployment) {
		t.Helper()
		dep, err := c.client.AppsV1().Deployments(ns).Get(ctx, release+"-scheduler", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: scheduler Deployment: %v", step, err)
		}
		kubeconfig := saKubeconfig(t, c, t.TempDir(), ns, release+"-scheduler", nil)
		args := append(append([]string(nil), dep.Spec.Template.Spec.Containers[0].Args...), "--kubeconfig="+kubeconfig, "--metrics-bind-address=127.0.0.1:0")
		return startProcess(t, "tessera-scheduler ("+step+")", binary(t, "tessera-scheduler"), args, nil), dep
	}
	hasArg := func(dep *appsv1.Deployment, arg string) bool {
		return slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, arg)
	}
	exists := func(get func() error) bool {
		err := get()
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	pdbExists := func() bool {
		return exists(func() error {
			_, err := c.client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, release+"-scheduler", metav1.GetOptions{})
			return err
		})
	}
	leaderRoleExists := func() bool {
		return exists(func() error {
			_, err := c.client.RbacV1().Roles(ns).Get(ctx, release+"-scheduler-leader-election", metav1.GetOptions{})
			return err
		})
	}

	// Before: the stock kube-scheduler. Then step 1: the chart in shadow mode.
	stock := startKubeScheduler(t, c)
	runHelm("install", release, chart, "-n", ns, "--create-namespace", "--set", "image.tag=v0.0.0-test",
		"--set", "overview.enabled=false", "--set", "exampleQueues.enabled=true", "--set", "scheduler.shadow.enabled=true")
	for _, team := range []string{"team-a", "team-b"} {
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: team}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: contract.ClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}},
		}}}
		if _, err := c.client.ResourceV1().ResourceClaimTemplates(team).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	nodeName := "dgx-0"
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
	startNode(t, c, ns, release, nodeName, `{partition: {default: {gpus: [{mode: whole}]}}}`, dir)

	type placedPod struct{ ns, where string }
	placed := map[string]placedPod{} // pod → namespace and node/devices when it started
	createPod := func(team, name, scheduler string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"tessera.dev/queue": team}},
			Spec: corev1.PodSpec{SchedulerName: scheduler, RestartPolicy: corev1.RestartPolicyNever,
				NodeSelector:   map[string]string{"kubernetes.io/hostname": nodeName},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}},
				Containers: []corev1.Container{{Name: "cuda", Image: "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04", Command: []string{"sleep", "infinity"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
		if _, err := c.client.CoreV1().Pods(team).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := c.client.CoreV1().Pods(team).Get(ctx, name, metav1.GetOptions{})
			return err == nil && got.Status.Phase == corev1.PodRunning, nil
		}); err != nil {
			dumpScheduling(t, c, team)
			t.Fatalf("pod %s/%s (%s) not running: %v", team, name, scheduler, err)
		}
		placed[name] = placedPod{team, where(ctx, t, c, team, name)}
	}
	// boundBy is the scheduler that bound the pod, from its Scheduled Event.
	boundBy := func(team, name string) string {
		t.Helper()
		events, err := c.client.CoreV1().Events(team).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=Scheduled"})
		if err != nil {
			t.Fatal(err)
		}
		if len(events.Items) == 0 {
			return ""
		}
		if e := events.Items[0]; e.ReportingController != "" {
			return e.ReportingController
		}
		return events.Items[0].Source.Component
	}
	stillRunning := func(step string) {
		t.Helper()
		for name, was := range placed {
			p, err := c.client.CoreV1().Pods(was.ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				t.Errorf("%s: pod %s/%s is not running any more: %v", step, was.ns, name, err)
				continue
			}
			if now := where(ctx, t, c, was.ns, name); now != was.where {
				t.Errorf("%s: pod %s/%s moved from %s to %s", step, was.ns, name, was.where, now)
			}
		}
	}

	createPod("team-a", "stock-before", corev1.DefaultSchedulerName)

	// 1. Shadow: one replica, no leader election, no PDB, read-only RBAC plus its reports.
	shadow, dep := runDeployment("shadow")
	if !hasArg(dep, "--shadow") || !hasArg(dep, "--leader-elect=false") || ptr.Deref(dep.Spec.Replicas, 0) != 1 || pdbExists() || leaderRoleExists() {
		t.Errorf("shadow install: args %v, %d replicas, PDB %t, leader-election Role %t; want --shadow, 1 replica, neither",
			dep.Spec.Template.Spec.Containers[0].Args, ptr.Deref(dep.Spec.Replicas, 0), pdbExists(), leaderRoleExists())
	}
	for _, w := range []struct{ verb, group, resource, ns string }{
		{"create", "", "pods/binding", "team-a"}, {"update", "resource.k8s.io", "resourceclaims/status", "team-a"},
		{"create", "", "pods/eviction", "team-a"}, {"create", "scheduling.tessera.dev", "podgroups", "team-a"},
		{"create", "coordination.k8s.io", "leases", ns}, {"create", "", "events", "team-a"},
		{"update", "", "pods/status", "team-a"},
	} {
		if can(t, c, schedulerSA, w.verb, w.group, w.resource, w.ns, "") {
			t.Errorf("shadow mode: the scheduler may %s %s in %s", w.verb, w.resource, w.ns)
		}
	}
	if !can(t, c, schedulerSA, "create", "scheduling.tessera.dev", "shadowreports", ns, "") {
		t.Error("shadow mode: the scheduler may not write its reports")
	}
	stockPod, err := c.client.CoreV1().Pods("team-a").Get(ctx, "stock-before", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claimName := *stockPod.Status.ResourceClaimStatuses[0].ResourceClaimName
	stockClaim, err := c.client.ResourceV1().ResourceClaims("team-a").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := shadow.running(); err != nil {
			return false, err
		}
		reports, err := shadowreport.Load(ctx, c.dyn, ns)
		if err != nil {
			return false, nil
		}
		for _, r := range reports {
			if r.Gang.Namespace == "team-a" && r.Actual.Bound == 1 && r.Tessera.Decision == shadowv1.DecisionPlaced &&
				len(r.Actual.Pods) == 1 && r.Actual.Pods[0].Node == nodeName && r.Gang.SchedulerName == corev1.DefaultSchedulerName {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no shadow report on the stock scheduler's pod: %v", err)
	}
	time.Sleep(2 * time.Second) // a few more shadow cycles
	if p, err := c.client.CoreV1().Pods("team-a").Get(ctx, "stock-before", metav1.GetOptions{}); err != nil || p.ResourceVersion != stockPod.ResourceVersion {
		t.Errorf("the shadow changed the stock scheduler's pod (resourceVersion %s → %v, %v)", stockPod.ResourceVersion, p.GetResourceVersion(), err)
	}
	if cl, err := c.client.ResourceV1().ResourceClaims("team-a").Get(ctx, claimName, metav1.GetOptions{}); err != nil || cl.ResourceVersion != stockClaim.ResourceVersion {
		t.Errorf("the shadow changed the pod's claim (resourceVersion %s → %v, %v)", stockClaim.ResourceVersion, cl.GetResourceVersion(), err)
	}
	if pgs, err := c.dyn.Resource(podGroupsGVR).Namespace("").List(ctx, metav1.ListOptions{}); err != nil || len(pgs.Items) != 0 {
		t.Errorf("PodGroups after the shadow: %v %v, want none", pgs, err)
	}
	if leases, err := c.client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{}); err != nil || len(leases.Items) != 0 {
		t.Errorf("Leases in %s after the shadow: %v %v, want none", ns, leases, err)
	}
	for _, team := range []string{"team-a", "team-b", ns} {
		events, err := c.client.CoreV1().Events(team).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			if e.ReportingController == "tessera-scheduler" || e.Source.Component == "tessera-scheduler" {
				t.Errorf("the shadow emitted an Event: %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	stillRunning("shadow")

	// 2. One namespace on tessera: the scheduler acts, for pods that name it.
	runHelm("upgrade", release, chart, "-n", ns, "--reuse-values", "--set", "scheduler.shadow.enabled=false")
	if err := shadow.stop(10 * time.Second); err != nil {
		t.Errorf("shadow stop: %v", err)
	}
	sched, dep := runDeployment("acting")
	if hasArg(dep, "--shadow") || !hasArg(dep, "--leader-elect=true") || ptr.Deref(dep.Spec.Replicas, 0) != 2 || !pdbExists() || !leaderRoleExists() {
		t.Errorf("acting upgrade: args %v, %d replicas, PDB %t, leader-election Role %t; want no --shadow, 2 replicas, both",
			dep.Spec.Template.Spec.Containers[0].Args, ptr.Deref(dep.Spec.Replicas, 0), pdbExists(), leaderRoleExists())
	}
	if !can(t, c, schedulerSA, "create", "", "pods/binding", "team-a", "") {
		t.Error("acting: the scheduler may not bind pods")
	}
	createPod("team-a", "tessera-a", v1alpha1.SchedulerName)
	createPod("team-b", "stock-b", corev1.DefaultSchedulerName)
	if by := boundBy("team-a", "tessera-a"); by != v1alpha1.SchedulerName {
		t.Errorf("team-a's pod was bound by %q, want tessera-scheduler", by)
	}
	if by := boundBy("team-b", "stock-b"); by != corev1.DefaultSchedulerName {
		t.Errorf("team-b's pod (not opted in) was bound by %q, want the stock scheduler", by)
	}
	stillRunning("one namespace on tessera")

	// 3. All namespaces: team-b's new pods name tessera-scheduler too.
	createPod("team-b", "tessera-b", v1alpha1.SchedulerName)
	if by := boundBy("team-b", "tessera-b"); by != v1alpha1.SchedulerName {
		t.Errorf("team-b's opted-in pod was bound by %q, want tessera-scheduler", by)
	}
	stillRunning("all namespaces on tessera")

	// 4. Back: the scheduler goes (its Deployment, RBAC and PDB); the node agent stays.
	runHelm("upgrade", release, chart, "-n", ns, "--reuse-values", "--set", "scheduler.enabled=false")
	if err := sched.stop(10 * time.Second); err != nil {
		t.Errorf("tessera-scheduler stop: %v", err)
	}
	waitFor(t, ctx, "the scheduler Deployment deleted", func() bool {
		return !exists(func() error {
			_, err := c.client.AppsV1().Deployments(ns).Get(ctx, release+"-scheduler", metav1.GetOptions{})
			return err
		})
	})
	if pdbExists() || can(t, c, schedulerSA, "create", "", "pods/binding", "team-a", "") {
		t.Errorf("after scheduler.enabled=false: PDB %t, the scheduler's service account may still bind", pdbExists())
	}
	if _, err := c.client.AppsV1().DaemonSets(nodeNamespace(ns)).Get(ctx, release+"-node", metav1.GetOptions{}); err != nil {
		t.Errorf("the node agent's DaemonSet went with the scheduler: %v", err)
	}
	createPod("team-a", "stock-after-a", corev1.DefaultSchedulerName)
	createPod("team-b", "stock-after-b", corev1.DefaultSchedulerName)
	stillRunning("back to the stock scheduler")
	if err := stock.running(); err != nil {
		t.Error(err)
	}
	seen := map[string]string{}
	for name, w := range placed {
		if other, ok := seen[w.where]; ok {
			t.Errorf("pods %s and %s share %s", name, other, w.where)
		}
		seen[w.where] = name
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
