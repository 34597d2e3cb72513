package catalog

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

type wantComp struct {
	name               string
	role               Role
	pods               bool
	replicas, min, max int64
	gpusPerPod         float64
}

type wantGang struct {
	name             string
	minMember, count int64
}

type wantWorkload struct {
	kind, name string
	definition string
	pods       int64
	gpus       float64
	comps      []wantComp
	gangs      []wantGang
}

type manifestCase struct {
	file string
	// skipped are the kinds of documents in the file that are not workloads.
	skipped   []string
	workloads []wantWorkload
}

// manifestCases holds, for every manifest under test/testdata/workloads, what the
// built-in catalog must make of it. Every number was derived by reading the
// manifest against the mapping rules in docs/catalog.md; the comment of each case
// says how. min/max equal replicas where the manifest sets no bounds.
var manifestCases = []manifestCase{
	{
		// services: Frontend (replicas 1, no GPU), decode and prefill (replicas 1 x
		// multinode.nodeCount 2 = 2 pods each, resources.limits.gpu "1" = 1 GPU).
		// pods 1+2+2 = 5, GPUs 2+2 = 4. One gang per service (replicas x nodeCount).
		file: "DynamoGraphDeployment/dynamo__disagg-multinode.yaml",
		workloads: []wantWorkload{{kind: "DynamoGraphDeployment", name: "vllm-disagg", definition: "nvidia-com-dynamographdeployment-v1alpha1",
			pods: 5, gpus: 4,
			comps: []wantComp{
				{"Frontend", RoleService, true, 1, 1, 1, 0},
				{"decode", RoleWorker, true, 2, 2, 2, 1},
				{"prefill", RoleWorker, true, 2, 2, 2, 1},
			},
			gangs: []wantGang{{"service-Frontend", 1, 1}, {"service-decode", 2, 1}, {"service-prefill", 2, 1}},
		}},
	},
	{
		// three services of 1 replica; the two vLLM workers limit gpu "1".
		file: "DynamoGraphDeployment/dynamo__disagg.yaml",
		workloads: []wantWorkload{{kind: "DynamoGraphDeployment", name: "vllm-disagg", definition: "nvidia-com-dynamographdeployment-v1alpha1",
			pods: 3, gpus: 2,
			comps: []wantComp{
				{"Frontend", RoleService, true, 1, 1, 1, 0},
				{"VllmDecodeWorker", RoleWorker, true, 1, 1, 1, 1},
				{"VllmPrefillWorker", RoleWorker, true, 1, 1, 1, 1},
			},
			gangs: []wantGang{{"service-Frontend", 1, 1}, {"service-VllmDecodeWorker", 1, 1}, {"service-VllmPrefillWorker", 1, 1}},
		}},
	},
	{
		// v1beta1 components list: Frontend (no GPU), VllmDecodeWorker
		// (nvidia.com/gpu "1" in its pod template), 1 replica each.
		file: "DynamoGraphDeployment/dynamo__v1beta1_agg.yaml",
		workloads: []wantWorkload{{kind: "DynamoGraphDeployment", name: "vllm-agg", definition: "nvidia-com-dynamographdeployment-v1beta1",
			pods: 2, gpus: 1,
			comps: []wantComp{
				{"Frontend", RoleService, true, 1, 1, 1, 0},
				{"VllmDecodeWorker", RoleWorker, true, 1, 1, 1, 1},
			},
			gangs: []wantGang{{"component-Frontend", 1, 1}, {"component-VllmDecodeWorker", 1, 1}},
		}},
	},
	{
		// predictor with containers, minReplicas 1: one pod, no GPU, a service: no gang.
		file: "InferenceService/kserve__custom_simple.yaml",
		workloads: []wantWorkload{{kind: "InferenceService", name: "custom-simple", definition: "serving-kserve-io-inferenceservice-v1beta1",
			pods: 1, gpus: 0,
			comps: []wantComp{{"predictor", RoleService, true, 1, 1, 1, 0}},
		}},
	},
	{
		// predictor.model limits nvidia.com/gpu "1"; no minReplicas: KServe's default 1.
		file: "InferenceService/kserve__hf_isvc.yaml",
		workloads: []wantWorkload{{kind: "InferenceService", name: "huggingface-llama2", definition: "serving-kserve-io-inferenceservice-v1beta1",
			pods: 1, gpus: 1,
			comps: []wantComp{{"predictor", RoleService, true, 1, 1, 1, 1}},
		}},
	},
	{
		// workers: replicas 1 (default) x parallelism 4 = 4; driver: 1 x 1. One gang of all 5.
		file: "JobSet/jobset__paralleljobs.yaml",
		workloads: []wantWorkload{{kind: "JobSet", name: "paralleljobs", definition: "jobset-x-k8s-io-jobset-v1alpha2",
			pods: 5,
			comps: []wantComp{
				{"workers", RoleWorker, true, 4, 4, 4, 0},
				{"driver", RoleLeader, true, 1, 1, 1, 0},
			},
			gangs: []wantGang{{"jobset", 5, 1}},
		}},
	},
	{
		// driver 1 x parallelism 1, workers 1 x parallelism 4; startupPolicy InOrder:
		// JobSet creates the workers' Job only once the driver's is ready, so a gang
		// of 5 would never have its pods at once. Stage 0 = driver (gang of 1),
		// stage 1 = workers (gang of 4).
		file: "JobSet/jobset__startup-driver-ready.yaml",
		workloads: []wantWorkload{{kind: "JobSet", name: "startup-driver-ready", definition: "jobset-x-k8s-io-jobset-v1alpha2",
			pods: 5,
			comps: []wantComp{
				{"driver", RoleLeader, true, 1, 1, 1, 0},
				{"workers", RoleWorker, true, 4, 4, 4, 0},
			},
			gangs: []wantGang{{"jobset-stage-0", 1, 1}, {"jobset-stage-1", 4, 1}},
		}},
	},
	{
		// no min-scale annotation (only target): one revision of 1 pod, gang of 1.
		// Knative defaults: initial-scale 1, min-scale 0 (scale to zero): 1 pod,
		// min 0; no min-scale, so no gang.
		file: "KnativeService/docs__autoscale-go-service.yaml",
		workloads: []wantWorkload{{kind: "Service", name: "autoscale-go", definition: "serving-knative-dev-service-v1",
			pods: 1, comps: []wantComp{{"revision", RoleService, true, 1, 0, 1, 0}}}},
	},
	{
		// As above: initial-scale 1, min-scale 0, no gang.
		file: "KnativeService/docs__helloworld-go-service.yaml",
		workloads: []wantWorkload{{kind: "Service", name: "helloworld-go", definition: "serving-knative-dev-service-v1",
			pods: 1, comps: []wantComp{{"revision", RoleService, true, 1, 0, 1, 0}}}},
	},
	{
		// two containers, one pod; min-scale 0 by default, no gang.
		file: "KnativeService/docs__multi-container-service.yaml",
		workloads: []wantWorkload{{kind: "Service", name: "multi-container", definition: "serving-knative-dev-service-v1",
			pods: 1, comps: []wantComp{{"revision", RoleService, true, 1, 0, 1, 0}}}},
	},
	{
		// min-scale "3": the revision runs 3 pods, and its gang needs all 3; no max-scale.
		file: "KnativeService/docs__scale-bounds-min-scale.yaml",
		workloads: []wantWorkload{{kind: "Service", name: "helloworld-go", definition: "serving-knative-dev-service-v1",
			pods: 3, comps: []wantComp{{"revision", RoleService, true, 3, 3, 3, 0}}, gangs: []wantGang{{"revision", 3, 1}}}},
	},
	{
		// replicas 3 groups of size 4: 3 leaders (worker template, no leader
		// template), 3 x 3 = 9 workers; 12 pods; 3 gangs of 4.
		file: "LeaderWorkerSet/lws__leaderworkerset_v1_leaderworkerset.yaml",
		workloads: []wantWorkload{{kind: "LeaderWorkerSet", name: "leaderworkerset-sample", definition: "leaderworkerset-x-k8s-io-leaderworkerset-v1",
			pods: 12,
			comps: []wantComp{
				{"group", RoleWorker, false, 3, 3, 3, 0},
				{"leader", RoleLeader, true, 3, 3, 3, 0},
				{"worker", RoleWorker, true, 9, 9, 9, 0},
			},
			gangs: []wantGang{{"group", 4, 3}},
		}},
	},
	{
		// replicas 2 groups of size 2: 2 leaders + 2 workers, each limits
		// nvidia.com/gpu "8": 4 pods, 32 GPUs, 2 gangs of 2. The Service is skipped.
		file:    "LeaderWorkerSet/lws__vllm-gpu-lws.yaml",
		skipped: []string{"Service"},
		workloads: []wantWorkload{{kind: "LeaderWorkerSet", name: "vllm", definition: "leaderworkerset-x-k8s-io-leaderworkerset-v1",
			pods: 4, gpus: 32,
			comps: []wantComp{
				{"group", RoleWorker, false, 2, 2, 2, 0},
				{"leader", RoleLeader, true, 2, 2, 2, 8},
				{"worker", RoleWorker, true, 2, 2, 2, 8},
			},
			gangs: []wantGang{{"group", 2, 2}},
		}},
	},
	{
		// Launcher 1 + Worker 2, CPU only: one gang of 3 (launcher counted).
		file: "MPIJob/mpi-operator__pi.yaml",
		workloads: []wantWorkload{{kind: "MPIJob", name: "pi", definition: "kubeflow-org-mpijob-v2beta1",
			pods: 3,
			comps: []wantComp{
				{"launcher", RoleLeader, true, 1, 1, 1, 0},
				{"worker", RoleWorker, true, 2, 2, 2, 0},
			},
			gangs: []wantGang{{"job", 3, 1}},
		}},
	},
	{
		// Workers limit nvidia.com/gpu 1 (an integer): 2 GPUs; the launcher none.
		file: "MPIJob/mpi-operator__tensorflow-benchmarks.yaml",
		workloads: []wantWorkload{{kind: "MPIJob", name: "tensorflow-benchmarks", definition: "kubeflow-org-mpijob-v2beta1",
			pods: 3, gpus: 2,
			comps: []wantComp{
				{"launcher", RoleLeader, true, 1, 1, 1, 0},
				{"worker", RoleWorker, true, 2, 2, 2, 1},
			},
			gangs: []wantGang{{"job", 3, 1}},
		}},
	},
	{
		// no mode: standalone, one replica; a service, no gang.
		file: "Milvus/milvus-operator__demo.yaml",
		workloads: []wantWorkload{{kind: "Milvus", name: "my-release", definition: "milvus-io-milvus-v1beta1",
			pods: 1, comps: []wantComp{{"standalone", RoleService, true, 1, 1, 1, 0}}}},
	},
	{
		// mode cluster lists 8 components with replicas 1: 8 pods, services, no gang.
		file: "Milvus/milvus-operator__milvus_cluster_resource.yaml",
		workloads: []wantWorkload{{kind: "Milvus", name: "my-release", definition: "milvus-io-milvus-v1beta1",
			pods: 8,
			comps: []wantComp{
				{"rootcoord", RoleService, true, 1, 1, 1, 0},
				{"datacoord", RoleService, true, 1, 1, 1, 0},
				{"querycoord", RoleService, true, 1, 1, 1, 0},
				{"indexcoord", RoleService, true, 1, 1, 1, 0},
				{"proxy", RoleService, true, 1, 1, 1, 0},
				{"datanode", RoleService, true, 1, 1, 1, 0},
				{"querynode", RoleService, true, 1, 1, 1, 0},
				{"indexnode", RoleService, true, 1, 1, 1, 0},
			},
		}},
	},
	{
		// NIMCache skipped; NIMService replicas 1 with HPA 1..2, nvidia.com/gpu 1.
		file:    "NIMService/k8s-nim-operator__standalone-autoscaling-llm.yaml",
		skipped: []string{"NIMCache"},
		workloads: []wantWorkload{{kind: "NIMService", name: "meta-llama-3-2-1b-instruct", definition: "apps-nvidia-com-nimservice-v1alpha1",
			pods: 1, gpus: 1, comps: []wantComp{{"service", RoleService, true, 1, 1, 2, 1}}}},
	},
	{
		file:    "NIMService/k8s-nim-operator__standalone-basic-llm.yaml",
		skipped: []string{"NIMCache"},
		workloads: []wantWorkload{{kind: "NIMService", name: "meta-llama-3-2-1b-instruct", definition: "apps-nvidia-com-nimservice-v1alpha1",
			pods: 1, gpus: 1, comps: []wantComp{{"service", RoleService, true, 1, 1, 1, 1}}}},
	},
	{
		// 1 PodCliqueSet replica. Scaling group prefill (replicas 2, minAvailable
		// default 1) holds pleader (1) and pworker (4); decode (replicas 1) holds
		// dleader (1) and dworker (2). Grove: the base PodGang has scaling-group
		// replicas 0 .. minAvailable-1, i.e. prefill-0 and decode-0: 1+4+1+2 = 8;
		// prefill replica 1 is a scaled PodGang of its own: 1+4 = 5. Pods 13.
		file: "PodCliqueSet/grove__multi-node-disaggregated.yaml",
		workloads: []wantWorkload{{kind: "PodCliqueSet", name: "multinode-disaggregated", definition: "grove-io-podcliqueset-v1alpha1",
			pods: 13,
			comps: []wantComp{
				{"replica", RoleWorker, false, 1, 1, 1, 0},
				{"prefill-0-pleader", RoleLeader, true, 1, 1, 1, 0},
				{"prefill-1-pleader", RoleLeader, true, 1, 1, 1, 0},
				{"prefill-0-pworker", RoleWorker, true, 4, 4, 4, 0},
				{"prefill-1-pworker", RoleWorker, true, 4, 4, 4, 0},
				{"decode-0-dleader", RoleLeader, true, 1, 1, 1, 0},
				{"decode-0-dworker", RoleWorker, true, 2, 2, 2, 0},
			},
			gangs: []wantGang{{"replica", 8, 1}, {"replica-prefill-1", 5, 1}},
		}},
	},
	{
		// pca 3 (autoscaling max 5); pcb, pcc 2 each in scaling group sga (1
		// replica, scaleConfig max 6: room for 5 more replicas, up to 2 x 6 = 12
		// pods each, counted on its last replica); pcd 2. 9 pods; sga's only
		// replica is within minAvailable (1): one base gang of 3+2+2+2 = 9.
		file: "PodCliqueSet/grove__simple1.yaml",
		workloads: []wantWorkload{{kind: "PodCliqueSet", name: "simple1", definition: "grove-io-podcliqueset-v1alpha1",
			pods: 9,
			comps: []wantComp{
				{"replica", RoleWorker, false, 1, 1, 1, 0},
				{"pca", RoleWorker, true, 3, 3, 5, 0},
				{"sga-0-pcb", RoleWorker, true, 2, 2, 12, 0},
				{"sga-0-pcc", RoleWorker, true, 2, 2, 12, 0},
				{"pcd", RoleWorker, true, 2, 2, 2, 0},
			},
			gangs: []wantGang{{"replica", 9, 1}},
		}},
	},
	{
		// Master 1 + Worker 1, each nvidia.com/gpu 1: 2 pods, 2 GPUs, gang of 2.
		file: "PyTorchJob/training-operator__pytorch_job_mnist_nccl.yaml",
		workloads: []wantWorkload{{kind: "PyTorchJob", name: "pytorch-dist-mnist-nccl", definition: "kubeflow-org-pytorchjob-v1",
			pods: 2, gpus: 2,
			comps: []wantComp{
				{"master", RoleLeader, true, 1, 1, 1, 1},
				{"worker", RoleWorker, true, 1, 1, 1, 1},
			},
			gangs: []wantGang{{"job", 2, 1}},
		}},
	},
	{
		file: "PyTorchJob/training-operator__simple.yaml",
		workloads: []wantWorkload{{kind: "PyTorchJob", name: "pytorch-simple", definition: "kubeflow-org-pytorchjob-v1",
			pods: 2,
			comps: []wantComp{
				{"master", RoleLeader, true, 1, 1, 1, 0},
				{"worker", RoleWorker, true, 1, 1, 1, 0},
			},
			gangs: []wantGang{{"job", 2, 1}},
		}},
	},
	{
		// head + small-group at replicas 0 (min 0, max 10): 1 pod now; the gang is
		// the head alone (minReplicas 0 falls back to replicas 0). ConfigMap skipped.
		file:    "RayCluster/kuberay__ray-cluster.autoscaler.yaml",
		skipped: []string{"ConfigMap"},
		workloads: []wantWorkload{{kind: "RayCluster", name: "raycluster-autoscaler", definition: "ray-io-raycluster-v1",
			pods: 1,
			comps: []wantComp{
				{"head", RoleLeader, true, 1, 1, 1, 0},
				{"small-group", RoleWorker, true, 0, 0, 10, 0},
			},
			gangs: []wantGang{{"cluster", 1, 1}},
		}},
	},
	{
		// head + workergroup (replicas 1, min 1, max 5): gang 1 + 1.
		file: "RayCluster/kuberay__ray-cluster.sample.yaml",
		workloads: []wantWorkload{{kind: "RayCluster", name: "raycluster-kuberay", definition: "ray-io-raycluster-v1",
			pods: 2,
			comps: []wantComp{
				{"head", RoleLeader, true, 1, 1, 1, 0},
				{"workergroup", RoleWorker, true, 1, 1, 5, 0},
			},
			gangs: []wantGang{{"cluster", 2, 1}},
		}},
	},
	{
		// generateName only (name empty). head + small-group 1 (1..5) + the K8sJobMode
		// submitter pod (default mode), which is not in the gang: 3 pods, gang of 2.
		file: "RayJob/kuberay__ray-job.kueue-toy-sample.yaml",
		workloads: []wantWorkload{{kind: "RayJob", name: "", definition: "ray-io-rayjob-v1",
			pods: 3,
			comps: []wantComp{
				{"head", RoleLeader, true, 1, 1, 1, 0},
				{"small-group", RoleWorker, true, 1, 1, 5, 0},
				{"submitter", RoleService, true, 1, 1, 1, 0},
			},
			gangs: []wantGang{{"cluster", 2, 1}},
		}},
	},
	{
		file:    "RayJob/kuberay__ray-job.sample.yaml",
		skipped: []string{"ConfigMap"},
		workloads: []wantWorkload{{kind: "RayJob", name: "rayjob-sample", definition: "ray-io-rayjob-v1",
			pods: 3,
			comps: []wantComp{
				{"head", RoleLeader, true, 1, 1, 1, 0},
				{"small-group", RoleWorker, true, 1, 1, 5, 0},
				{"submitter", RoleService, true, 1, 1, 1, 0},
			},
			gangs: []wantGang{{"cluster", 2, 1}},
		}},
	},
	{
		// head (num-gpus 0, no GPU limit) + gpu-group 1 x numOfHosts 1 limiting
		// nvidia.com/gpu "4". Secret skipped.
		file:    "RayService/kuberay__ray-service.llm-serve.yaml",
		skipped: []string{"Secret"},
		workloads: []wantWorkload{{kind: "RayService", name: "ray-serve-llm", definition: "ray-io-rayservice-v1",
			pods: 2, gpus: 4,
			comps: []wantComp{
				{"head", RoleLeader, true, 1, 1, 1, 0},
				{"gpu-group", RoleWorker, true, 1, 1, 1, 4},
			},
			gangs: []wantGang{{"cluster", 2, 1}},
		}},
	},
	{
		file: "RayService/kuberay__ray-service.sample.yaml",
		workloads: []wantWorkload{{kind: "RayService", name: "rayservice-sample", definition: "ray-io-rayservice-v1",
			pods: 2,
			comps: []wantComp{
				{"head", RoleLeader, true, 1, 1, 1, 0},
				{"small-group", RoleWorker, true, 1, 1, 5, 0},
			},
			gangs: []wantGang{{"cluster", 2, 1}},
		}},
	},
}

// TestManifestCasesCoverTestdata makes sure no manifest is left without expectations.
func TestManifestCasesCoverTestdata(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(workloadsDir, "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, c := range manifestCases {
		have[c.file] = true
	}
	for _, f := range files {
		rel, _ := filepath.Rel(workloadsDir, f)
		if !have[filepath.ToSlash(rel)] {
			t.Errorf("%s has no expectation in manifestCases", rel)
		}
	}
	if len(files) != len(manifestCases) {
		t.Errorf("%d manifests, %d cases", len(files), len(manifestCases))
	}
}

func TestMapManifests(t *testing.T) {
	c := newBuiltinCatalog(t)
	for _, tc := range manifestCases {
		t.Run(tc.file, func(t *testing.T) {
			got, skipped := mapAll(t, c, readManifests(t, tc.file))
			if fmt.Sprint(skipped) != fmt.Sprint(tc.skipped) {
				t.Errorf("skipped kinds %v, want %v", skipped, tc.skipped)
			}
			checkWorkloads(t, got, tc.workloads)
		})
	}
}

// mapAll maps every document, returning the workloads and the kinds skipped as
// unknown; any other error fails the test.
func mapAll(t *testing.T, c *Catalog, docs []Document) ([]*Workload, []string) {
	t.Helper()
	var ws []*Workload
	var skipped []string
	for _, d := range docs {
		w, err := c.Map(d.Object)
		if IsUnknownKind(err) {
			skipped = append(skipped, d.Object.GetKind())
			continue
		}
		if err != nil {
			t.Fatalf("document %d: %v", d.Index, err)
		}
		ws = append(ws, w)
	}
	sort.Strings(skipped)
	return ws, skipped
}

func checkWorkloads(t *testing.T, got []*Workload, want []wantWorkload) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d workloads, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Kind != w.kind || g.Name != w.name || g.Definition.Name != w.definition {
			t.Errorf("workload %s %q via %q, want %s %q via %q", g.Kind, g.Name, g.Definition.Name, w.kind, w.name, w.definition)
		}
		if g.Pods != w.pods || g.GPUs != w.gpus {
			t.Errorf("%s: pods %d gpus %v, want pods %d gpus %v", w.name, g.Pods, g.GPUs, w.pods, w.gpus)
		}
		var gc, wc []string
		for _, c := range g.Components {
			gc = append(gc, fmt.Sprintf("%s role=%s pods=%v replicas=%d min=%d max=%d gpus=%v", c.Name, c.Role, c.PodBearing, c.Replicas, c.MinReplicas, c.MaxReplicas, c.GPUsPerPod))
		}
		for _, c := range w.comps {
			wc = append(wc, fmt.Sprintf("%s role=%s pods=%v replicas=%d min=%d max=%d gpus=%v", c.name, c.role, c.pods, c.replicas, c.min, c.max, c.gpusPerPod))
		}
		if strings.Join(gc, "\n") != strings.Join(wc, "\n") {
			t.Errorf("%s components:\n%s\nwant:\n%s", w.name, strings.Join(gc, "\n"), strings.Join(wc, "\n"))
		}
		var gg, wg []string
		for _, x := range g.Gangs {
			gg = append(gg, fmt.Sprintf("%s min=%d count=%d", x.Name, x.MinMember, x.Count))
		}
		for _, x := range w.gangs {
			wg = append(wg, fmt.Sprintf("%s min=%d count=%d", x.name, x.minMember, x.count))
		}
		if strings.Join(gg, "; ") != strings.Join(wg, "; ") {
			t.Errorf("%s gangs: %q, want %q", w.name, gg, wg)
		}
		if g.Status != StatusPending {
			t.Errorf("%s: status %q, want pending (a manifest has no status)", w.name, g.Status)
		}
	}
}
