package operators

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Every expected gang below is derived by hand from the operator's documented
// behaviour (the comment beside it); the PodGroup names are tessera's:
// <kind>-<workload>-<gang>. Each test creates a real upstream example with a
// one-GPU DRA claim per pod, the real operator creates the pods, and tessera
// places them; waitGangs also checks that no gang is ever bound in part and no
// pod is bound before its claim is allocated and reserved for it.

const placeTimeout = 2 * time.Minute

// TestJobSetOneGang: paralleljobs (workers: parallelism 4, driver: 1, no
// startup policy): the JobSet controller creates both Jobs at once, one gang of
// 4 + 1 = 5.
func TestJobSetOneGang(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.create(h.load("JobSet/jobset__paralleljobs.yaml", nil))
	h.waitGangs(map[string]gang{"jobset-paralleljobs-jobset": {5, 5}}, 0, placeTimeout)
}

// TestJobSetInOrderRunsEveryStage: startup-driver-ready has startupPolicy
// InOrder: the controller creates the workers' Job (4 pods) only once the
// driver's Job (1 pod) is ready. One gang of 5 would wait forever for pods that
// do not exist yet; a gang per stage places the driver, then the workers.
func TestJobSetInOrderRunsEveryStage(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.create(h.load("JobSet/jobset__startup-driver-ready.yaml", nil))
	h.waitGangs(map[string]gang{
		"jobset-startup-driver-ready-jobset-stage-0": {1, 1},
		"jobset-startup-driver-ready-jobset-stage-1": {4, 4},
	}, 0, placeTimeout)
}

// TestJobSetDependsOnRunsEveryStage: the upstream paralleljobs example with the
// driver made to depend on the workers: "workers" Complete first (their pods
// succeed after 3s), then "driver" is created. Stages: workers 0 (gang of 4),
// driver 1 (gang of 1).
func TestJobSetDependsOnRunsEveryStage(t *testing.T) {
	t.Parallel()
	h := setup(t)
	js := h.load("JobSet/jobset__paralleljobs.yaml", nil)
	js.SetName("depends-on")
	jobs, _, _ := unstructured.NestedSlice(js.Object, "spec", "replicatedJobs")
	jobs[1].(map[string]any)["dependsOn"] = []any{map[string]any{"name": "workers", "status": "Complete"}}
	if err := unstructured.SetNestedSlice(js.Object, jobs, "spec", "replicatedJobs"); err != nil {
		t.Fatal(err)
	}
	simDuration(js, func(path []string) bool { return pathHas(path, "replicatedJobs[0]") }, 3*time.Second)
	h.create(js)
	h.waitGangs(map[string]gang{
		"jobset-depends-on-jobset-stage-0": {4, 4},
		"jobset-depends-on-jobset-stage-1": {1, 1},
	}, 0, placeTimeout)
}

// TestStageIsAllOrNothing: a staged JobSet whose second stage cannot fit (InOrder:
// driver 1 pod, then workers of 40 one-GPU pods on 32 GPUs): the driver runs,
// and not one worker is bound, for as long as it does not fit.
func TestStageIsAllOrNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	js := h.load("JobSet/jobset__startup-driver-ready.yaml", nil)
	js.SetName("too-big")
	jobs, _, _ := unstructured.NestedSlice(js.Object, "spec", "replicatedJobs")
	spec := jobs[1].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	spec["parallelism"], spec["completions"] = int64(40), int64(40)
	if err := unstructured.SetNestedSlice(js.Object, jobs, "spec", "replicatedJobs"); err != nil {
		t.Fatal(err)
	}
	h.create(js)
	h.waitGangs(map[string]gang{
		"jobset-too-big-jobset-stage-0": {1, 1},
		"jobset-too-big-jobset-stage-1": {40, 0},
	}, 0, placeTimeout)
	// Several scheduling periods later the workers' gang is still wholly unbound.
	time.Sleep(5 * time.Second)
	bound := 0
	for _, p := range h.pods() {
		if p.Labels["jobset.sigs.k8s.io/replicatedjob-name"] == "workers" && p.Spec.NodeName != "" {
			bound++
		}
	}
	if bound != 0 {
		t.Fatalf("%d of 40 workers bound: a gang that does not fit must bind nothing", bound)
	}
}

// TestLWSTwoGroupsOneGangEach: the upstream LeaderWorkerSet sample (size 4) with
// replicas 2: each group — a leader and a StatefulSet of 3 workers created by
// the LWS controller — is a gang of 4.
func TestLWSTwoGroupsOneGangEach(t *testing.T) {
	t.Parallel()
	h := setup(t)
	lws := h.load("LeaderWorkerSet/lws__leaderworkerset_v1_leaderworkerset.yaml", nil)
	if err := unstructured.SetNestedField(lws.Object, int64(2), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	h.create(lws)
	name := lws.GetName()
	h.waitGangs(map[string]gang{
		"leaderworkerset-" + name + "-group-0": {4, 4},
		"leaderworkerset-" + name + "-group-1": {4, 4},
	}, 0, placeTimeout)
}

// TestLWSLeaderReadyRunsEveryStage: with startupPolicy LeaderReady the LWS
// controller creates a group's workers only once its leader is ready: per group
// a gang of the leader (1), then one of the 3 workers.
func TestLWSLeaderReadyRunsEveryStage(t *testing.T) {
	t.Parallel()
	h := setup(t)
	lws := h.load("LeaderWorkerSet/lws__leaderworkerset_v1_leaderworkerset.yaml", nil)
	lws.SetName("leader-ready")
	if err := unstructured.SetNestedField(lws.Object, int64(2), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(lws.Object, "LeaderReady", "spec", "startupPolicy"); err != nil {
		t.Fatal(err)
	}
	h.create(lws)
	h.waitGangs(map[string]gang{
		"leaderworkerset-leader-ready-group-stage-0-0": {1, 1},
		"leaderworkerset-leader-ready-group-stage-0-1": {1, 1},
		"leaderworkerset-leader-ready-group-stage-1-0": {3, 3},
		"leaderworkerset-leader-ready-group-stage-1-1": {3, 3},
	}, 0, placeTimeout)
}

// TestRayClusterWorkerGroupsAndBounds: the upstream autoscaler sample (one
// group "small-group", replicas 0, min 0, max 10) with a second group "gpu-group"
// (replicas 3, min 2, max 4). KubeRay creates the head and replicas pods per
// group (0 + 3); the gang is the head plus each group's minReplicas when > 0,
// else its replicas: 1 + 0 + 2 = 3, with 4 pods in it.
func TestRayClusterWorkerGroupsAndBounds(t *testing.T) {
	t.Parallel()
	h := setup(t)
	rc := h.load("RayCluster/kuberay__ray-cluster.autoscaler.yaml", nil)
	groups, _, _ := unstructured.NestedSlice(rc.Object, "spec", "workerGroupSpecs")
	second := deepCopy(groups[0].(map[string]any))
	second["groupName"], second["replicas"], second["minReplicas"], second["maxReplicas"] = "gpu-group", int64(3), int64(2), int64(4)
	groups = append(groups, second)
	if err := unstructured.SetNestedSlice(rc.Object, groups, "spec", "workerGroupSpecs"); err != nil {
		t.Fatal(err)
	}
	h.create(rc)
	h.waitGangs(map[string]gang{"raycluster-" + rc.GetName() + "-cluster": {3, 4}}, 0, placeTimeout)
}

// TestRayJobSubmitterOutsideTheGang: the upstream RayJob sample (head + 1 worker,
// min 1): KubeRay creates the RayCluster (gang of 1 + 1 = 2), and once it is
// ready the K8sJobMode submitter Job, whose pod is no part of the gang (a gang
// of one). The sample's submitter uses the default template; the test gives it
// tessera-scheduler through spec.submitterPodTemplate.
func TestRayJobSubmitterOutsideTheGang(t *testing.T) {
	t.Parallel()
	h := setup(t)
	rj := h.load("RayJob/kuberay__ray-job.sample.yaml", nil)
	sub := map[string]any{
		"spec": map[string]any{
			"restartPolicy": "Never",
			"containers":    []any{map[string]any{"name": "ray-job-submitter", "image": "rayproject/ray:2.52.0"}},
		},
	}
	gpuify(sub, []string{"submitter"}, func([]string) bool { return false })
	if err := unstructured.SetNestedField(rj.Object, sub, "spec", "submitterPodTemplate"); err != nil {
		t.Fatal(err)
	}
	h.create(rj)
	h.waitGangs(map[string]gang{"rayjob-" + rj.GetName() + "-cluster": {2, 2}}, 1, placeTimeout)
}

// TestMPIJob: the upstream pi example (launcher 1, workers 2), launcher created
// at startup: one gang of 3.
func TestMPIJob(t *testing.T) {
	t.Parallel()
	h := setup(t)
	mj := h.load("MPIJob/mpi-operator__pi.yaml", nil)
	h.create(mj)
	h.waitGangs(map[string]gang{"mpijob-" + mj.GetName() + "-job": {3, 3}}, 0, placeTimeout)
}

// TestMPIJobWaitForWorkersReadyRunsEveryStage: with launcherCreationPolicy
// WaitForWorkersReady the MPI Operator creates the launcher Job only once both
// workers are ready: workers gang of 2, then launcher gang of 1.
func TestMPIJobWaitForWorkersReadyRunsEveryStage(t *testing.T) {
	t.Parallel()
	h := setup(t)
	mj := h.load("MPIJob/mpi-operator__pi.yaml", nil)
	mj.SetName("pi-staged")
	if err := unstructured.SetNestedField(mj.Object, "WaitForWorkersReady", "spec", "launcherCreationPolicy"); err != nil {
		t.Fatal(err)
	}
	h.create(mj)
	h.waitGangs(map[string]gang{
		"mpijob-pi-staged-job-stage-0": {2, 2},
		"mpijob-pi-staged-job-stage-1": {1, 1},
	}, 0, placeTimeout)
}

// TestPyTorchJobElastic: the upstream simple PyTorchJob (master 1, workers 1)
// made elastic with workers replicas 3 and elasticPolicy minReplicas 2,
// maxReplicas 4: the training-operator creates 1 + 3 pods; the gang needs the
// master and the minimum of workers, 1 + 2 = 3.
//
// Without GPUs: the training-operator v1.8.1 is built on k8s.io/api v0.29, whose
// PodResourceClaim has the pre-1.31 "source" field; decoding the template drops
// resourceClaimTemplateName, and the API server rejects the pods it creates
// ("must specify one of: resourceClaimName, resourceClaimTemplateName"). Its
// pods cannot carry DRA claims; the sandbox's GPUs are DRA only.
func TestPyTorchJobElastic(t *testing.T) {
	t.Parallel()
	h := setup(t)
	pj := h.load("PyTorchJob/training-operator__simple.yaml", func([]string) bool { return false })
	if err := unstructured.SetNestedField(pj.Object, int64(3), "spec", "pytorchReplicaSpecs", "Worker", "replicas"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedMap(pj.Object, map[string]any{"minReplicas": int64(2), "maxReplicas": int64(4), "rdzvBackend": "c10d"}, "spec", "elasticPolicy"); err != nil {
		t.Fatal(err)
	}
	h.create(pj)
	h.waitGangs(map[string]gang{"pytorchjob-" + pj.GetName() + "-job": {3, 4}}, 0, placeTimeout)
}

// TestTrainJob: a TrainJob of 2 nodes on the upstream torch-distributed runtime
// (copied with tessera-scheduler and a GPU claim per node): Trainer creates a
// JobSet whose "node" job runs numNodes = 2 pods: one gang of 2.
func TestTrainJob(t *testing.T) {
	t.Parallel()
	h := setup(t)
	rt := h.trainingRuntime("torch-distributed")
	tj := h.parse(`apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: torch-2-nodes
spec:
  runtimeRef:
    name: `+rt+`
    kind: TrainingRuntime
  trainer:
    numNodes: 2
`, nil)
	h.createAdmitted(tj, "must be created before the TrainJob is created")
	h.waitGangs(map[string]gang{"trainjob-torch-2-nodes-trainer": {2, 2}}, 0, placeTimeout)
}

func deepCopy(m map[string]any) map[string]any {
	return (&unstructured.Unstructured{Object: m}).DeepCopy().Object
}
