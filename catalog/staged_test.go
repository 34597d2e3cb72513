package catalog

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func gangSummary(w *Workload) string {
	var parts []string
	for _, g := range w.Gangs {
		parts = append(parts, fmt.Sprintf("%s min=%d x%d stage=%d/%d", g.Name, g.MinMember, g.Count, g.Stage, g.Stages))
	}
	return strings.Join(parts, "; ")
}

// TestStagedStartup: kinds whose operator creates pods in stages are one gang per
// stage, each all-or-nothing, so that no gang waits for pods its operator creates
// only after that gang runs. Every expected value is derived beside it from the
// operator code named in the definition's comment.
func TestStagedStartup(t *testing.T) {
	c := newBuiltinCatalog(t)
	cases := []struct{ name, manifest, want string }{
		{
			// No startup policy: the JobSet controller creates every Job at once: one
			// gang of 1 + 2x2 = 5.
			"jobset any order", `apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  replicatedJobs:
  - {name: driver, template: {spec: {parallelism: 1, template: {spec: {containers: [{name: c}]}}}}}
  - {name: workers, replicas: 2, template: {spec: {parallelism: 2, template: {spec: {containers: [{name: c}]}}}}}
`, "jobset min=5 x1 stage=0/0",
		},
		{
			// dependsOn: initializer (1 pod) first; trainer (2 jobs x 2 pods) once the
			// initializer completed; evaluator (1 pod) once trainer is ready, and
			// monitor (1 pod, no dependsOn) at once with the initializer. Stages:
			// initializer 0, monitor 0, trainer 1, evaluator 2 -> gangs of 1+1, 4, 1.
			"jobset dependsOn", `apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  replicatedJobs:
  - {name: initializer, template: {spec: {template: {spec: {containers: [{name: c}]}}}}}
  - name: trainer
    replicas: 2
    dependsOn: [{name: initializer, status: Complete}]
    template: {spec: {parallelism: 2, template: {spec: {containers: [{name: c}]}}}}
  - name: evaluator
    dependsOn: [{name: trainer, status: Ready}]
    template: {spec: {template: {spec: {containers: [{name: c}]}}}}
  - {name: monitor, template: {spec: {template: {spec: {containers: [{name: c}]}}}}}
`, "jobset-stage-0 min=2 x1 stage=0/3; jobset-stage-1 min=4 x1 stage=1/3; jobset-stage-2 min=1 x1 stage=2/3",
		},
		{
			// InOrder with three jobs: each its own stage, in list order.
			"jobset InOrder", `apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  startupPolicy: {startupPolicyOrder: InOrder}
  replicatedJobs:
  - {name: a, template: {spec: {parallelism: 1, template: {spec: {containers: [{name: c}]}}}}}
  - {name: b, replicas: 3, template: {spec: {parallelism: 1, template: {spec: {containers: [{name: c}]}}}}}
  - {name: c, template: {spec: {parallelism: 2, template: {spec: {containers: [{name: c}]}}}}}
`, "jobset-stage-0 min=1 x1 stage=0/3; jobset-stage-1 min=3 x1 stage=1/3; jobset-stage-2 min=2 x1 stage=2/3",
		},
		{
			// WaitForWorkersReady: the launcher Job exists only once both workers are
			// ready: workers (2) are stage 0, the launcher (1) stage 1.
			"mpijob WaitForWorkersReady", `apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: pi}
spec:
  launcherCreationPolicy: WaitForWorkersReady
  mpiReplicaSpecs:
    Launcher: {replicas: 1, template: {spec: {containers: [{name: l}]}}}
    Worker: {replicas: 2, template: {spec: {containers: [{name: w}]}}}
`, "job-stage-0 min=2 x1 stage=0/2; job-stage-1 min=1 x1 stage=1/2",
		},
		{
			// AtStartup (the default): launcher and workers at once: one gang of 3.
			"mpijob AtStartup", `apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: pi}
spec:
  mpiReplicaSpecs:
    Launcher: {replicas: 1, template: {spec: {containers: [{name: l}]}}}
    Worker: {replicas: 2, template: {spec: {containers: [{name: w}]}}}
`, "job min=3 x1 stage=0/0",
		},
		{
			// LeaderReady: per group, the worker StatefulSet is created once the
			// leader is ready: 3 groups x (leader gang of 1, then workers gang of 4-1=3).
			"lws LeaderReady", `apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: lws}
spec:
  replicas: 3
  startupPolicy: LeaderReady
  leaderWorkerTemplate:
    size: 4
    workerTemplate: {spec: {containers: [{name: w}]}}
`, "group-stage-0 min=1 x3 stage=0/2; group-stage-1 min=3 x3 stage=1/2",
		},
		{
			// LeaderCreated (the default): one gang of 4 per group.
			"lws LeaderCreated", `apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: lws}
spec:
  replicas: 3
  leaderWorkerTemplate:
    size: 4
    workerTemplate: {spec: {containers: [{name: w}]}}
`, "group min=4 x3 stage=0/0",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := c.Map(obj(t, tc.manifest))
			if err != nil {
				t.Fatal(err)
			}
			if got := gangSummary(w); got != tc.want {
				t.Errorf("gangs %q\nwant  %q", got, tc.want)
			}
		})
	}
}

// TestStagedPodsFindTheirStageGang: pods, as the operators label them, land in the
// gang of their stage, with that stage's minMember.
func TestStagedPodsFindTheirStageGang(t *testing.T) {
	c := newBuiltinCatalog(t)
	ctx := context.Background()
	js, err := c.Map(obj(t, `apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  startupPolicy: {startupPolicyOrder: InOrder}
  replicatedJobs:
  - {name: driver, template: {spec: {parallelism: 1, template: {spec: {containers: [{name: c}]}}}}}
  - {name: workers, template: {spec: {parallelism: 4, template: {spec: {containers: [{name: c}]}}}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	lws, err := c.Map(obj(t, `apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: lws}
spec:
  replicas: 2
  startupPolicy: LeaderReady
  leaderWorkerTemplate: {size: 3, workerTemplate: {spec: {containers: [{name: w}]}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	mpi, err := c.Map(obj(t, `apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: pi}
spec:
  launcherCreationPolicy: WaitForWorkersReady
  mpiReplicaSpecs:
    Launcher: {template: {spec: {containers: [{name: l}]}}}
    Worker: {replicas: 2, template: {spec: {containers: [{name: w}]}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		w      *Workload
		labels map[string]string
		gang   string
		min    int64
	}{
		{"jobset driver", js, map[string]string{"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": "driver", "jobset.sigs.k8s.io/job-index": "0"}, "jobset-stage-0", 1},
		{"jobset worker", js, map[string]string{"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/job-index": "0"}, "jobset-stage-1", 4},
		{"lws leader of group 1", lws, map[string]string{"leaderworkerset.sigs.k8s.io/name": "lws", "leaderworkerset.sigs.k8s.io/group-index": "1", "leaderworkerset.sigs.k8s.io/worker-index": "0"}, "group-stage-0-1", 1},
		{"lws worker of group 1", lws, map[string]string{"leaderworkerset.sigs.k8s.io/name": "lws", "leaderworkerset.sigs.k8s.io/group-index": "1", "leaderworkerset.sigs.k8s.io/worker-index": "2"}, "group-stage-1-1", 2},
		{"mpi worker", mpi, map[string]string{"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "worker"}, "job-stage-0", 2},
		{"mpi launcher", mpi, map[string]string{"training.kubeflow.org/job-name": "pi", "training.kubeflow.org/job-role": "launcher"}, "job-stage-1", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := c.MatchPod(ctx, tc.w, pod("p", tc.labels), nil)
			if err != nil {
				t.Fatal(err)
			}
			if m.Gang == nil || m.Gang.Name != tc.gang || m.Gang.MinMember != tc.min {
				t.Errorf("gang %+v, want %s with minMember %d", m.Gang, tc.gang, tc.min)
			}
		})
	}
}
