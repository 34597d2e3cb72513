package baseline_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/catalog"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/baseline"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// TestCollectAndDiff records a baseline of a real API server, changes the cluster (a second
// GPU allocated, the pending pod bound), records another and checks the diff field by field.
func TestCollectAndDiff(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	cp := framework.Shared(t)
	kube := cp.Client(t)
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.InstallCRDFiles(ctx,
		filepath.Join(root, "deployments", "crds", "scheduling.tessera.dev_queues.yaml"),
		filepath.Join(root, "deployments", "crds", "scheduling.tessera.dev_podgroups.yaml"),
		filepath.Join(root, "deployments", "testdata", "crds", "jobset.x-k8s.io_jobsets.yaml")); err != nil {
		t.Fatal(err)
	}
	sc, err := client.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := sc.Queues().List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	ns := cp.CreateNamespace(t)
	node := framework.UniqueName("n")
	if _, err := kube.CoreV1().Nodes().Create(ctx, func() *v1.Node { n := fixture.Node(node, nil); n.UID = ""; return n }(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	for _, s := range fixture.WholeGPUSlices(node, 2) {
		s.UID = ""
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
	queue := framework.UniqueName("q")
	if _, err := sc.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: queue}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Queues().Delete(context.Background(), queue) })
	allocate(ctx, t, kube, ns, "c0", node, "gpu-0")
	pod := fixture.Pod(ns, "waiting")
	pod.UID = ""
	pod.Spec.SchedulerName = "nobody"
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := baseline.Options{Definition: func(gvk schema.GroupVersionKind) string {
		if d, ok := cat.Definition(gvk); ok {
			return d.Name
		}
		return ""
	}}
	before, err := baseline.Collect(ctx, cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	if tt := before.Totals; tt.GPUNodes != 1 || tt.GPUs != 2 || tt.Allocated != 1 || tt.Utilisation != 0.5 || tt.WholeGPUs != 2 || tt.MIGGPUs != 0 {
		t.Errorf("totals = %+v, want 1 node, 2 whole GPUs, 1 allocated", tt)
	}
	if len(before.Nodes) != 1 || before.Nodes[0].Name != node || before.Nodes[0].Allocatable != 2 || before.Nodes[0].Allocated != 1 {
		t.Errorf("nodes = %+v", before.Nodes)
	}
	if len(before.GPUTypes) != 1 || before.GPUTypes[0].Product != "NVIDIA H100 80GB HBM3" || before.GPUTypes[0].MemoryBytes != 80<<30 || before.GPUTypes[0].Count != 2 {
		t.Errorf("GPU types = %+v, want 2 H100s with 80Gi", before.GPUTypes)
	}
	if p := before.Pending; p.Pods < 1 || p.Wait.Count < 1 {
		t.Errorf("pending = %+v, want the waiting pod", p)
	}
	defs := map[string]string{}
	for _, k := range before.Coverage {
		defs[k.Kind] = k.Definition
	}
	if d, ok := defs["JobSet"]; !ok || d == "" {
		t.Errorf("JobSet coverage = %q (listed %v), want the built-in definition", d, ok)
	}
	if d, ok := defs["Queue"]; !ok || d != "" {
		t.Errorf("Queue coverage = %q (listed %v), want listed without a definition", d, ok)
	}
	found := false
	for _, q := range before.Queues {
		found = found || q.Name == queue
	}
	if !found {
		t.Errorf("queues %+v lack %s", before.Queues, queue)
	}

	allocate(ctx, t, kube, ns, "c1", node, "gpu-1")
	if err := kube.CoreV1().Pods(ns).Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "waiting"}, Target: v1.ObjectReference{Kind: "Node", Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	after, err := baseline.Collect(ctx, cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range baseline.Diff(before, after) {
		got[c.Field] = c.Before + " → " + c.After
	}
	want := map[string]string{
		"totals.allocated": "1 → 2", "totals.utilisation": "0.5 → 1", "nodes[" + node + "].allocated": "1 → 2",
		"pending.pods": "1 → 0",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("diff %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok && k != "pending.wait.count" && k != "pending.wait.p50" && k != "pending.wait.p99" && k != "pending.wait.max" {
			t.Errorf("unexpected change %s: %s", k, got[k])
		}
	}
}

func allocate(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, name, node, device string) {
	t.Helper()
	c := fixture.AllocatedClaim(ns, name, node, device)
	c.UID = ""
	status := c.Status
	created, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = status
	if _, err := kube.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
}
