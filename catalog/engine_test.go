package catalog

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

func obj(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(y), &m); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func TestStatusMappings(t *testing.T) {
	c := newBuiltinCatalog(t)
	base := `apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: p}
spec:
  pytorchReplicaSpecs:
    Worker: {replicas: 2, template: {spec: {containers: [{name: c}]}}}
`
	cases := []struct {
		status string
		want   Status
		msg    string
	}{
		{"", StatusPending, ""},
		{"status: {conditions: [{type: Created, status: 'True'}]}", StatusInitializing, ""},
		{"status: {conditions: [{type: Created, status: 'True'}, {type: Running, status: 'True', message: all up}]}", StatusRunning, ""},
		// Failed wins over a Running condition still true.
		{"status: {conditions: [{type: Running, status: 'True'}, {type: Failed, status: 'True', message: OOM}]}", StatusFailed, "OOM"},
		{"status: {conditions: [{type: Succeeded, status: 'True'}]}", StatusCompleted, ""},
		{"status: {conditions: [{type: Running, status: 'False'}]}", StatusUnknown, ""},
	}
	for _, tc := range cases {
		w, err := c.Map(obj(t, base+tc.status))
		if err != nil {
			t.Fatal(err)
		}
		if w.Status != tc.want || (tc.msg != "" && w.StatusMessage != tc.msg) {
			t.Errorf("%q: status %q (%q), want %q (%q)", tc.status, w.Status, w.StatusMessage, tc.want, tc.msg)
		}
	}
	// Suspension through the spec.
	w, err := c.Map(obj(t, strings.Replace(base, "spec:\n", "spec:\n  runPolicy: {suspend: true}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if w.Status != StatusSuspended {
		t.Errorf("suspended job: status %q", w.Status)
	}
}

func TestPyTorchJobGangRules(t *testing.T) {
	c := newBuiltinCatalog(t)
	job := func(extra string) *Workload {
		w, err := c.Map(obj(t, `apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: p, namespace: ns}
spec:
`+extra+`
  pytorchReplicaSpecs:
    Master: {replicas: 1, template: {spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 8}}}]}}}
    Worker: {replicas: 7, template: {spec: {containers: [{name: c, resources: {limits: {tessera.dev/gpu: "8"}}}]}}}
`))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	// No policy: every replica, master included.
	if w := job(""); w.Gangs[0].MinMember != 8 || w.Pods != 8 || w.GPUs != 64 {
		t.Errorf("plain: %+v pods %d gpus %v", w.Gangs, w.Pods, w.GPUs)
	}
	// Elastic: master + minReplicas workers.
	if w := job("  elasticPolicy: {minReplicas: 3, maxReplicas: 7}"); w.Gangs[0].MinMember != 4 || w.Components[1].MaxReplicas != 7 {
		t.Errorf("elastic: %+v %+v", w.Gangs, w.Components)
	}
	// minAvailable wins over elastic.
	if w := job("  elasticPolicy: {minReplicas: 3}\n  runPolicy: {schedulingPolicy: {minAvailable: 6}}"); w.Gangs[0].MinMember != 6 {
		t.Errorf("minAvailable: %+v", w.Gangs)
	}
}

func TestDRAClaimsCountGPUs(t *testing.T) {
	c := newBuiltinCatalog(t)
	w := obj(t, `apiVersion: batch/v1
kind: Job
metadata: {name: j, namespace: ns}
spec:
  parallelism: 2
  template:
    spec:
      resourceClaims:
      - {name: gpus, resourceClaimTemplateName: two-gpus}
      - {name: mig, resourceClaimTemplateName: one-mig}
      - {name: missing, resourceClaimTemplateName: nowhere}
      containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]
`)
	tmpl := func(name, class string, count int64) *unstructured.Unstructured {
		return obj(t, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: `+name+`, namespace: ns}
spec:
  spec:
    devices:
      requests:
      - name: r
        exactly: {deviceClassName: `+class+`, count: `+itoa(count)+`}
`)
	}
	claims, err := NewStaticClaims([]*unstructured.Unstructured{tmpl("two-gpus", "gpu.tessera.dev", 2), tmpl("one-mig", "mig.gpu.tessera.dev", 1)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.MapWithClaims(context.Background(), w, claims)
	if err != nil {
		t.Fatal(err)
	}
	comp := got.Components[0]
	// 1 extended-resource GPU + 2 whole GPUs from the template; MIG is not a whole GPU.
	if comp.GPUsPerPod != 3 || got.GPUs != 6 {
		t.Errorf("gpus per pod %v total %v, want 3 and 6", comp.GPUsPerPod, got.GPUs)
	}
	if len(comp.UnresolvedClaims) != 1 || comp.UnresolvedClaims[0] != "missing" {
		t.Errorf("unresolved %v", comp.UnresolvedClaims)
	}
	// Without a lookup no claim can be counted.
	got, _ = c.Map(w)
	if got.Components[0].GPUsPerPod != 1 || len(got.Components[0].UnresolvedClaims) != 3 {
		t.Errorf("without lookup: %+v", got.Components[0])
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestInitContainersAndSidecars(t *testing.T) {
	c := newBuiltinCatalog(t)
	w, err := c.Map(obj(t, `apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  initContainers:
  - {name: init, resources: {limits: {nvidia.com/gpu: 4}}}
  - {name: side, restartPolicy: Always, resources: {limits: {nvidia.com/gpu: 1}}}
  containers:
  - {name: a, resources: {limits: {nvidia.com/gpu: 1}}}
  - {name: b, resources: {requests: {nvidia.com/gpu: "1"}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	// max(init 4, containers 1+1 + sidecar 1) = 4.
	if w.GPUs != 4 || w.Pods != 1 || len(w.Gangs) != 0 {
		t.Errorf("pod: gpus %v pods %d gangs %v", w.GPUs, w.Pods, w.Gangs)
	}
}

func TestUserDefinitionOverridesAndConflicts(t *testing.T) {
	def := func(name string) string {
		return `apiVersion: catalog.tessera.dev/v1alpha1
kind: WorkloadDefinition
metadata: {name: ` + name + `}
spec:
  structureDefinition:
    rootComponent:
      name: root
      kind: {group: kubeflow.org, version: v1, kind: PyTorchJob}
    childComponents:
    - name: all
      ownerRef: root
      specDefinition: {podTemplateSpecPath: '.spec.pytorchReplicaSpecs[].template'}
      scaleDefinition: {replicasPath: '.spec.pytorchReplicaSpecs[].replicas'}
`
	}
	a, err := ParseDefinitions([]byte(def("mine")), "a.yaml", SourceFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(a)
	if err != nil {
		t.Fatal(err)
	}
	infos := c.Definitions()
	found := false
	for _, i := range infos {
		if i.GVK.Kind == "PyTorchJob" {
			found = true
			if i.Definition.Name != "mine" || i.Overrides != "kubeflow-org-pytorchjob-v1" {
				t.Errorf("info %+v", i)
			}
		}
	}
	if !found {
		t.Error("PyTorchJob not listed")
	}
	ws, _ := mapAll(t, c, readManifests(t, "PyTorchJob/training-operator__simple.yaml"))
	if ws[0].Definition != (DefinitionRef{Name: "mine", File: "a.yaml", Source: SourceFile}) || ws[0].Pods != 2 || len(ws[0].Gangs) != 0 {
		t.Errorf("mapped with %+v: pods %d gangs %v", ws[0].Definition, ws[0].Pods, ws[0].Gangs)
	}
	b, _ := ParseDefinitions([]byte(def("theirs")), "b.yaml", SourceFile)
	_, err = New(append(a, b...))
	if err == nil || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "b.yaml") {
		t.Errorf("two user definitions for one kind: %v", err)
	}
}

func TestDefinitionErrors(t *testing.T) {
	head := "apiVersion: run.ai/v1alpha1\nkind: Karta\nmetadata: {name: d}\nspec:\n  structureDefinition:\n    rootComponent:\n      name: r\n      kind: {group: g, version: v1, kind: K}\n"
	cases := map[string]struct{ doc, want string }{
		"not a definition": {"apiVersion: v1\nkind: ConfigMap\n", "is not a definition"},
		"unknown field":    {head + "      replicasPath: .x\n", `unknown field "spec.structureDefinition.rootComponent.replicasPath"`},
		"no owner":         {head + "    childComponents:\n    - name: c\n", "childComponents[c].ownerRef: a child component needs ownerRef"},
		"missing owner":    {head + "    childComponents:\n    - {name: c, ownerRef: nope}\n", `no component named "nope"`},
		"cycle":            {head + "    childComponents:\n    - {name: a, ownerRef: b}\n    - {name: b, ownerRef: a}\n", "cycle"},
		"bad jq":           {head + "      scaleDefinition: {replicasPath: '.x | ('}\n", `rootComponent.scaleDefinition.replicasPath: expression ".x | ("`},
		"two forms":        {head + "      specDefinition: {podTemplateSpecPath: .a, podSpecPath: .b}\n", "exactly one of"},
		"no form":          {head + "      specDefinition: {}\n", "rootComponent.specDefinition: set exactly one of"},
		"byPhase alone":    {head + "      statusDefinition: {statusMappings: {running: [{byPhase: Up}]}}\n", "byPhase needs phaseDefinition"},
		"bad member":       {head + "  optimizationInstructions: {gangScheduling: {podGroups: [{name: g, members: [{componentName: x}]}]}}\n", `members[0].componentName: no component named "x"`},
		"bad role":         {strings.Replace(head, "metadata: {name: d}", "metadata: {name: d, annotations: {catalog.tessera.dev/roles: 'r=boss'}}", 1), `role "boss"`},
		"not yaml":         {"a: [b\n", "not a YAML object"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			defs, err := ParseDefinitions([]byte("# first\n---\n"+tc.doc), "defs.yaml", SourceFile)
			if err == nil {
				_, err = New(defs, WithoutBuiltins())
			}
			if err == nil {
				t.Fatal("accepted")
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "defs.yaml" || e.Doc != 2 {
				t.Errorf("error %q does not name defs.yaml document 2", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
		})
	}
}

func TestEvaluationErrors(t *testing.T) {
	defs, err := ParseDefinitions([]byte(`apiVersion: run.ai/v1alpha1
kind: Karta
metadata: {name: d}
spec:
  structureDefinition:
    rootComponent:
      name: r
      kind: {group: g, version: v1, kind: K}
    childComponents:
    - name: c
      ownerRef: r
      specDefinition: {podTemplateSpecPath: .spec.template}
      scaleDefinition: {replicasPath: '.spec.n | error("boom")'}
`), "d.yaml", SourceFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(defs, WithoutBuiltins())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Map(obj(t, "apiVersion: g/v1\nkind: K\nmetadata: {name: o, namespace: ns}\nspec: {n: 1, template: {spec: {}}}\n"))
	for _, want := range []string{"d.yaml", "K ns/o", `definition "d"`, "childComponents[c].scaleDefinition.replicasPath", "error(", "boom"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	// A template of the wrong type.
	_, err = c.Map(obj(t, "apiVersion: g/v1\nkind: K\nmetadata: {name: o}\nspec: {n: 1, template: [1]}\n"))
	if err == nil || !strings.Contains(err.Error(), "expected a pod template object, got array") {
		t.Errorf("wrong type: %v", err)
	}
	_, err = c.Map(obj(t, "apiVersion: v1\nkind: Nope\nmetadata: {name: o}\n"))
	if !IsUnknownKind(err) {
		t.Errorf("unknown kind: %v", err)
	}
}

func pod(name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels}}
}

func TestMatchPod(t *testing.T) {
	c := newBuiltinCatalog(t)
	ctx := context.Background()
	mapFile := func(rel string) *Workload {
		ws, _ := mapAll(t, c, readManifests(t, rel))
		return ws[0]
	}
	cases := []struct {
		name    string
		w       *Workload
		labels  map[string]string
		owners  []schema.GroupVersionKind
		want    string // component/name/instance/replica/role gang/min
		wantErr error
	}{
		{"pytorch master", mapFile("PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml"),
			map[string]string{"training.kubeflow.org/replica-type": "master", "training.kubeflow.org/job-name": "pytorch-dist-mnist-nccl"}, nil,
			"master/master///leader job/2", nil},
		{"pytorch worker (old capitalised label)", mapFile("PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml"),
			map[string]string{"training.kubeflow.org/replica-type": "Worker"}, nil, "worker/worker///worker job/2", nil},
		{"pytorch stranger", mapFile("PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml"),
			map[string]string{"app": "x"}, nil, "", ErrNoComponent},
		{"lws leader of group 1", mapFile("LeaderWorkerSet/lws__leaderworkerset_v1_leaderworkerset.yaml"),
			map[string]string{"leaderworkerset.sigs.k8s.io/name": "leaderworkerset-sample", "leaderworkerset.sigs.k8s.io/group-index": "1", "leaderworkerset.sigs.k8s.io/worker-index": "0"}, nil,
			"leader/leader//1/leader group-1/4", nil},
		{"lws worker of group 2", mapFile("LeaderWorkerSet/lws__leaderworkerset_v1_leaderworkerset.yaml"),
			map[string]string{"leaderworkerset.sigs.k8s.io/group-index": "2", "leaderworkerset.sigs.k8s.io/worker-index": "3"}, nil,
			"worker/worker//2/worker group-2/4", nil},
		{"jobset driver", mapFile("JobSet/jobset__paralleljobs.yaml"),
			map[string]string{"jobset.sigs.k8s.io/replicatedjob-name": "driver", "jobset.sigs.k8s.io/job-index": "0"}, nil,
			"replicatedjob/driver/driver/0/leader jobset/5", nil},
		// Scaling group prefill (replicas 2, minAvailable 1): its replica 1 is a
		// scaled PodGang of its own: pleader 1 + pworker 4 = 5; replica 0 is in the
		// base gang of the set replica (8).
		{"grove clique in a scaled scaling-group replica", mapFile("PodCliqueSet/grove__multi-node-disaggregated.yaml"),
			map[string]string{"grove.io/podclique": "multinode-disaggregated-0-prefill-1-pworker", "grove.io/podcliqueset-replica-index": "0"}, nil,
			"clique/prefill-1-pworker/prefill-1-pworker/0/worker replica-prefill-1-0/5", nil},
		{"grove clique in the base gang", mapFile("PodCliqueSet/grove__multi-node-disaggregated.yaml"),
			map[string]string{"grove.io/podclique": "multinode-disaggregated-0-prefill-0-pworker", "grove.io/podcliqueset-replica-index": "0"}, nil,
			"clique/prefill-0-pworker/prefill-0-pworker/0/worker replica-0/8", nil},
		{"dynamo lower-cased component label", mapFile("DynamoGraphDeployment/dynamo__disagg.yaml"),
			map[string]string{"nvidia.com/dynamo-component": "vllmdecodeworker"}, nil,
			"service/VllmDecodeWorker/VllmDecodeWorker//worker service-VllmDecodeWorker/1", nil},
		{"ray submitter, not in the gang", mapFile("RayJob/kuberay__ray-job.sample.yaml"),
			map[string]string{"job-name": "rayjob-sample"}, []schema.GroupVersionKind{{Group: "batch", Version: "v1", Kind: "Job"}},
			"submitter/submitter///service -/0", nil},
		{"ray worker group", mapFile("RayJob/kuberay__ray-job.sample.yaml"),
			map[string]string{"ray.io/node-type": "worker", "ray.io/group": "small-group"}, nil,
			"worker/small-group/small-group//worker cluster/2", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := c.MatchPod(ctx, tc.w, pod("p", tc.labels), tc.owners)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gang, min := "-", int64(0)
			if m.Gang != nil {
				gang, min = m.Gang.Name, m.Gang.MinMember
			}
			got := m.Component + "/" + m.Name + "/" + m.Instance + "/" + m.Replica + "/" + string(m.Role) + " " + gang + "/" + itoa(min)
			if got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestReadsOnlyMetadata(t *testing.T) {
	for src, want := range map[string]bool{
		`.metadata.labels["training.kubeflow.org/replica-type"]`:                       true,
		`(.metadata.labels["a"] // "") | ascii_downcase`:                               true,
		`(.metadata.labels["leaderworkerset.sigs.k8s.io/worker-index"] // "0") != "0"`: true,
		`.metadata.annotations["x"] | split("-") | last`:                               true,
		`(.spec.containers[0].resources.limits["nvidia.com/gpu"] // 0) > 0`:            false,
		`.metadata | .labels.x`:         false,
		`.`:                             false,
		`..`:                            false,
		`.status.phase`:                 false,
		`.metadata.labels as $l | $l.x`: true,
	} {
		if got := readsOnlyMetadata(src); got != want {
			t.Errorf("%s: %v, want %v", src, got, want)
		}
	}
}

// TestMatchPodFilterOnSpec: a filter reading the pod spec is evaluated on the
// whole pod, not on its metadata only.
func TestMatchPodFilterOnSpec(t *testing.T) {
	defs, err := ParseDefinitions([]byte(`apiVersion: run.ai/v1alpha1
kind: Karta
metadata: {name: gpu-only}
spec:
  structureDefinition:
    rootComponent: {name: r, kind: {group: g, version: v1, kind: K}}
    childComponents:
    - {name: c, ownerRef: r, specDefinition: {podTemplateSpecPath: .spec.template}, scaleDefinition: {replicasPath: .spec.count}}
  optimizationInstructions:
    gangScheduling:
      podGroups:
      - name: gpus
        members:
        - componentName: c
          filters: ['(.spec.containers[0].resources.limits["nvidia.com/gpu"] // 0 | tonumber) > 0']
`), "d.yaml", SourceFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(defs, WithoutBuiltins())
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Map(obj(t, "apiVersion: g/v1\nkind: K\nmetadata: {name: o}\nspec: {count: 3, template: {spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1}}}]}}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Gangs) != 1 || w.Gangs[0].MinMember != 3 {
		t.Fatalf("gangs %+v", w.Gangs)
	}
	gpuPod := pod("a", nil)
	gpuPod.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resourceQuantity("1")}}}}
	m, err := c.MatchPod(context.Background(), w, gpuPod, nil)
	if err != nil || m.Gang == nil {
		t.Errorf("GPU pod: %+v %v", m, err)
	}
	cpuPod := pod("b", nil)
	cpuPod.Spec.Containers = []corev1.Container{{Name: "c"}}
	m, err = c.MatchPod(context.Background(), w, cpuPod, nil)
	if err != nil || m.Gang != nil {
		t.Errorf("CPU pod: %+v %v", m, err)
	}
}

func resourceQuantity(s string) resource.Quantity { return resource.MustParse(s) }
