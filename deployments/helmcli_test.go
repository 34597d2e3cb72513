package deployments_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/test/framework"
)

// EnvHelm names the Helm CLI; default bin/helm of the checkout
// (hack/build-helm.sh, `make helm-bin`).
const EnvHelm = "TESSERA_HELM"

func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvHelm); p != "" {
		return p
	}
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the Helm CLI is missing (build it with `make helm-bin` or hack/build-helm.sh, or set %s): %v", EnvHelm, err)
	}
	return p
}

// TestHelmCLIInstallUpgradeUninstall installs the chart with the Helm CLI
// itself (built from the Go module proxy at the version of the Helm library
// the other tests render with) against a fresh API server, upgrades it with
// a changed value and uninstalls it, checking what each step leaves behind.
// The release namespace is created first enforcing Pod Security
// "restricted": every pod of the release is admitted (the scheduler's and
// the overview's there, the node agent's in the node namespace the chart
// creates labelled "privileged"), and uninstall leaves both namespaces.
// Install creates the CRDs from crds/ and every object, with Helm's
// ownership; upgrade rolls the DaemonSet (new template, new revision, its
// pod replaced) and the scheduler's Deployment; uninstall removes every
// object of the release but keeps the CRDs — and with them the Queues users
// made — and the namespace.
func TestHelmCLIInstallUpgradeUninstall(t *testing.T) {
	helm := helmBinary(t)
	// A control plane of its own: the shared one has tessera's CRDs already,
	// and this test is about who creates and keeps them.
	cp := framework.StartForTest(t, framework.Options{})
	client := cp.Client(t)
	ext, err := apiextensionsclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := schedclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns, release = "tessera-system", "tessera"
	nodeNS := nodeNamespace(ns)
	restricted := map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: restricted}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The NVIDIA container toolkit's RuntimeClass, as the GPU operator
	// creates it (the DaemonSet's pods name it), and a GPU node for the
	// DaemonSet (no kubelet: its pods stay Pending, which is all a rollout
	// needs to be seen).
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"}
	if _, err := client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-0", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
	node, err = client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Ready, as its kubelet would report it, and without the not-ready taint
	// the API server puts on a new Node (the node lifecycle controller would
	// lift it; the control plane runs none): DaemonSet pods do not tolerate it.
	node.Spec.Taints = nil
	if node, err = client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	home := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", cp.KubeconfigPath)...)
		// Helm's own state (repositories, cache, plugins) in the test's
		// directory, not the user's.
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	status := func() (revision int, state string) {
		t.Helper()
		var s struct {
			Version int `json:"version"`
			Info    struct {
				Status string `json:"status"`
			} `json:"info"`
		}
		if err := json.Unmarshal([]byte(run("status", release, "-n", ns, "-o", "json")), &s); err != nil {
			t.Fatal(err)
		}
		return s.Version, s.Info.Status
	}
	chart := deployments.ChartDir()
	crdNames := []string{"podgroups.scheduling.tessera.dev", "queues.scheduling.tessera.dev", "workloaddefinitions.catalog.tessera.dev"}

	// install
	out := run("install", release, chart, "-n", ns, "--set", "image.tag=v0.0.0-test")
	if !strings.Contains(out, "STATUS: deployed") || !strings.Contains(out, "schedulerName: tessera-scheduler") {
		t.Errorf("helm install output lacks the status or the chart's notes:\n%s", out)
	}
	if rev, st := status(); rev != 1 || st != "deployed" {
		t.Errorf("after install: revision %d %s", rev, st)
	}
	for _, name := range crdNames {
		if err := framework.WaitCRDEstablished(ctx, ext, name); err != nil {
			t.Errorf("install did not create CRD %s: %v", name, err)
		}
	}
	r, err := deployments.Render(deployments.Options{ReleaseName: release, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicFor(t, cp)
	for _, obj := range r.Objects {
		got, err := dyn.get(ctx, obj)
		if err != nil {
			t.Errorf("after install: %s %s: %v", obj.GetKind(), obj.GetName(), err)
			continue
		}
		if got.GetAnnotations()["meta.helm.sh/release-name"] != release || got.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("%s %s is not owned by the release: labels %v annotations %v", obj.GetKind(), obj.GetName(), got.GetLabels(), got.GetAnnotations())
		}
	}
	dsPods := func() []corev1.Pod {
		pods, err := client.CoreV1().Pods(nodeNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
		if err != nil {
			t.Fatal(err)
		}
		return pods.Items
	}
	if !poll(ctx, func() bool { return len(dsPods()) == 1 }) {
		events, _ := client.CoreV1().Events(nodeNS).List(ctx, metav1.ListOptions{})
		var msgs []string
		for _, e := range events.Items {
			msgs = append(msgs, e.InvolvedObject.Kind+" "+e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
		}
		ds, _ := client.AppsV1().DaemonSets(nodeNS).Get(ctx, "tessera-node", metav1.GetOptions{})
		t.Fatalf("no DaemonSet pod on the GPU node; DaemonSet status %+v; events:\n%s\nkube-controller-manager:\n%s", ds.Status, strings.Join(msgs, "\n"), cp.LogTail("kube-controller-manager", 20))
	}
	firstPod := dsPods()[0]
	// The release namespace enforces "restricted" and admitted the
	// scheduler's and the overview's pods (the ReplicaSet controller's
	// creates go through PodSecurity admission; a refusal leaves no pod and a
	// FailedCreate event).
	for component, want := range map[string]int{"scheduler": 2, "overview": 1} {
		var got []corev1.Pod
		if !poll(ctx, func() bool {
			pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + component})
			got = nil
			if err == nil {
				got = pods.Items
			}
			return len(got) == want
		}) {
			events, _ := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate"})
			var msgs []string
			for _, e := range events.Items {
				msgs = append(msgs, e.InvolvedObject.Name+": "+e.Message)
			}
			t.Errorf("%s: %d pods in the restricted release namespace, want %d; FailedCreate events:\n%s", component, len(got), want, strings.Join(msgs, "\n"))
		}
	}
	if n, err := client.CoreV1().Namespaces().Get(ctx, nodeNS, metav1.GetOptions{}); err != nil || n.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("node namespace %s: %v, labels %v: want the chart's, enforcing privileged", nodeNS, err, n.GetLabels())
	}
	// A user's queue, which must outlive the release.
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}
	if _, err := sched.Queues().Create(ctx, q); err != nil {
		t.Fatal(err)
	}

	// upgrade with a changed value
	run("upgrade", release, chart, "-n", ns, "--reuse-values", "--set", "logVerbosity=4")
	if rev, st := status(); rev != 2 || st != "deployed" {
		t.Errorf("after upgrade: revision %d %s", rev, st)
	}
	ds, err := client.AppsV1().DaemonSets(nodeNS).Get(ctx, "tessera-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Generation != 2 || !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "-v=4") {
		t.Errorf("DaemonSet generation %d args %v: want the new template", ds.Generation, ds.Spec.Template.Spec.Containers[0].Args)
	}
	newest := newestRevision(t, ctx, client, nodeNS, ds)
	waitFor(t, ctx, "the DaemonSet's pod replaced by one of the new revision", func() bool {
		pods := dsPods()
		return len(pods) == 1 && pods[0].UID != firstPod.UID && pods[0].Labels[appsv1.DefaultDaemonSetUniqueLabelKey] == newest
	})
	dep, err := client.AppsV1().Deployments(ns).Get(ctx, "tessera-scheduler", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "-v=4") || dep.Generation != 2 {
		t.Errorf("scheduler Deployment generation %d args %v: want the new template", dep.Generation, dep.Spec.Template.Spec.Containers[0].Args)
	}
	if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":v0.0.0-test") {
		t.Errorf("--reuse-values lost image.tag: %s", img)
	}

	// uninstall
	out = run("uninstall", release, "-n", ns)
	if !strings.Contains(out, "uninstalled") {
		t.Errorf("helm uninstall: %s", out)
	}
	for _, obj := range r.Objects {
		if obj.GetKind() == "Namespace" {
			continue // helm.sh/resource-policy: keep; checked below
		}
		waitFor(t, ctx, obj.GetKind()+" "+obj.GetName()+" deleted", func() bool {
			_, err := dyn.get(ctx, obj)
			return apierrors.IsNotFound(err)
		})
	}
	for _, name := range crdNames {
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("uninstall removed CRD %s (Helm keeps crds/): %v", name, err)
		}
	}
	if _, err := sched.Queues().Get(ctx, "team-a"); err != nil {
		t.Errorf("the user's Queue did not survive the uninstall: %v", err)
	}
	for _, n := range []string{ns, nodeNS} {
		if got, err := client.CoreV1().Namespaces().Get(ctx, n, metav1.GetOptions{}); err != nil || got.DeletionTimestamp != nil {
			t.Errorf("namespace %s: %v (helm uninstall leaves it; the node namespace by helm.sh/resource-policy: keep)", n, err)
		}
	}
	secrets, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"})
	if err != nil || len(secrets.Items) != 0 {
		t.Errorf("release records left: %v %v", secrets, err)
	}
}

// newestRevision is the controller-revision-hash of the DaemonSet's
// current template.
func newestRevision(t *testing.T, ctx context.Context, client kubernetes.Interface, ns string, ds *appsv1.DaemonSet) string {
	t.Helper()
	var hash string
	waitFor(t, ctx, "the DaemonSet's new ControllerRevision", func() bool {
		revs, err := client.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=node"})
		if err != nil || len(revs.Items) < 2 {
			return false
		}
		var best *appsv1.ControllerRevision
		for i := range revs.Items {
			if best == nil || revs.Items[i].Revision > best.Revision {
				best = &revs.Items[i]
			}
		}
		hash = best.Labels[appsv1.DefaultDaemonSetUniqueLabelKey]
		return hash != ""
	})
	return hash
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if !poll(ctx, cond) {
		t.Fatalf("waiting for %s: not within 60s", what)
	}
}

func poll(ctx context.Context, cond func() bool) bool {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	return err == nil
}

// objects gets rendered objects back from the API server.
type objects struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func dynamicFor(t *testing.T, cp *framework.ControlPlane) *objects {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &objects{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

func (o *objects) get(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := o.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameRoot {
		return o.dyn.Resource(m.Resource).Get(ctx, obj.GetName(), metav1.GetOptions{})
	}
	return o.dyn.Resource(m.Resource).Namespace(obj.GetNamespace()).Get(ctx, obj.GetName(), metav1.GetOptions{})
}
