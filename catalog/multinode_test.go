package catalog

import (
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
			// 2 replicas of a 4-stage pipeline: head + 3 workers per group, 8 GPUs each
			// (worker GPUs from workerSpec).
			"kserve multi-node", `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llama, namespace: ns}
spec:
  predictor:
    minReplicas: 2
    model:
      modelFormat: {name: huggingface}
      resources: {limits: {nvidia.com/gpu: "8"}}
    workerSpec:
      pipelineParallelSize: 4
      tensorParallelSize: 8
      containers: [{name: worker-container, resources: {limits: {nvidia.com/gpu: "8"}}}]
`,
			"pods=8 gpus=64 multinode:worker:2:0 head:leader:2:8 worker:worker:6:8 gang multinode min=4 x2",
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
