package scheduler_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

func TestSixteenPodGangBindsOnTwoNodes(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("a", 8, false, nil)
	b := e.addNode("b", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gang("g16", q, 16, gpuClaim)
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	perNode := map[string]int{}
	for _, p := range e.pods() {
		perNode[p.Spec.NodeName]++
	}
	if perNode[a] != 8 || perNode[b] != 8 {
		t.Fatalf("pods per node = %v, want 8 on each", perNode)
	}
	e.checkClaims()
	c := e.waitCondition("g16", v1alpha1.PodGroupConditionScheduled, metav1.ConditionTrue, nil)
	if !strings.Contains(c.Message, "16 of 16 pods bound") {
		t.Errorf("Scheduled condition: %q", c.Message)
	}
	// Every claim is allocated on its pod's node and reserved for it.
	claims, _ := e.kube.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	byName := e.pods()
	for _, cl := range claims.Items {
		pod := byName[cl.Name]
		if cl.Status.Allocation == nil || len(cl.Status.ReservedFor) != 1 || cl.Status.ReservedFor[0].UID != pod.UID {
			t.Fatalf("claim %s: allocation %v reservedFor %v", cl.Name, cl.Status.Allocation != nil, cl.Status.ReservedFor)
		}
		if r := cl.Status.Allocation.Devices.Results[0]; r.Pool != pod.Spec.NodeName {
			t.Fatalf("claim %s has device %s/%s but pod is on %s", cl.Name, r.Pool, r.Device, pod.Spec.NodeName)
		}
		if !slices.Contains(cl.Finalizers, resourceapi.Finalizer) {
			t.Fatalf("claim %s lacks the finalizer the claim controller needs to deallocate it", cl.Name)
		}
	}
	// An Event on the PodGroup, and metrics.
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := e.kube.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PodGroup,involvedObject.name=g16"})
		if err != nil {
			return false, nil
		}
		for _, ev := range evs.Items {
			if ev.Reason == v1alpha1.ReasonScheduled && strings.Contains(ev.Message, "16 pods bound on 2 nodes (16 GPU units)") {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error("no Scheduled event on the PodGroup")
	}
	if v := metricValue(t, "tessera_scheduler_pods_bound_total", nil); v < 16 {
		t.Errorf("pods_bound_total = %g, want >= 16", v)
	}
	if v := metricValue(t, "tessera_scheduler_queue_allocated", map[string]string{"queue": q, "resource": "gpu"}); v != 16 {
		t.Errorf("queue_allocated{gpu} = %g, want 16", v)
	}
	if v := metricValue(t, "tessera_scheduler_solve_duration_seconds", nil); v < 1 {
		t.Errorf("solve_duration_seconds has %g samples, want at least 1", v)
	}
}

// metricValue reads a counter or gauge (the sample count of a histogram) from the
// component-base legacy registry.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// TestRecreatedPodJoinsItsGang: a pod of a running gang fails and its operator replaces it;
// the new pod is placed as the gang's missing member, next to the pods still bound.
func TestRecreatedPodJoinsItsGang(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gang("g", q, 4, gpuClaim)
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	e.markRunning()
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, pods[3].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	created := e.podWithClaim("g-3-replacement", func(p *v1.Pod) { p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: "g"} })
	e.waitBound([]*v1.Pod{created}, 60*time.Second)
	e.checkClaims()
	e.waitCondition("g", v1alpha1.PodGroupConditionScheduled, metav1.ConditionTrue, func(c metav1.Condition) bool {
		return strings.Contains(c.Message, "4 of 4 pods bound")
	})
}

func TestGangThatDoesNotFitBindsNothingAndSaysWhy(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("a", 8, false, nil)
	b := e.addNode("b", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	e.startScheduler(defaultOptions())
	// Take one GPU on each node with single-pod gangs pinned by node selector.
	var blockers []*v1.Pod
	for _, n := range []string{a, b} {
		c := fixture.GPUClaim(e.ns, "block-"+n, 1)
		c.UID = ""
		if _, err := e.kube.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := fixture.Pod(e.ns, "block-"+n, c.Name)
		p.UID = ""
		p.Labels = map[string]string{v1alpha1.QueueLabel: q}
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": n}
		created, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		blockers = append(blockers, created)
	}
	e.waitBound(blockers, 30*time.Second)
	// The blockers had no PodGroup: the mapper made one-pod gangs for them, with a reason.
	pg, err := e.sc.PodGroups(e.ns).Get(e.ctx, "pod-"+blockers[0].Name)
	if err != nil {
		t.Fatalf("fallback PodGroup: %v", err)
	}
	if pg.Spec.MinMember != 1 || pg.Spec.Queue != q {
		t.Fatalf("fallback PodGroup spec = %+v", pg.Spec)
	}

	pods := e.gang("g16", q, 16, gpuClaim)
	c := e.waitCondition("g16", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return c.Reason == v1alpha1.ReasonUnschedulable
	})
	for _, want := range []string{"gang of 16 pods does not fit", "at most 14 placed together", "14 free GPU units on 2 nodes"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("condition message %q lacks %q", c.Message, want)
		}
	}
	time.Sleep(time.Second)
	if n := e.boundCount(pods); n != 0 {
		t.Fatalf("%d pods of a gang that does not fit were bound", n)
	}
	// The waiting pods say why, as pods of the kube-scheduler do.
	for _, p := range e.pods() {
		if !strings.HasPrefix(p.Name, "g16-") {
			continue
		}
		var cond *v1.PodCondition
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == v1.PodScheduled {
				cond = &p.Status.Conditions[i]
			}
		}
		if cond == nil || cond.Status != v1.ConditionFalse || cond.Reason != v1.PodReasonUnschedulable || !strings.Contains(cond.Message, "at most 14 placed together") {
			t.Fatalf("pod %s PodScheduled condition = %+v", p.Name, cond)
		}
	}
	claims, _ := e.kube.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	for _, cl := range claims.Items {
		if strings.HasPrefix(cl.Name, "g16-") && cl.Status.Allocation != nil {
			t.Fatalf("claim %s of the unplaced gang is allocated", cl.Name)
		}
	}

	// Releasing: the blockers finish, the claim controller releases their claims, and the
	// scheduler sees the capacity come back without a restart.
	e.finish(blockers)
	e.waitBound(pods, 60*time.Second)
	e.checkClaims()
}

// TestFirstFitStarvesButSolverPlaces: one partitionable GPU. Pod a prefers a whole GPU but
// accepts a 3g.40gb MIG device, pod b needs a 3g.40gb device. Placing pod by pod, a takes the
// whole GPU and b never fits; the solver re-allocates both and the whole gang binds.
func TestFirstFitStarvesButSolverPlaces(t *testing.T) {
	e := newEnv(t)
	node := e.addNode("mig", 1, true, nil)
	q := e.addQueue("q", "", "", "", 1)
	claims := map[string]func(ns, name string) *resourceapi.ResourceClaim{
		"a": func(ns, name string) *resourceapi.ResourceClaim { return fixture.GPUOrMIGClaim(ns, name, "3g.40gb") },
		"b": func(ns, name string) *resourceapi.ResourceClaim { return fixture.MIGClaim(ns, name, "3g.40gb") },
	}
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "mixed"}, Spec: v1alpha1.PodGroupSpec{MinMember: 2, Queue: q}}
	if _, err := e.sc.PodGroups(e.ns).Create(e.ctx, pg); err != nil {
		t.Fatal(err)
	}
	var pods []*v1.Pod
	for _, name := range []string{"a", "b"} {
		c := claims[name](e.ns, name)
		c.UID = ""
		if _, err := e.kube.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		p := fixture.Pod(e.ns, name, c.Name)
		p.UID = ""
		p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: "mixed"}
		created, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, created)
	}
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	e.checkClaims()
	for _, name := range []string{"a", "b"} {
		cl, err := e.kube.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r := cl.Status.Allocation.Devices.Results[0]
		if r.Pool != node || !strings.HasPrefix(r.Device, "gpu-0-mig-3g-40gb-") {
			t.Errorf("claim %s got %s/%s, want a 3g.40gb MIG device of %s", name, r.Pool, r.Device, node)
		}
	}
	// Queue usage in GPU units: two 3g.40gb devices use 4+4 of 8 memory slices.
	waitQueueGPU(t, e, q, "1")
}

func waitQueueGPU(t *testing.T, e *env, queue, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got string
	for time.Now().Before(deadline) {
		q, err := e.sc.Queues().Get(e.ctx, queue)
		if err == nil {
			v := q.Status.Allocated[v1alpha1.ResourceGPU]
			got = v.String()
			if v.Cmp(mustQuantity(want)) == 0 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("queue %s allocated gpu = %s, want %s", queue, got, want)
}

func TestGangStaysInOneTopologyDomain(t *testing.T) {
	e := newEnv(t)
	rack := func(r string) map[string]string { return map[string]string{"example.com/rack": r} }
	e.addNode("a1", 4, false, rack("a"))
	e.addNode("a2", 4, false, rack("a"))
	b1 := e.addNode("b1", 8, false, rack("b"))
	b2 := e.addNode("b2", 8, false, rack("b"))
	q := e.addQueue("q", "", "", "", 1)
	// 12 pods fit in the cluster's 24 GPUs in many ways, but in one rack only in b.
	inRack := func(pg *v1alpha1.PodGroup) {
		pg.Spec.Topology = &v1alpha1.TopologyConstraint{Key: "example.com/rack", Mode: v1alpha1.TopologyRequired}
	}
	pods := e.gang("g12", q, 12, gpuClaim, inRack)
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	for _, p := range e.pods() {
		if p.Spec.NodeName != b1 && p.Spec.NodeName != b2 {
			t.Fatalf("pod %s on %s, outside rack b", p.Name, p.Spec.NodeName)
		}
	}
	// 10 more pods in one rack: rack a has 8, rack b 4 left: never binds, and says why.
	more := e.gang("g10", q, 10, gpuClaim, inRack)
	c := e.waitCondition("g10", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return strings.Contains(c.Message, "largest topology domain example.com/rack=a has 8 free")
	})
	t.Logf("condition: %s", c.Message)
	if n := e.boundCount(more); n != 0 {
		t.Fatalf("%d pods bound across racks", n)
	}
}

// TestElasticGangPlacesWhatFits: minMember 2 of 4 pods on a node with 3 free GPUs: the gang
// starts with the pods that fit (at least minMember) instead of waiting for all 4.
func TestElasticGangPlacesWhatFits(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 3, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gang("elastic", q, 4, gpuClaim, func(pg *v1alpha1.PodGroup) { pg.Spec.MinMember = 2 })
	e.startScheduler(defaultOptions())
	c := e.waitCondition("elastic", v1alpha1.PodGroupConditionScheduled, metav1.ConditionTrue, func(c metav1.Condition) bool {
		return strings.HasPrefix(c.Message, "3 of 4 pods bound; 1 more wait: Unschedulable")
	})
	t.Logf("condition: %s", c.Message)
	if n := e.waitBoundCount(pods, 3); n != 3 {
		t.Fatalf("%d pods bound, want 3", n)
	}
	e.checkClaims()
}

// A gang whose pods complete one by one stays Running (completed pods count
// toward minMember) and ends Finished, with the counts in its status, instead
// of falling back to Pending as its members disappear.
func TestFinishingGangIsRunningThenFinished(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gang("g4", q, 4, gpuClaim)
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	e.markRunning()
	waitPhase := func(want v1alpha1.PodGroupPhase, check func(v1alpha1.PodGroupStatus) bool) v1alpha1.PodGroupStatus {
		t.Helper()
		var st v1alpha1.PodGroupStatus
		err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			pg, err := e.sc.PodGroups(e.ns).Get(ctx, "g4")
			if err != nil {
				return false, nil
			}
			st = pg.Status
			return st.Phase == want && (check == nil || check(st)), nil
		})
		if err != nil {
			t.Fatalf("PodGroup g4 never reached %s: status %+v", want, st)
		}
		return st
	}
	waitPhase(v1alpha1.PodGroupRunning, func(st v1alpha1.PodGroupStatus) bool { return st.Running == 4 })
	e.finish(pods[:2])
	st := waitPhase(v1alpha1.PodGroupRunning, func(st v1alpha1.PodGroupStatus) bool { return st.Succeeded == 2 })
	if st.Running != 2 || st.Members != 2 {
		t.Errorf("with 2 of 4 pods done: status %+v, want 2 running members and 2 succeeded", st)
	}
	e.finish(pods[2:])
	st = waitPhase(v1alpha1.PodGroupFinished, nil)
	if st.Succeeded != 4 || st.Failed != 0 || st.Members != 0 {
		t.Errorf("finished gang status %+v, want 4 succeeded", st)
	}
}
