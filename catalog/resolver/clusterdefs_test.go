package resolver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
	"github.com/tessera-gpu/tessera/test/framework"
)

// workloadDefinition reads an upstream definition file as a WorkloadDefinition
// object named name.
func workloadDefinition(t *testing.T, file, name string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("catalog.tessera.dev/v1alpha1")
	u.SetKind("WorkloadDefinition")
	u.SetName(name)
	return u
}

func accepted(t *testing.T, dc dynamic.Interface, name string) (string, string) {
	t.Helper()
	u, err := dc.Resource(v1alpha1.WorkloadDefinitionsResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", err.Error()
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m := c.(map[string]any)
		if m["type"] == ConditionAccepted {
			return m["status"].(string) + "/" + m["reason"].(string), m["message"].(string)
		}
	}
	return "", ""
}

func waitAccepted(t *testing.T, dc dynamic.Interface, name, want string) string {
	t.Helper()
	var got, msg string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got, msg = accepted(t, dc, name)
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("WorkloadDefinition %s: Accepted %q (%s), want %q", name, got, msg, want)
	}
	return msg
}

// TestClusterDefinitions: the resolver follows WorkloadDefinition objects on a
// real API server: a valid one takes over its kind, an invalid one is reported in
// its status (naming the field and expression), a second one for the same kind
// conflicts until the first is deleted.
func TestClusterDefinitions(t *testing.T) {
	cp := framework.Shared(t)
	installCRDs(t, cp)
	applyCRD(t, cp, filepath.Join("..", "..", "deployments", "crds", "catalog.tessera.dev_workloaddefinitions.yaml"))
	ns := cp.CreateNamespace(t)
	client := cp.Client(t)
	dc, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wdr := dc.Resource(v1alpha1.WorkloadDefinitionsResource)
	create := func(u *unstructured.Unstructured) {
		t.Helper()
		if _, err := wdr.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create WorkloadDefinition %s: %v", u.GetName(), err)
		}
		t.Cleanup(func() { _ = wdr.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
	}
	pytorch := filepath.Join(testdata, "workloadmap-definitions", "legacy-resourceinterface", "pytorch.yaml")
	first := workloadDefinition(t, pytorch, framework.UniqueName("first"))
	create(first)
	bad := workloadDefinition(t, pytorch, framework.UniqueName("bad"))
	if err := unstructured.SetNestedField(bad.Object, "(.x", "spec", "structureDefinition", "rootComponent", "kind", "kind"); err != nil {
		t.Fatal(err)
	}
	children, _, _ := unstructured.NestedSlice(bad.Object, "spec", "structureDefinition", "childComponents")
	_ = unstructured.SetNestedField(children[0].(map[string]any), ".spec | (", "scaleDefinition", "replicasPath")
	_ = unstructured.SetNestedSlice(bad.Object, children, "spec", "structureDefinition", "childComponents")
	create(bad)

	job := createManifest(t, dc, "PyTorchJob/training-operator__simple.yaml", ns,
		schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"})
	p := createPod(t, client, ns, "worker", map[string]string{"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/job-name": job.GetName()},
		ownedBy(job, "kubeflow.org/v1", "PyTorchJob"))

	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewForConfig(ctx, cat, cp.Config, WithClusterDefinitions(nil, true))
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx)
	defer func() { cancel(); r.Shutdown() }()
	if !r.WaitForCacheSync(ctx) {
		t.Fatal("not synced")
	}
	waitAccepted(t, dc, first.GetName(), "True/InForce")
	msg := waitAccepted(t, dc, bad.GetName(), "False/Invalid")
	if !strings.Contains(msg, "childComponents[master].scaleDefinition.replicasPath") || !strings.Contains(msg, `".spec | ("`) {
		t.Errorf("Invalid message does not name the field and expression: %s", msg)
	}
	pw, err := r.Resolve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if d := pw.Workload.Definition; d.Name != first.GetName() || d.Source != catalog.SourceCluster {
		t.Errorf("resolved with %+v, want the cluster definition %s", d, first.GetName())
	}

	// The API server itself rejects a component with two spec forms (CEL rule).
	twoForms := workloadDefinition(t, pytorch, framework.UniqueName("two-forms"))
	kids, _, _ := unstructured.NestedSlice(twoForms.Object, "spec", "structureDefinition", "childComponents")
	_ = unstructured.SetNestedField(kids[0].(map[string]any), ".spec.x", "specDefinition", "podSpecPath")
	_ = unstructured.SetNestedSlice(twoForms.Object, kids, "spec", "structureDefinition", "childComponents")
	if _, err := wdr.Create(ctx, twoForms, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "set exactly one of podTemplateSpecPath, podSpecPath or fragmentedPodSpecDefinition") {
		t.Errorf("WorkloadDefinition with two spec forms: %v", err)
	}

	second := workloadDefinition(t, pytorch, framework.UniqueName("second"))
	create(second)
	waitAccepted(t, dc, second.GetName(), "False/Conflict")
	if err := wdr.Delete(ctx, first.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAccepted(t, dc, second.GetName(), "True/InForce")
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		pw, err := r.Resolve(ctx, p)
		return err == nil && pw.Workload.Definition.Name == second.GetName(), nil
	})
	if err != nil {
		t.Errorf("resolver did not switch to %s: %v", second.GetName(), err)
	}
}
