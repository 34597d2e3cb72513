package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestMain runs this package's tests with the shared real control plane; tests
// that do not call framework.Shared never start it.
func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

func applyCRDFile(t *testing.T, cp *framework.ControlPlane, file string) {
	t.Helper()
	if err := cp.InstallCRDFiles(context.Background(), file); err != nil {
		t.Fatal(err)
	}
}

// TestMapLiveAndCoverage maps a live PyTorchJob with `tessera map KIND/NAME`,
// overrides its definition with a WorkloadDefinition object in the cluster (the
// CRD from deployments/crds), and checks `tessera catalog coverage`.
func TestMapLiveAndCoverage(t *testing.T) {
	cp := framework.Shared(t)
	applyCRDFile(t, cp, filepath.Join("..", "..", "deployments", "crds", "catalog.tessera.dev_workloaddefinitions.yaml"))
	applyCRDFile(t, cp, filepath.Join(testdata, "crds", "kubeflow.org_pytorchjobs.yaml"))
	applyCRDFile(t, cp, filepath.Join(testdata, "crds", "grove.io_podcliquesets.yaml"))
	ns := cp.CreateNamespace(t)
	ctx := context.Background()
	dc, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(testdata, "workloads", "PyTorchJob", "training-operator__pytorch_job_mnist_nccl.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := catalog.ParseManifests(data, "job.yaml")
	if err != nil {
		t.Fatal(err)
	}
	job := docs[0].Object
	job.SetNamespace(ns)
	if _, err := dc.Resource(schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"}).Namespace(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	mapLive := func() catalog.Workload {
		t.Helper()
		out, stderr, err := runCLI(t, "", "map", "pytorchjob/"+job.GetName(), "-n", ns, "--kubeconfig", cp.KubeconfigPath, "-o", "json")
		if err != nil {
			t.Fatalf("tessera map: %v\n%s", err, stderr)
		}
		var ws []catalog.Workload
		if err := json.Unmarshal([]byte(out), &ws); err != nil || len(ws) != 1 {
			t.Fatalf("output %q: %v", out, err)
		}
		return ws[0]
	}
	w := mapLive()
	if w.Pods != 2 || w.GPUs != 2 || w.Namespace != ns || w.Definition.Name != "kubeflow-org-pytorchjob-v1" || w.Definition.Source != catalog.SourceBuiltin {
		t.Errorf("live map: %+v", w)
	}

	// GPUs of DRA claims are counted through the live ResourceClaimTemplate.
	rct := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
		"metadata": map[string]any{"name": "two-gpus", "namespace": ns},
		"spec": map[string]any{"spec": map[string]any{"devices": map[string]any{"requests": []any{
			map[string]any{"name": "gpus", "exactly": map[string]any{"deviceClassName": contract.ClassGPU, "count": int64(2)}},
		}}}},
	}}
	if _, err := dc.Resource(schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaimtemplates"}).Namespace(ns).Create(ctx, rct, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaimTemplate: %v", err)
	}
	withClaims := job.DeepCopy()
	withClaims.SetName("with-claims")
	withClaims.SetResourceVersion("")
	_ = unstructured.SetNestedSlice(withClaims.Object, []any{map[string]any{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}},
		"spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "resourceClaims")
	if _, err := dc.Resource(schema.GroupVersionResource{Group: "kubeflow.org", Version: "v1", Resource: "pytorchjobs"}).Namespace(ns).Create(ctx, withClaims, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runCLI(t, "", "map", "pytorchjobs.kubeflow.org/with-claims", "-n", ns, "--kubeconfig", cp.KubeconfigPath, "-o", "json")
	if err != nil {
		t.Fatalf("tessera map: %v\n%s", err, stderr)
	}
	var cw []catalog.Workload
	if err := json.Unmarshal([]byte(out), &cw); err != nil || len(cw) != 1 {
		t.Fatalf("output %q: %v", out, err)
	}
	// Worker: 1 nvidia.com/gpu + 2 devices of the whole-GPU class; master: 1.
	if cw[0].Components[1].GPUsPerPod != 3 || cw[0].GPUs != 4 || len(cw[0].Components[1].UnresolvedClaims) != 0 {
		t.Errorf("with claims: %+v gpus %v", cw[0].Components, cw[0].GPUs)
	}

	// A WorkloadDefinition in the cluster overrides the built-in.
	defData, err := os.ReadFile(filepath.Join(testdata, "workloadmap-definitions", "legacy-resourceinterface", "pytorch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var def map[string]any
	if err := yaml.Unmarshal(defData, &def); err != nil {
		t.Fatal(err)
	}
	wd := &unstructured.Unstructured{Object: def}
	wd.SetAPIVersion("catalog.tessera.dev/v1alpha1")
	wd.SetKind("WorkloadDefinition")
	wd.SetName(framework.UniqueName("team-pytorch"))
	wdr := schema.GroupVersionResource{Group: "catalog.tessera.dev", Version: "v1alpha1", Resource: "workloaddefinitions"}
	if _, err := dc.Resource(wdr).Create(ctx, wd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create WorkloadDefinition: %v", err)
	}
	t.Cleanup(func() { _ = dc.Resource(wdr).Delete(context.Background(), wd.GetName(), metav1.DeleteOptions{}) })
	w = mapLive()
	if w.Definition.Name != wd.GetName() || w.Definition.Source != catalog.SourceCluster || w.Pods != 2 {
		t.Errorf("with a cluster definition: %+v", w.Definition)
	}

	out, stderr, err = runCLI(t, "", "catalog", "coverage", "--kubeconfig", cp.KubeconfigPath)
	if err != nil {
		t.Fatalf("coverage: %v\n%s", err, stderr)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 {
			rows[f[0]+" "+f[1]] = strings.Join(f[2:], " ")
		}
	}
	checks := map[string]string{
		"kubeflow.org/v1 PyTorchJob":                      "overridden (cluster replaces built-in kubeflow-org-pytorchjob-v1) " + wd.GetName(),
		"grove.io/v1alpha1 PodCliqueSet":                  "covered (builtin) grove-io-podcliqueset-v1alpha1",
		"grove.io/v1alpha1 PodClique":                     "no definition -",
		"catalog.tessera.dev/v1alpha1 WorkloadDefinition": "no definition -",
	}
	for k, want := range checks {
		if rows[k] != want {
			t.Errorf("coverage of %s: %q, want %q\n%s", k, rows[k], want, out)
		}
	}
}
