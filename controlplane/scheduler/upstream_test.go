package scheduler_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha3 "k8s.io/api/scheduling/v1alpha3"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/test/framework"
)

// gangAPIControlPlane runs the API server and controllers with the Kubernetes gang API on:
// GenericWorkload (Workload, PodGroup, pod spec.schedulingGroup; beta in v1.37, off by
// default), WorkloadWithJob (the Job controller creates them from spec.scheduling; alpha),
// DRAWorkloadResourceClaims (PodGroup-level claims; beta, off) and the
// scheduling.k8s.io/v1beta1 API version.
func gangAPIControlPlane(t *testing.T) *framework.ControlPlane {
	gates := maps.Clone(framework.FeatureGates)
	gates["GenericWorkload"] = true
	gates["WorkloadWithJob"] = true
	gates["DRAWorkloadResourceClaims"] = true
	return framework.StartForTest(t, framework.Options{
		FeatureGates:  gates,
		RuntimeConfig: framework.RuntimeConfig + ",scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true",
	})
}

func (e *env) labelNamespaceQueue(q string) {
	e.t.Helper()
	ns, err := e.kube.CoreV1().Namespaces().Get(e.ctx, e.ns, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[v1alpha1.QueueLabel] = q
	if _, err := e.kube.CoreV1().Namespaces().Update(e.ctx, ns, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// gangJob is a batch/v1 Job whose pods ask tessera-scheduler for gpus whole GPUs each through
// a ResourceClaimTemplate, with spec.scheduling.schedulingPolicy.gang.minCount = n.
func (e *env) gangJob(name string, n int32, gpus int64) *batchv1.Job {
	e.t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name + "-gpu"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: fixture.GPUClaim(e.ns, "x", gpus).Spec},
	}
	if _, err := e.kube.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.ctx, tmpl, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	pod := fixture.Pod(e.ns, "x")
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(tmpl.Name)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(n), Completions: ptr.To(n), CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template: v1.PodTemplateSpec{Spec: pod.Spec},
			Scheduling: &batchv1.JobSchedulingConfiguration{SchedulingPolicy: &schedulingv1alpha3.WorkloadPodGroupSchedulingPolicy{
				Gang: &schedulingv1alpha3.WorkloadPodGroupGangSchedulingPolicy{MinCount: ptr.To(n)},
			}},
		},
	}
	created, err := e.kube.BatchV1().Jobs(e.ns).Create(e.ctx, job, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create Job: %v", err)
	}
	if created.Spec.Scheduling == nil {
		e.t.Fatal("the API server dropped spec.scheduling: WorkloadWithJob is off")
	}
	return created
}

// upstreamGroupOf waits for the Job controller's PodGroup of job.
func (e *env) upstreamGroupOf(job string) *schedulingv1beta1.PodGroup {
	e.t.Helper()
	var pg *schedulingv1beta1.PodGroup
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := e.kube.SchedulingV1beta1().PodGroups(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			for _, o := range list.Items[i].OwnerReferences {
				if o.Kind == "Job" && o.Name == job {
					pg = &list.Items[i]
					return true, nil
				}
			}
			if strings.HasPrefix(list.Items[i].Name, job) {
				pg = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		e.t.Fatalf("no PodGroup for Job %s: %v", job, err)
	}
	return pg
}

func (e *env) waitUpstreamCondition(name string, status metav1.ConditionStatus) metav1.Condition {
	e.t.Helper()
	return e.waitUpstreamConditionMatching(name, status, "")
}

// waitUpstreamConditionMatching waits for the condition with that status whose message
// contains substr: a gang's reason goes through earlier ones on a loaded machine (its
// claims not created yet by the claim controller) before it settles.
func (e *env) waitUpstreamConditionMatching(name string, status metav1.ConditionStatus, substr string) metav1.Condition {
	e.t.Helper()
	var last metav1.Condition
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pg, err := e.kube.SchedulingV1beta1().PodGroups(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if c := meta.FindStatusCondition(pg.Status.Conditions, schedulingv1beta1.PodGroupInitiallyScheduled); c != nil {
			last = *c
			return c.Status == status && strings.Contains(c.Message, substr), nil
		}
		return false, nil
	}); err != nil {
		e.t.Fatalf("PodGroup %s: %s=%s not reached; last %+v", name, schedulingv1beta1.PodGroupInitiallyScheduled, status, last)
	}
	return last
}

// A batch/v1 Job with spec.scheduling.schedulingPolicy.gang: the Job controller creates a
// Workload and a PodGroup (scheduling.k8s.io/v1beta1) and points its pods at it
// (spec.schedulingGroup); tessera takes the gang from that PodGroup (minCount 4), binds all
// four pods together, and writes the PodGroup's PodGroupInitiallyScheduled condition as the
// kube-scheduler would. A second Job whose gang cannot fit binds nothing and its PodGroup says
// Unschedulable.
func TestJobWithGangSchedulingPolicy(t *testing.T) {
	cp := gangAPIControlPlane(t)
	e := newEnvOn(t, cp)
	e.addNode("a", 4, false, nil)
	e.addNode("b", 4, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	e.labelNamespaceQueue(q)
	e.startScheduler(defaultOptions())

	e.gangJob("train", 4, 1)
	pg := e.upstreamGroupOf("train")
	if pg.Spec.SchedulingPolicy.Gang == nil || pg.Spec.SchedulingPolicy.Gang.MinCount != 4 {
		t.Fatalf("Job controller's PodGroup policy = %+v, want gang of 4", pg.Spec.SchedulingPolicy)
	}
	c := e.waitUpstreamCondition(pg.Name, metav1.ConditionTrue)
	if c.Reason != "Scheduled" {
		t.Errorf("condition = %+v", c)
	}
	// The condition follows the committed bindings; they reach the API server a moment later.
	bound := 0
	_ = wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		bound = 0
		for _, p := range e.pods() {
			if p.Spec.SchedulingGroup == nil || p.Spec.SchedulingGroup.PodGroupName == nil || *p.Spec.SchedulingGroup.PodGroupName != pg.Name {
				continue
			}
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound >= 4, nil
	})
	if bound != 4 {
		t.Fatalf("%d pods of the gang bound, want 4", bound)
	}
	// tessera's own PodGroup mirrors it, for queues and `tessera top`.
	mirror, err := e.sc.PodGroups(e.ns).Get(e.ctx, "podgroup-"+pg.Name)
	if err != nil {
		t.Fatalf("tessera PodGroup for %s: %v", pg.Name, err)
	}
	if mirror.Spec.MinMember != 4 || mirror.Spec.Queue != q {
		t.Errorf("tessera PodGroup spec = %+v", mirror.Spec)
	}
	if c := findCondition(mirror.Status.Conditions, v1alpha1.PodGroupConditionMapped); c == nil || c.Reason != "SchedulingGroup" {
		t.Errorf("Mapped condition = %+v", c)
	}
	e.checkClaims()

	// 4 pods × 4 GPUs do not fit 8 GPUs: nothing binds, the PodGroup says why.
	e.gangJob("big", 4, 4)
	big := e.upstreamGroupOf("big")
	c = e.waitUpstreamConditionMatching(big.Name, metav1.ConditionFalse, "does not fit")
	if c.Reason != schedulingv1beta1.PodGroupReasonUnschedulable || !strings.Contains(c.Message, "does not fit") {
		t.Errorf("big gang condition = %+v", c)
	}
	for _, p := range e.pods() {
		if p.Spec.SchedulingGroup != nil && *p.Spec.SchedulingGroup.PodGroupName == big.Name && p.Spec.NodeName != "" {
			t.Fatalf("pod %s of a gang that does not fit was bound", p.Name)
		}
	}
}

// A hand-made PodGroup (scheduling.k8s.io/v1beta1) with a PodGroup-level ResourceClaim
// (DRAWorkloadResourceClaims): the claim the pods share is allocated once and reserved for
// the PodGroup, not for each pod.
func TestPodGroupLevelClaim(t *testing.T) {
	cp := gangAPIControlPlane(t)
	e := newEnvOn(t, cp)
	e.addNode("a", 4, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	e.labelNamespaceQueue(q)
	shared := fixture.GPUClaim(e.ns, "shared", 1)
	shared.UID = ""
	if _, err := e.kube.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, shared, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "pair"},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
			ResourceClaims:   []schedulingv1beta1.PodGroupResourceClaim{{Name: "shared", ResourceClaimName: ptr.To("shared")}},
		},
	}
	created, err := e.kube.SchedulingV1beta1().PodGroups(e.ns).Create(e.ctx, pg, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	if len(created.Spec.ResourceClaims) != 1 {
		t.Fatal("the API server dropped spec.resourceClaims: DRAWorkloadResourceClaims is off")
	}
	var pods []*v1.Pod
	for i := range 2 {
		p := fixture.Pod(e.ns, fmt.Sprintf("pair-%d", i), "shared")
		p.UID = ""
		p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("pair")}
		c, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, c)
	}
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	claim, err := e.kube.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].Resource != "podgroups" || claim.Status.ReservedFor[0].UID != created.UID {
		t.Fatalf("claim allocation %v reservedFor %+v, want allocated and reserved for PodGroup pair", claim.Status.Allocation != nil, claim.Status.ReservedFor)
	}
	e.waitUpstreamCondition("pair", metav1.ConditionTrue)
}
