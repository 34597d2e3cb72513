package catalog

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// mapFileDocs maps every workload among docs with the claims and templates of
// the same documents, as `tessera map -f` does.
func mapFileDocs(t *testing.T, c *Catalog, manifest string, gpuMemory string) []*Workload {
	t.Helper()
	docs, err := ParseManifests([]byte(manifest), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, d := range docs {
		objs = append(objs, d.Object)
	}
	claims, err := NewStaticClaims(objs)
	if err != nil {
		t.Fatal(err)
	}
	if gpuMemory != "" {
		q := resource.MustParse(gpuMemory)
		claims.SetGPUMemory(&q)
	}
	var out []*Workload
	for _, d := range docs {
		w, err := c.MapWithClaims(context.Background(), d.Object, claims)
		if IsUnknownKind(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, w)
	}
	return out
}

func totals(w *Workload) string {
	var comps []string
	for _, c := range w.Components {
		s := fmt.Sprintf("%s %d(%d-%d) %v/%v", c.Name, c.Replicas, c.MinReplicas, c.MaxReplicas, c.GPUsPerPod, c.GPUUnitsPerPod)
		if len(c.UnresolvedClaims) > 0 {
			s += " unresolved=" + strings.Join(c.UnresolvedClaims, ",")
		}
		comps = append(comps, s)
	}
	return fmt.Sprintf("pods=%d/%d/%d gpus=%v/%v/%v units=%v/%v/%v | %s", w.Pods, w.MinPods, w.MaxPods,
		w.GPUs, w.MinGPUs, w.MaxGPUs, w.GPUUnits, w.MinGPUUnits, w.MaxGPUUnits, strings.Join(comps, "; "))
}

// TestCatalogFixes: what real manifests need beyond their own fields. Totals are
// pods, whole GPUs and GPU units, each at full/minimum/maximum scale; each
// expected value is derived in the comment beside it.
func TestCatalogFixes(t *testing.T) {
	c := newBuiltinCatalog(t)
	cases := []struct {
		name, manifest, gpuMemory, want string
	}{
		{
			// KServe predictor min 1, max 5 (KServe scales between them), 1 GPU each:
			// 1 pod now, 1 to 5 pods, 1 to 5 GPUs.
			"kserve min and max scale", `apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: s, namespace: ns}
spec:
  predictor:
    minReplicas: 1
    maxReplicas: 5
    model: {modelFormat: {name: huggingface}, resources: {limits: {nvidia.com/gpu: "1"}}}
`, "", "pods=1/1/5 gpus=1/1/5 units=1/1/5 | predictor 1(1-5) 1/1",
		},
		{
			// NIMService (k8s-nim-operator DRAResource), 2 replicas: a template of 2
			// GPUs per pod, a claimCreationSpec of 4 gpu.nvidia.com devices per pod,
			// and one named claim of 8 GPUs that both replicas share. Per pod
			// 2 + 4 + 8 = 14; in all 2 x (2 + 4) + 8 once = 20. The shared claim's 8
			// units are 4 per pod: 2 + 4 + 4 = 10 units per pod.
			"nim draResources", `apiVersion: apps.nvidia.com/v1alpha1
kind: NIMService
metadata: {name: llm, namespace: ns}
spec:
  image: {repository: nvcr.io/nim/meta/llama, tag: "1.0"}
  replicas: 2
  draResources:
  - resourceClaimTemplateName: two-gpus
  - claimCreationSpec: {devices: [{name: gpu, count: 4}]}
  - resourceClaimName: shared-8
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-gpus, namespace: ns}
spec: {spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.tessera.dev, count: 2}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared-8, namespace: ns}
spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.nvidia.com, count: 8}}]}}
`, "", "pods=2/2/2 gpus=20/20/20 units=20/20/20 | service 2(2-2) 14/10",
		},
		{
			// Claim templates in resource.k8s.io/v1beta1 (fields on the request) and
			// v1beta2 (under exactly), and a workload without a namespace whose
			// templates are in "default" (kubectl puts both there): 2 + 1 GPUs per
			// pod, 3 pods: 9 GPUs.
			"v1beta1 and v1beta2 templates, default namespace", `apiVersion: batch/v1
kind: Job
metadata: {name: train}
spec:
  parallelism: 3
  template:
    spec:
      resourceClaims: [{name: a, resourceClaimTemplateName: beta1}, {name: b, resourceClaimTemplateName: beta2}]
      containers: [{name: c, image: x}]
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: beta1, namespace: default}
spec: {spec: {devices: {requests: [{name: g, deviceClassName: gpu.tessera.dev, allocationMode: ExactCount, count: 2}]}}}
---
apiVersion: resource.k8s.io/v1beta2
kind: ResourceClaimTemplate
metadata: {name: beta2}
spec: {spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.tessera.dev}}]}}}
`, "", "pods=3/3/3 gpus=9/9/9 units=9/9/9 | pod 3(3-3) 3/3",
		},
		{
			// KAI gpu-fraction 0.5: no whole GPU, half a GPU in units per pod; 4 pods:
			// 2 units.
			"kai gpu-fraction", `apiVersion: apps/v1
kind: Deployment
metadata: {name: nb, namespace: ns}
spec:
  replicas: 4
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {containers: [{name: c, image: x}]}
`, "", "pods=4/4/4 gpus=0/0/0 units=2/2/2 | pod 4(4-4) 0/0.5",
		},
		{
			// A share of a shared GPU (class shared.gpu.tessera.dev, memory 20Gi) on
			// an 80Gi GPU: ShareUnits = 20/80 = 0.25 per pod; 2 pods: 0.5 units.
			// Without the GPU's memory the share cannot be put in units: unresolved.
			"shared-GPU claim with GPU memory", sharedClaimManifest, "80Gi",
			"pods=2/2/2 gpus=0/0/0 units=0.5/0.5/0.5 | pod 2(2-2) 0/0.25",
		},
		{
			"shared-GPU claim without GPU memory", sharedClaimManifest, "",
			"pods=2/2/2 gpus=0/0/0 units=0/0/0 | pod 2(2-2) 0/0 unresolved=g",
		},
		{
			// Milvus (zilliztech/milvus-operator components_types.go): proxy replicas
			// -1 is HPA-managed, no hpa section: HPA's default minimum 1, maximum not
			// known (shown as 1). queryNode groups az-1 (2 pods) and az-2 (-1, with
			// the component's hpa 2..6). dataNode 3. Pods now 1 + 2 + 2 + 3 = 8, at
			// most 1 + 2 + 6 + 3 = 12.
			"milvus groups and replicas -1", `apiVersion: milvus.io/v1beta1
kind: Milvus
metadata: {name: m, namespace: ns}
spec:
  mode: cluster
  components:
    proxy: {replicas: -1}
    queryNode:
      hpa: {minReplicas: 2, maxReplicas: 6}
      groups: [{name: az-1, replicas: 2}, {name: az-2, replicas: -1}]
    dataNode: {replicas: 3}
`, "", "pods=8/8/12 gpus=0/0/0 units=0/0/0 | proxy 1(1-1) 0/0; datanode 3(3-3) 0/0; querynode-az-1 2(2-2) 0/0; querynode-az-2 2(2-6) 0/0",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := mapFileDocs(t, c, tc.manifest, tc.gpuMemory)
			if len(ws) != 1 {
				t.Fatalf("%d workloads", len(ws))
			}
			if got := totals(ws[0]); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

const sharedClaimManifest = `apiVersion: batch/v1
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
`

// TestGenerateName: an object with generateName and no name keeps the prefix,
// so that `tessera map` does not show an empty name.
func TestGenerateName(t *testing.T) {
	c := newBuiltinCatalog(t)
	ws := mapFileDocs(t, c, `apiVersion: batch/v1
kind: Job
metadata: {generateName: train-}
spec: {template: {spec: {containers: [{name: c, image: x}]}}}
`, "")
	if ws[0].Name != "" || ws[0].GenerateName != "train-" {
		t.Errorf("name %q generateName %q", ws[0].Name, ws[0].GenerateName)
	}
}
