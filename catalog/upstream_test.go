package catalog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadUpstream loads every upstream definition.
func loadUpstream(t *testing.T) []*Definition {
	t.Helper()
	files, err := ExpandPath(upstreamDefsDir)
	if err != nil {
		t.Fatal(err)
	}
	var defs []*Definition
	for _, f := range files {
		if filepath.Ext(f) != ".yaml" {
			continue
		}
		ds, err := LoadDefinitionFiles(f)
		if err != nil {
			t.Fatalf("upstream definition %s does not load: %v", f, err)
		}
		defs = append(defs, ds...)
	}
	return defs
}

// TestUpstreamDefinitionsLoadUnchanged loads the definitions published by the
// Workload Map project, in both envelopes, as they are.
func TestUpstreamDefinitionsLoadUnchanged(t *testing.T) {
	defs := loadUpstream(t)
	if len(defs) != 14 {
		t.Fatalf("%d upstream definitions loaded, want 14 (one per file)", len(defs))
	}
	envelopes := map[string]int{}
	for _, d := range defs {
		envelopes[d.Envelope.Kind]++
		if _, err := compile(d); err != nil {
			t.Errorf("%s: %v", d.File, err)
		}
	}
	if envelopes["Karta"] != 3 || envelopes["ResourceInterface"] != 11 {
		t.Errorf("envelopes %v, want 3 Karta and 11 ResourceInterface", envelopes)
	}
	// The JobSet definition has no metadata.name: it is named after its file.
	found := false
	for _, d := range defs {
		if strings.HasSuffix(d.File, "legacy-resourceinterface/jobset.yaml") {
			found = true
			if d.Name != "jobset" {
				t.Errorf("unnamed definition named %q, want jobset (its file)", d.Name)
			}
		}
	}
	if !found {
		t.Error("jobset.yaml not loaded")
	}
}

// TestMalformedDefinition: a definition file with two keys run onto one line (as
// an earlier copy of the upstream mpijob.yaml had) fails with the file, the
// document and the line, never a panic.
func TestMalformedDefinition(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mpijob.yaml")
	data := "apiVersion: optimization.nvidia.com/v1alpha1\nkind: ResourceInterface\nmetadata:\n  name: x\nspec:\n  structureDefinition:\n    rootComponent:\n      statusDefinition:\n        statusMappings:\n          failed:\n          - byConditions:\n            - type: Failed\n              status: \"False\"          running:\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadDefinitionFiles(path)
	if err == nil {
		t.Fatal("malformed definition loaded")
	}
	var e *Error
	if !errors.As(err, &e) || e.File != path || e.Doc != 1 || !strings.Contains(err.Error(), "line 12") {
		t.Errorf("error %q does not name the file, document and line", err)
	}
}

// TestUpstreamDefinitionsMapManifests maps every manifest whose kind an upstream
// definition reads with that definition (it overrides the built-in one). Pods are
// what each definition's own paths give: they agree with the built-ins except
// where the upstream definition models the kind differently (noted per case).
func TestUpstreamDefinitionsMapManifests(t *testing.T) {
	c, err := New(loadUpstream(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Overridden()) != 14 {
		t.Errorf("%d built-ins overridden, want 14", len(c.Overridden()))
	}
	cases := []struct {
		file, def string
		pods      int64
	}{
		// Dynamo v1alpha1: replicas x nodeCount per service, as built in.
		{"DynamoGraphDeployment/dynamo__disagg-multinode.yaml", "nvidia-com-dynamographdeployment-v1alpha1", 5},
		{"DynamoGraphDeployment/dynamo__disagg.yaml", "nvidia-com-dynamographdeployment-v1alpha1", 3},
		{"DynamoGraphDeployment/dynamo__v1beta1_agg.yaml", "nvidia-com-dynamographdeployment-v1beta1", 2},
		// KServe: the transformer's podSpecPath yields null, so only the predictor.
		{"InferenceService/kserve__custom_simple.yaml", "serving-kserve-io-inferenceservice-v1beta1", 1},
		{"InferenceService/kserve__hf_isvc.yaml", "serving-kserve-io-inferenceservice-v1beta1", 1},
		// The legacy JobSet definition counts replicas only, not x parallelism: 2 jobs.
		{"JobSet/jobset__paralleljobs.yaml", "jobset", 2},
		{"JobSet/jobset__startup-driver-ready.yaml", "jobset", 2},
		{"KnativeService/docs__scale-bounds-min-scale.yaml", "serving-knative-dev-service-v1", 3},
		{"KnativeService/docs__helloworld-go-service.yaml", "serving-knative-dev-service-v1", 1},
		// LWS: leader replicas + replicas x (size-1), as built in; but the sample has
		// no leaderTemplate and the upstream leader reads only that path, so only
		// the 3 x 3 workers count (the built-in falls back to the worker template).
		{"LeaderWorkerSet/lws__leaderworkerset_v1_leaderworkerset.yaml", "leaderworkerset-x-k8s-io-leaderworkerset-v1", 9},
		{"LeaderWorkerSet/lws__vllm-gpu-lws.yaml", "leaderworkerset-x-k8s-io-leaderworkerset-v1", 4},
		// Milvus: the definition reads pods from .spec.components.<c>.template, a
		// field Milvus does not have: no pod-bearing component is present.
		{"Milvus/milvus-operator__milvus_cluster_resource.yaml", "milvus", 0},
		{"NIMService/k8s-nim-operator__standalone-basic-llm.yaml", "apps-nvidia-com-nimservice-v1alpha1", 1},
		// Grove: clique replicas x set replicas; scaling groups do not multiply.
		{"PodCliqueSet/grove__simple1.yaml", "grove-io-podcliqueset-v1alpha1", 9},
		{"PodCliqueSet/grove__multi-node-disaggregated.yaml", "grove-io-podcliqueset-v1alpha1", 8},
		{"PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml", "kubeflow-org-pytorchjob-v1", 2},
		{"RayCluster/kuberay__ray-cluster.sample.yaml", "ray-io-raycluster-v1", 2},
		// RayJob: its instanceIdPath reads .spec.workerGroupSpecs (a RayCluster path),
		// which a RayJob lacks: no worker instances, the head alone.
		{"RayJob/kuberay__ray-job.sample.yaml", "ray-io-rayjob-v1", 1},
		{"RayService/kuberay__ray-service.sample.yaml", "ray-io-rayservice-v1", 2},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			ws, _ := mapAll(t, c, readManifests(t, tc.file))
			if len(ws) != 1 {
				t.Fatalf("%d workloads", len(ws))
			}
			w := ws[0]
			if w.Definition.Name != tc.def || w.Definition.Source != SourceFile || !strings.HasPrefix(w.Definition.File, upstreamDefsDir) {
				t.Errorf("definition %+v, want %s from a file under %s", w.Definition, tc.def, upstreamDefsDir)
			}
			if w.Pods != tc.pods {
				t.Errorf("pods %d, want %d (components %+v)", w.Pods, tc.pods, w.Components)
			}
		})
	}
	// Every definition file is valid input for os.ReadFile-free callers too.
	if _, err := os.Stat(upstreamDefsDir); err != nil {
		t.Fatal(err)
	}
}
