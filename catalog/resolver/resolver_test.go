package resolver

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

const testdata = "../../test/testdata"

// installCRDs creates the minimal CRDs of test/testdata/crds and waits until
// they are established.
func installCRDs(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(testdata, "crds", "*.yaml"))
	if err := cp.InstallCRDFiles(context.Background(), files...); err != nil {
		t.Fatal(err)
	}
}

// applyCRD creates the CRDs of one file and waits until they are established.
func applyCRD(t *testing.T, cp *framework.ControlPlane, f string) {
	t.Helper()
	if err := cp.InstallCRDFiles(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

// createManifest creates the first workload object of a testdata manifest in ns.
func createManifest(t *testing.T, dc dynamic.Interface, rel, ns string, gvr schema.GroupVersionResource) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testdata, "workloads", rel))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := catalog.ParseManifests(data, rel)
	if err != nil {
		t.Fatal(err)
	}
	u := docs[0].Object
	u.SetNamespace(ns)
	u.SetLabels(map[string]string{"tessera.dev/queue": "team-a"})
	got, err := dc.Resource(gvr).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s: %v", rel, err)
	}
	return got
}

func ownedBy(o metav1.Object, apiVersion, kind string) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: o.GetName(), UID: o.GetUID(), Controller: &yes}}
}

func createPod(t *testing.T, c kubernetes.Interface, ns, name string, labels map[string]string, owners []metav1.OwnerReference) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, OwnerReferences: owners},
		Spec:       corev1.PodSpec{SchedulerName: "tessera-scheduler", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	got, err := c.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return got
}

// countingConfig counts the requests made through the returned config.
func countingConfig(cfg *rest.Config, n *atomic.Int64) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			n.Add(1)
			return rt.RoundTrip(r)
		})
	})
	return c
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestResolveOnAPIServer creates a PyTorchJob and a Grove PodCliqueSet (with its
// PodCliques) on a real API server, pods owned by them with the labels their
// operators set, and checks each pod's workload, component and gang, that
// resolving issues no API request, and the fallbacks.
func TestResolveOnAPIServer(t *testing.T) {
	cp := framework.Shared(t)
	installCRDs(t, cp)
	ns := cp.CreateNamespace(t)
	client := cp.Client(t)
	dc, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	job := createManifest(t, dc, "PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml", ns,
		schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"})
	pcs := createManifest(t, dc, "PodCliqueSet/grove__multi-node-disaggregated.yaml", ns,
		schema.GroupVersionResource{Group: "grove.io", Version: "v1alpha1", Resource: "podcliquesets"})
	clique := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("grove.io/v1alpha1")
		u.SetKind("PodClique")
		u.SetName(name)
		u.SetNamespace(ns)
		u.SetOwnerReferences(ownedBy(pcs, "grove.io/v1alpha1", "PodCliqueSet"))
		got, err := dc.Resource(schema.GroupVersionResource{Group: "grove.io", Version: "v1alpha1", Resource: "podcliques"}).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	pworker := clique("multinode-disaggregated-0-prefill-0-pworker")
	// dleader is in scaling group decode: Grove names its PodClique
	// <set>-<replica>-<group>-<group replica>-<clique>.
	dleader := clique("multinode-disaggregated-0-decode-0-dleader")
	cm, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	kf := func(role string) map[string]string {
		return map[string]string{"training.kubeflow.org/job-name": job.GetName(), "training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": "0"}
	}
	grove := func(clique string) map[string]string {
		return map[string]string{"app.kubernetes.io/part-of": pcs.GetName(), "grove.io/podclique": clique, "grove.io/podcliqueset-replica-index": "0"}
	}
	type want struct {
		kind, name, component, compName, gang string
		min                                   int64
		role                                  catalog.Role
	}
	cases := []struct {
		pod  *corev1.Pod
		want want
	}{
		{createPod(t, client, ns, "master-0", kf("master"), ownedBy(job, "kubeflow.org/v1", "PyTorchJob")),
			want{"PyTorchJob", job.GetName(), "master", "master", "job", 2, catalog.RoleLeader}},
		{createPod(t, client, ns, "worker-0", kf("worker"), ownedBy(job, "kubeflow.org/v1", "PyTorchJob")),
			want{"PyTorchJob", job.GetName(), "worker", "worker", "job", 2, catalog.RoleWorker}},
		// Pod -> PodClique (an intermediate kind) -> PodCliqueSet; gang per set replica.
		{createPod(t, client, ns, "pworker-0", grove(pworker.GetName()), ownedBy(pworker, "grove.io/v1alpha1", "PodClique")),
			want{"PodCliqueSet", pcs.GetName(), "clique", "prefill-0-pworker", "replica-0", 8, catalog.RoleWorker}},
		{createPod(t, client, ns, "dleader-0", grove(dleader.GetName()), ownedBy(dleader, "grove.io/v1alpha1", "PodClique")),
			want{"PodCliqueSet", pcs.GetName(), "clique", "decode-0-dleader", "replica-0", 8, catalog.RoleLeader}},
	}
	bare := createPod(t, client, ns, "bare", nil, nil)
	orphan := createPod(t, client, ns, "orphan", nil, ownedBy(cm, "v1", "ConfigMap"))

	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int64
	r, err := NewForConfig(ctx, cat, countingConfig(cp.Config, &requests))
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx)
	defer func() { cancel(); r.Shutdown() }()
	if !r.WaitForCacheSync(ctx) {
		t.Fatal("caches did not sync")
	}
	// Kinds only walked through are cached as metadata, mapped kinds whole.
	for gvk, whole := range map[schema.GroupVersionKind]bool{
		{Group: "grove.io", Version: "v1alpha1", Kind: "PodClique"}:    false,
		{Group: "apps", Version: "v1", Kind: "ReplicaSet"}:             false,
		{Version: "v1", Kind: "Pod"}:                                   false,
		{Group: "grove.io", Version: "v1alpha1", Kind: "PodCliqueSet"}: true,
		{Group: "kubeflow.org", Version: "v1", Kind: "PyTorchJob"}:     true,
		{Group: "apps", Version: "v1", Kind: "StatefulSet"}:            true,
	} {
		if _, full, ok := r.getter(gvk); !ok || full != whole {
			t.Errorf("%s: watched %v, whole objects %v, want %v", gvk, ok, full, whole)
		}
	}
	// Every owner was created before the informers listed: all are cached now.
	before := requests.Load()
	for _, tc := range cases {
		pw, err := r.Resolve(ctx, tc.pod)
		if err != nil {
			t.Fatalf("pod %s: %v", tc.pod.Name, err)
		}
		gang := ""
		var min int64
		if pw.Gang != nil {
			gang, min = pw.Gang.Name, pw.Gang.MinMember
		}
		got := want{pw.GVK.Kind, pw.Name, pw.Component, pw.ComponentName, gang, min, pw.Role}
		if got != tc.want {
			t.Errorf("pod %s: got %+v, want %+v", tc.pod.Name, got, tc.want)
		}
		if pw.Labels["tessera.dev/queue"] != "team-a" && pw.GVK.Kind == "PyTorchJob" {
			t.Errorf("pod %s: workload labels %v, want the job's tessera.dev/queue", tc.pod.Name, pw.Labels)
		}
		if pw.Namespace != ns || pw.UID == "" || pw.Workload == nil || pw.Workload.Definition.Source != catalog.SourceBuiltin {
			t.Errorf("pod %s: workload %s/%s uid %q model %v", tc.pod.Name, pw.Namespace, pw.Name, pw.UID, pw.Workload)
		}
	}
	// Both PyTorchJob pods are in the same gang; both Grove pods in another.
	a, _ := r.Resolve(ctx, cases[0].pod)
	b, _ := r.Resolve(ctx, cases[1].pod)
	c, _ := r.Resolve(ctx, cases[2].pod)
	if a.GangKey() != b.GangKey() || a.GangKey() == c.GangKey() {
		t.Errorf("gang keys %q %q %q", a.GangKey(), b.GangKey(), c.GangKey())
	}

	// A bare pod is a workload of its own, in no gang.
	pw, err := r.Resolve(ctx, bare)
	if err != nil || pw.GVK.Kind != "Pod" || pw.Gang != nil || pw.Workload.Pods != 1 {
		t.Errorf("bare pod: %+v, %v", pw, err)
	}
	// A pod owned by a kind without definition: ErrUnknownOwner, and the fallback.
	_, err = r.Resolve(ctx, orphan)
	if !errors.Is(err, ErrUnknownOwner) {
		t.Errorf("pod owned by a ConfigMap: %v, want ErrUnknownOwner", err)
	} else if fb := SinglePod(orphan, err.Error()); fb.Gang.MinMember != 1 || fb.FallbackReason == "" {
		t.Errorf("fallback %+v", fb)
	}
	if n := requests.Load() - before; n != 0 {
		t.Errorf("resolving made %d API requests; it must read only the informer caches", n)
	}

	// Concurrent lookups (the scheduler resolves from several workers).
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, tc := range cases {
				if _, err := r.Resolve(ctx, tc.pod); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()

	// An owner the cache does not have (deleted, or not yet seen): ErrOwnerNotFound.
	ghost := cases[0].pod.DeepCopy()
	ghost.OwnerReferences[0].Name, ghost.OwnerReferences[0].UID = "ghost", "0000"
	if _, err := r.Resolve(ctx, ghost); !errors.Is(err, ErrOwnerNotFound) {
		t.Errorf("missing owner: %v, want ErrOwnerNotFound", err)
	}
	// Scaling the job is seen through the informer: the next resolve re-maps it.
	patch := []byte(`{"spec":{"pytorchReplicaSpecs":{"Worker":{"replicas":3}}}}`)
	if _, err := dc.Resource(schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"}).Namespace(ns).Patch(ctx, job.GetName(), "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		pw, err := r.Resolve(ctx, cases[1].pod)
		return err == nil && pw.Gang.MinMember == 4, nil
	})
	if err != nil {
		t.Errorf("gang did not grow to 4 after scaling the job: %v", err)
	}
}
