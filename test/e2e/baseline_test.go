package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/controlplane/baseline"
	"github.com/tessera-gpu/tessera/sandbox"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestBaselineAroundDemo is the evaluation checklist's "baseline before, baseline after" on
// the sandbox, with the CLI: `tessera report baseline --save before.json` on the idle
// sandbox; then, while the demo scenario runs (`make demo`'s, run times divided by 9), a
// second `tessera report baseline --window 10m --interval 500ms --save after.json` samples
// the cluster and is interrupted once both training jobs completed (serve-b and the notebooks
// still running), which ends its window there. Beside the demo, a team installs an operator's
// CRD that no catalog definition maps and one pod of one of its objects. `tessera report diff
// before.json after.json -o json` is then asserted field by field: exactly the fields that
// changed, with their values; the fields that did not change are checked in both reports.
func TestBaselineAroundDemo(t *testing.T) {
	if _, err := framework.BinDir(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var narration bytes.Buffer
	s, err := sandbox.Start(ctx, sandbox.Options{StateDir: shortTempDir(t), Out: &narration, Scenario: "demo", Speed: 9})
	if err != nil {
		t.Fatalf("start sandbox: %v\n%s", err, narration.String())
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop sandbox: %v", err)
		}
	}()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := framework.WriteKubeconfig(s.Config(), kubeconfig); err != nil {
		t.Fatal(err)
	}
	beforePath, afterPath := filepath.Join(dir, "before.json"), filepath.Join(dir, "after.json")

	runCLI(t, "report", "baseline", "--kubeconfig", kubeconfig, "--save", beforePath, "-o", "json")

	// The operator a team installs during the evaluation: a CRD without a definition, and a
	// pod of one of its objects for tessera-scheduler, which its catalog cannot map.
	const crdGroup, crdKind = "evaluation.example.com", "Trainer"
	ext := apiextclient.NewForConfigOrDie(s.Config())
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "trainers." + crdGroup},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: crdGroup, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "trainers", Singular: "trainer", Kind: crdKind, ListKind: crdKind + "List"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTo(true)}}}}},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := framework.WaitCRDEstablished(ctx, ext, crd.Name); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(s.Config())
	trainer := &unstructured.Unstructured{Object: map[string]any{"apiVersion": crdGroup + "/v1", "kind": crdKind,
		"metadata": map[string]any{"name": "tune", "namespace": "team-a"}, "spec": map[string]any{"workers": int64(1)}}}
	trainer, err = dyn.Resource(schema.GroupVersionResource{Group: crdGroup, Version: "v1", Resource: "trainers"}).Namespace("team-a").Create(ctx, trainer, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(s.Config())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tune-worker-0", Namespace: "team-a", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: crdGroup + "/v1", Kind: crdKind, Name: trainer.GetName(), UID: trainer.GetUID(), Controller: ptrTo(true)}}},
		Spec: corev1.PodSpec{SchedulerName: "tessera-scheduler", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if _, err := kube.CoreV1().Pods("team-a").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The second baseline samples while the demo runs, until it is interrupted.
	var afterOut, afterErr bytes.Buffer
	after := exec.CommandContext(ctx, buildCLI(t), "report", "baseline", "--kubeconfig", kubeconfig,
		"--window", "10m", "--interval", "500ms", "--save", afterPath, "-o", "json")
	after.Stdout, after.Stderr = &afterOut, &afterErr
	if err := after.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = after.Process.Kill() }()
	var res sandbox.DemoResult
	res, err = s.RunDemoWith(ctx, sandbox.DemoOptions{BeforeCleanup: func(ctx context.Context) error {
		// The training pods completed; their claims are released a moment later (the
		// resourceclaim controller). The scenario has settled when only the 5 claims of
		// serve-b and the notebooks remain allocated.
		allocated := 0
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			claims, err := kube.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			allocated = 0
			for _, c := range claims.Items {
				if c.Status.Allocation != nil {
					allocated++
				}
			}
			return allocated == 5, nil
		}); err != nil {
			return fmt.Errorf("%d claims allocated, want serve-b's and the notebooks' 5: %w", allocated, err)
		}
		if err := after.Process.Signal(syscall.SIGINT); err != nil {
			return err
		}
		if err := after.Wait(); err != nil {
			return fmt.Errorf("tessera report baseline (interrupted): %w\n%s", err, afterErr.String())
		}
		return nil
	}})
	if err != nil || !res.OK() {
		t.Fatalf("demo: %v %s\nnarration:\n%s", err, res.Problems(), narration.String())
	}

	// The saved reports, as diff reads them, and the diff the CLI prints.
	before, afterReport := readBaseline(t, beforePath), readBaseline(t, afterPath)
	if afterReport.WindowSeconds < 2 || afterReport.WindowSeconds > 300 {
		t.Errorf("after: window %gs, want the time until the interrupt", afterReport.WindowSeconds)
	}
	var printed baseline.Report
	if err := json.Unmarshal(afterOut.Bytes(), &printed); err != nil || printed.Totals != afterReport.Totals {
		t.Errorf("the interrupted baseline printed %v (%v), not the saved report", printed.Totals, err)
	}
	var changes []baseline.Change
	if err := json.Unmarshal([]byte(runCLI(t, "report", "diff", beforePath, afterPath, "-o", "json")), &changes); err != nil {
		t.Fatal(err)
	}
	got := map[string]baseline.Change{}
	for _, c := range changes {
		got[c.Field] = c
	}
	table := runCLI(t, "report", "diff", beforePath, afterPath)

	// Unchanged: 4 DGX H100 nodes, 32 GPUs (gpu-node-3: 4 dynamic-MIG, 4 shared), the
	// queues' quotas and limits.
	for name, r := range map[string]baseline.Report{"before": before, "after": afterReport} {
		tot := r.Totals
		if tot.GPUNodes != 4 || tot.GPUs != 32 || tot.WholeGPUs != 24 || tot.MIGGPUs != 4 || tot.SharedGPUs != 4 {
			t.Errorf("%s: totals %+v, want 4 nodes, 32 GPUs: 24 whole, 4 MIG, 4 shared", name, tot)
		}
		// As the node agent publishes them: a shared GPU offers its memory less the
		// partition's reserve, in whole memory steps (81408 of 81559 MiB).
		const h100 = "NVIDIA H100 80GB HBM3"
		if len(r.GPUTypes) != 2 || r.GPUTypes[0] != (baseline.GPUType{Product: h100, MemoryBytes: 81408 << 20, Count: 4}) ||
			r.GPUTypes[1] != (baseline.GPUType{Product: h100, MemoryBytes: 81559 << 20, Count: 28}) {
			t.Errorf("%s: GPU types %+v, want 28 %s of 81559 MiB and the 4 shared ones of 81408 MiB", name, r.GPUTypes, h100)
		}
		if len(r.Nodes) != 4 {
			t.Fatalf("%s: nodes %+v", name, r.Nodes)
		}
		for i, n := range r.Nodes {
			mig, shared := 0, 0
			if i == 3 {
				mig, shared = 4, 4
			}
			if n.Name != fmt.Sprintf("gpu-node-%d", i) || n.GPUs != 8 || n.Allocatable != 8 || n.MIGGPUs != mig || n.SharedGPUs != shared {
				t.Errorf("%s: node %+v", name, n)
			}
		}
		quotas := map[string][2]float64{"research": {24, 24}, "team-a": {16, 24}, "team-b": {8, 24}}
		for _, q := range r.Queues {
			want, ok := quotas[q.Name]
			if !ok || q.Quota == nil || q.Limit == nil || *q.Quota != want[0] || *q.Limit != want[1] {
				t.Errorf("%s: queue %s quota %v limit %v, want %v", name, q.Name, q.Quota, q.Limit, want)
			}
			delete(quotas, q.Name)
		}
		if len(quotas) != 0 {
			t.Errorf("%s: queues missing: %v", name, quotas)
		}
		covered := map[string]string{}
		for _, k := range r.Coverage {
			covered[k.APIVersion+" "+k.Kind] = k.Definition
		}
		if def, ok := covered["scheduling.tessera.dev/v1alpha1 Queue"]; !ok || def != "" {
			t.Errorf("%s: coverage of Queue = %q %v, want listed without a definition", name, def, ok)
		}
	}

	// What the demo left at its end: team B's 3 inference replicas on 1g MIG devices and
	// 2 notebooks on 10Gi shares of gpu-node-3, packed by tessera onto one MIG GPU and one
	// shared GPU; both training jobs completed, so nothing else holds a GPU. GPU units as
	// contract.DeviceUnits and ShareUnits count them: a 1g device of an H100 consumes 1 of
	// its 8 memory slices; a share its 10Gi of the shared GPU's 81408 MiB.
	migUnits, shareUnits := 1.0/8, 10240.0/81408
	node3 := round3(3*migUnits + 2*shareUnits)
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	want := map[string][2]string{
		"totals.allocated":              {"0", num(node3)},
		"totals.utilisation":            {"0", num(round3(node3 / 32))},
		"nodes[gpu-node-3].allocated":   {"0", num(node3)},
		"nodes[gpu-node-3].migInUse":    {"0", "1"},
		"nodes[gpu-node-3].sharedInUse": {"0", "1"},
		"queues[team-b].allocated":      {"0", num(node3)},
		"queues[research].allocated":    {"0", num(node3)},
		// The operator's CRD, not mapped by any definition, and its pod's gang.
		"coverage[" + crdGroup + "/v1 " + crdKind + "]": {"-", "none"},
		"totals.mappingErrors":                          {"0", "1"},
		"mappingErrors[team-a/pod-tune-worker-0]":       {"-", "UnknownWorkload"},
	}
	uncovered := strconv.Itoa(before.Totals.UncoveredKinds)
	want["totals.uncoveredKinds"] = [2]string{uncovered, strconv.Itoa(before.Totals.UncoveredKinds + 1)}
	for field, w := range want {
		c, ok := got[field]
		if !ok {
			t.Errorf("diff lacks %s (want %s → %s)", field, w[0], w[1])
			continue
		}
		if c.Before != w[0] || c.After != w[1] {
			t.Errorf("diff %s: %s → %s, want %s → %s", field, c.Before, c.After, w[0], w[1])
		}
		if !strings.Contains(table, field) {
			t.Errorf("the diff table lacks %s:\n%s", field, table)
		}
		delete(got, field)
	}
	// The waits: nothing pending before (one sample, nothing seen waiting); after, every
	// pod seen pending during the scenario — at least train-b's 10, which waited for
	// research's limit until train-a finished (5 s at this speed) — and none pending at
	// the end. Waits have the API's timestamps' resolution (seconds): pods bound within
	// the second of their creation waited 0 s.
	w := afterReport.Pending.Wait
	if before.Pending.Pods != 0 || before.Pending.Wait.Count != 0 || afterReport.Pending.Pods != 0 {
		t.Errorf("pending: before %+v, after %+v", before.Pending, afterReport.Pending)
	}
	if w.Count < 10 || w.P50 > w.P99 || w.P99 > w.Max || w.Max < 1 {
		t.Errorf("after: waits %+v, want train-b's 10 pods at least, the longest above 1 s", w)
	}
	for field, v := range map[string]float64{"pending.wait.count": float64(w.Count), "pending.wait.p50": w.P50, "pending.wait.p99": w.P99, "pending.wait.max": w.Max} {
		c, ok := got[field]
		if v == 0 && ok {
			t.Errorf("diff %s = %+v, want no change (0 both)", field, c)
		}
		if v != 0 && (!ok || c.Before != "0" || c.After != num(v)) {
			t.Errorf("diff %s = %+v, want 0 → %s", field, c, num(v))
		}
		delete(got, field)
	}
	// Nothing else changed.
	for field, c := range got {
		t.Errorf("diff has an unexpected change: %s %s → %s", field, c.Before, c.After)
	}
	t.Logf("diff:\n%s", table)
}

func readBaseline(t *testing.T, path string) baseline.Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := baseline.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

func ptrTo[T any](v T) *T { return &v }
