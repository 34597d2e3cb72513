package catalog

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func summary(w *Workload) string {
	var parts []string
	for _, c := range w.Components {
		parts = append(parts, fmt.Sprintf("%s:%s:%d:%v", c.Name, c.Role, c.Replicas, c.GPUsPerPod))
	}
	for _, g := range w.Gangs {
		parts = append(parts, fmt.Sprintf("gang %s min=%d x%d", g.Name, g.MinMember, g.Count))
	}
	return fmt.Sprintf("pods=%d gpus=%v %s", w.Pods, w.GPUs, strings.Join(parts, " "))
}

// TestMultiNodeServices: KServe and NIM services gang-schedule only when they run
// multi-node, one gang per LeaderWorkerSet group of the pipeline size.
func TestMultiNodeServices(t *testing.T) {
	c := newBuiltinCatalog(t)
	cases := []struct{ name, manifest, want string }{
		{
			// A 4-stage pipeline: KServe's head Deployment (1 pod) and worker
			// Deployment (pipelineParallelSize 4 - 1 = 3 pods), one Ray cluster: one
			// gang of 4. The controller sets tensorParallelSize = 8 GPUs on every
			// pod, overriding the containers' own "2": 4 x 8 = 32 GPUs.
			"kserve multi-node", `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llama, namespace: ns}
spec:
  predictor:
    model:
      modelFormat: {name: huggingface}
      resources: {limits: {nvidia.com/gpu: "2"}}
    workerSpec:
      pipelineParallelSize: 4
      tensorParallelSize: 8
      containers: [{name: worker-container, resources: {limits: {nvidia.com/gpu: "2"}}}]
`,
			"pods=4 gpus=32 head:leader:1:8 worker:worker:3:8 gang multinode min=4 x1",
		},
		{
			// The case: only the parallel sizes, no resources at all. KServe
			// adds tensorParallelSize = 4 GPUs to the head and the 2 - 1 = 1 worker:
			// 2 pods, 8 GPUs, one gang of 2.
			"kserve multi-node, operator-defaulted GPUs", `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llama, namespace: ns}
spec:
  predictor:
    model:
      modelFormat: {name: huggingface}
      storageUri: pvc://models/llama
    workerSpec:
      pipelineParallelSize: 2
      tensorParallelSize: 4
`,
			"pods=2 gpus=8 head:leader:1:4 worker:worker:1:4 gang multinode min=2 x1",
		},
		{
			// Pipeline of 2: leader + 1 worker per replica, 3 replicas: 3 gangs of 2.
			"nim multi-node", `apiVersion: apps.nvidia.com/v1alpha1
kind: NIMService
metadata: {name: big, namespace: ns}
spec:
  image: {repository: nvcr.io/nim/meta/llama-3.1-405b-instruct, tag: "1.0"}
  replicas: 3
  resources: {limits: {nvidia.com/gpu: 8}}
  multiNode:
    backendType: lws
    parallelism: {pipeline: 2, tensor: 8}
`,
			"pods=6 gpus=48 multinode:worker:3:0 leader:leader:3:8 worker:worker:3:8 gang multinode min=2 x3",
		},
		{
			// A transformer next to the predictor: two services, no gang.
			"kserve transformer", `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: t, namespace: ns}
spec:
  predictor:
    maxReplicas: 4
    containers: [{name: kserve-container, image: x}]
  transformer:
    minReplicas: 2
    containers: [{name: transformer, image: y}]
`,
			"pods=3 gpus=0 predictor:service:1:0 transformer:service:2:0",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := c.Map(obj(t, tc.manifest))
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(w); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestKServeMultiNodePods: KServe's head and worker pods (labels as the KServe
// controller sets them) are the head and worker of one gang of the pipeline size.
func TestKServeMultiNodePods(t *testing.T) {
	c := newBuiltinCatalog(t)
	w, err := c.Map(obj(t, `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llama, namespace: ns}
spec:
  predictor:
    model: {modelFormat: {name: huggingface}}
    workerSpec: {pipelineParallelSize: 3, tensorParallelSize: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ app, component string }{
		{"isvc.llama-predictor", "head"},
		{"isvc.llama-predictor-worker", "worker"},
	} {
		labels := map[string]string{"app": tc.app, "component": "predictor", "serving.kserve.io/inferenceservice": "llama"}
		m, err := c.MatchPod(context.Background(), w, pod("p", labels), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Component != tc.component || m.Gang == nil || m.Gang.Name != "multinode" || m.Gang.MinMember != 3 {
			t.Errorf("%s: component %s gang %+v, want %s in multinode of 3", tc.app, m.Component, m.Gang, tc.component)
		}
	}
}
