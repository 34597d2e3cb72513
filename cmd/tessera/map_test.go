package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/catalog"
)

const testdata = "../../test/testdata"

// runCLI runs the tessera root command in-process.
func runCLI(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

// TestMapJSONMatchesLibrary maps every upstream manifest through `tessera map -f
// FILE -o json` and checks the output equals what the library maps, field by field,
// and that non-workloads are reported on stderr.
func TestMapJSONMatchesLibrary(t *testing.T) {
	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(testdata, "workloads", "*", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			stdout, stderr, err := runCLI(t, "", "map", "-f", f, "-o", "json")
			if err != nil {
				t.Fatalf("tessera map: %v\n%s", err, stderr)
			}
			var got []catalog.Workload
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("output is not a JSON array of workloads: %v\n%s", err, stdout)
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			docs, err := catalog.ParseManifests(data, f)
			if err != nil {
				t.Fatal(err)
			}
			var want []catalog.Workload
			skipped := 0
			for _, d := range docs {
				w, err := cat.Map(d.Object)
				if catalog.IsUnknownKind(err) {
					skipped++
					if !strings.Contains(stderr, "skipping "+catalog.GVKString(d.Object.GroupVersionKind())+" "+d.Object.GetName()) {
						t.Errorf("stderr does not note the skipped %s:\n%s", d.Object.GetKind(), stderr)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				for i := range w.Components {
					w.Components[i].PodTemplate = nil
				}
				// Round-trip through JSON, as the CLI output was.
				b, _ := json.Marshal(w)
				var rt catalog.Workload
				if err := json.Unmarshal(b, &rt); err != nil {
					t.Fatal(err)
				}
				want = append(want, rt)
			}
			if len(got) == 0 || len(got) != len(want) {
				t.Fatalf("CLI printed %d workloads, library mapped %d", len(got), len(want))
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("CLI and library differ:\ncli: %+v\nlib: %+v", got, want)
			}
			// The fields the JSON output promises.
			var raw []map[string]any
			_ = json.Unmarshal([]byte(stdout), &raw)
			for _, key := range []string{"apiVersion", "kind", "name", "definition", "components", "pods", "gpus", "gangs", "status"} {
				if _, ok := raw[0][key]; !ok {
					t.Errorf("JSON output lacks %q", key)
				}
			}
			comp := raw[0]["components"].([]any)[0].(map[string]any)
			for _, key := range []string{"name", "role", "replicas", "minReplicas", "maxReplicas", "gpusPerPod"} {
				if _, ok := comp[key]; !ok {
					t.Errorf("component JSON lacks %q", key)
				}
			}
		})
	}
}

func TestMapTableAndYAML(t *testing.T) {
	f := filepath.Join(testdata, "workloads", "LeaderWorkerSet", "lws__vllm-gpu-lws.yaml")
	out, _, err := runCLI(t, "", "map", "-f", f)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"LeaderWorkerSet vllm", "group x2", "TOTAL  pods=4  gpus=32  gangs: group x2 (minMember 2)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	if rows["leader"] != "leader leader 2 8 group x2 2" || rows["worker"] != "worker worker 2 8 group x2 2" {
		t.Errorf("rows %q %q", rows["leader"], rows["worker"])
	}
	out, _, err = runCLI(t, "", "map", "-f", f, "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "minMember: 2") || !strings.Contains(out, "gpus: 32") || strings.Contains(out, "podTemplate") {
		t.Errorf("yaml output:\n%s", out)
	}
	// --show-templates: the NIMService's pod template assembled from fragments.
	nim := filepath.Join(testdata, "workloads", "NIMService", "k8s-nim-operator__standalone-basic-llm.yaml")
	out, _, err = runCLI(t, "", "map", "-f", nim, "-o", "json", "--show-templates")
	if err != nil {
		t.Fatal(err)
	}
	var ws []catalog.Workload
	if err := json.Unmarshal([]byte(out), &ws); err != nil {
		t.Fatal(err)
	}
	tmpl, _ := json.Marshal(ws[0].Components[0].PodTemplate)
	if !strings.Contains(string(tmpl), `"image":"nvcr.io/nim/meta/llama-3.2-1b-instruct:1.12.0"`) || !strings.Contains(string(tmpl), `"nvidia.com/gpu":1`) {
		t.Errorf("assembled template %s", tmpl)
	}
}

func TestMapStdinAndDirectory(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdata, "workloads", "PyTorchJob", "training-operator__simple.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, string(data), "map", "-f", "-", "-o", "json")
	if err != nil || !strings.Contains(out, `"name": "pytorch-simple"`) {
		t.Fatalf("stdin: %v\n%s", err, out)
	}
	out, _, err = runCLI(t, "", "map", "-f", filepath.Join(testdata, "workloads"), "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ws []catalog.Workload
	if err := json.Unmarshal([]byte(out), &ws); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(testdata, "workloads", "*", "*.yaml"))
	if len(ws) != len(files) {
		t.Errorf("directory: %d workloads, want %d (one per manifest)", len(ws), len(files))
	}
}

// TestMapUserDefinitionOverrides: --definitions replaces the built-in for its kind,
// and the output names the definition and its file.
func TestMapUserDefinitionOverrides(t *testing.T) {
	def := filepath.Join(testdata, "workloadmap-definitions", "legacy-resourceinterface", "jobset.yaml")
	out, _, err := runCLI(t, "", "map", "--definitions", def, "-f", filepath.Join(testdata, "workloads", "JobSet", "jobset__paralleljobs.yaml"), "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ws []catalog.Workload
	if err := json.Unmarshal([]byte(out), &ws); err != nil {
		t.Fatal(err)
	}
	if d := ws[0].Definition; d.Name != "jobset" || d.File != def || d.Source != catalog.SourceFile {
		t.Errorf("definition %+v, want jobset from %s", d, def)
	}
	list, _, err := runCLI(t, "", "catalog", "list", "--definitions", def)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "jobset-x-k8s-io-jobset-v1alpha2") || !strings.Contains(list, def) {
		t.Errorf("catalog list does not show the override:\n%s", list)
	}
}

func TestMapBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\n---\nkind: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCLI(t, "", "map", "-f", bad)
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "document 2") {
		t.Errorf("error %v does not name the file and document 2", err)
	}
	// A definition whose jq does not compile: the error names file, definition and expression.
	def := filepath.Join(dir, "def.yaml")
	if err := os.WriteFile(def, []byte(`apiVersion: run.ai/v1alpha1
kind: Karta
metadata: {name: broken}
spec:
  structureDefinition:
    rootComponent:
      name: x
      kind: {group: example.com, version: v1, kind: X}
      scaleDefinition: {replicasPath: ".spec.replicas |||"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCLI(t, "", "map", "--definitions", def, "-f", filepath.Join(testdata, "workloads", "JobSet"))
	for _, want := range []string{def, "document 1", `definition "broken"`, "scaleDefinition.replicasPath", `".spec.replicas |||"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	// A path of the wrong type in a workload: the object fails, the CLI exits non-zero.
	wl := filepath.Join(dir, "wl.yaml")
	if err := os.WriteFile(wl, []byte(`apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: p}
spec:
  pytorchReplicaSpecs:
    Worker: {replicas: "many", template: {spec: {containers: [{name: c}]}}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := runCLI(t, "", "map", "-f", wl)
	if err == nil || !strings.Contains(stderr, `"many" is not a count`) || !strings.Contains(stderr, "replicasPath") {
		t.Errorf("err %v, stderr %q", err, stderr)
	}
}

// TestCatalogLintRenamedField runs `tessera catalog lint` against a CRD in which
// an operator upgrade renamed a field the built-in definition reads.
func TestCatalogLintRenamedField(t *testing.T) {
	crd, err := os.ReadFile(filepath.Join(testdata, "crds", "kubeflow.org_pytorchjobs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, "", "catalog", "lint", "--crd", filepath.Join(testdata, "crds", "kubeflow.org_pytorchjobs.yaml"))
	if err != nil || !strings.Contains(out, "every path is in the schema") {
		t.Fatalf("clean CRD: %v\n%s", err, out)
	}
	renamed := strings.Replace(string(crd), "schedulingPolicy:", "gangPolicy:", 1)
	if renamed == string(crd) {
		t.Fatal("CRD fixture changed: schedulingPolicy not found")
	}
	f := filepath.Join(t.TempDir(), "crd.yaml")
	if err := os.WriteFile(f, []byte(renamed), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(t, "", "catalog", "lint", "--crd", f)
	if err == nil {
		t.Fatalf("lint passed a CRD without spec.runPolicy.schedulingPolicy:\n%s", out)
	}
	if !strings.Contains(out, ".spec.runPolicy.schedulingPolicy") || !strings.Contains(out, "minReplicasPath") {
		t.Errorf("lint output does not name the path and field:\n%s", out)
	}
}

// TestMapTableScaleFractionsAndStages: the table shows totals at minimum and
// maximum scale, GPU units of fractions next to whole GPUs, claims it could not
// count, staged gangs with their stage, and a generated name as a prefix.
func TestMapTableScaleFractionsAndStages(t *testing.T) {
	in := `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {generateName: llm-, namespace: ns}
spec:
  predictor:
    minReplicas: 1
    maxReplicas: 5
    annotations: {gpu-fraction: "0.5"}
    model: {modelFormat: {name: huggingface}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: nb, namespace: ns}
spec:
  parallelism: 2
  template:
    spec:
      resourceClaims: [{name: g, resourceClaimTemplateName: quarter}]
      containers: [{name: c, image: x}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: quarter, namespace: ns}
spec: {spec: {devices: {requests: [{name: g, exactly: {deviceClassName: shared.gpu.tessera.dev, capacity: {requests: {memory: 20Gi}}}}]}}}
---
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: staged, namespace: ns}
spec:
  startupPolicy: {startupPolicyOrder: InOrder}
  replicatedJobs:
  - {name: driver, template: {spec: {template: {spec: {containers: [{name: c}]}}}}}
  - {name: workers, template: {spec: {parallelism: 3, template: {spec: {containers: [{name: c}]}}}}}
`
	out, _, err := runCLI(t, in, "map", "-f", "-")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"InferenceService ns/llm-<generated>",
		// 0.5 units per pod, 1 to 5 pods.
		"TOTAL  pods=1 (min 1, max 5)  gpus=0  gpu-units=0.5 (min 0.5, max 2.5)",
		// The share's memory cannot be put in units without --gpu-memory.
		"NOT COUNTED (+?)  pod: g",
		"jobset-stage-0 x1 (minMember 1, stage 1 of 2), jobset-stage-1 x1 (minMember 3, stage 2 of 2)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// With the GPU's memory: 20Gi of 80Gi = 0.25 units per pod, 2 pods.
	out, _, err = runCLI(t, in, "map", "-f", "-", "--gpu-memory", "80Gi")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "TOTAL  pods=2  gpus=0  gpu-units=0.5  gangs: job x1") {
		t.Errorf("with --gpu-memory:\n%s", out)
	}
	if _, _, err := runCLI(t, in, "map", "-f", "-", "--gpu-memory", "lots"); err == nil || !strings.Contains(err.Error(), "--gpu-memory") {
		t.Errorf("bad --gpu-memory: %v", err)
	}
}
