package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/test/framework"
)

// gangWith creates a gang of n one-GPU pods, each changed by mutate(i, pod) before it is
// created.
func (e *env) gangWith(name, queue string, n int, mutate func(i int, p *v1.Pod)) []*v1.Pod {
	e.t.Helper()
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: queue}}
	if _, err := e.sc.PodGroups(e.ns).Create(e.ctx, pg); err != nil {
		e.t.Fatalf("create PodGroup: %v", err)
	}
	var pods []*v1.Pod
	for i := range n {
		c := fixture.GPUClaim(e.ns, fmt.Sprintf("%s-%d", name, i), 1)
		c.UID = ""
		if _, err := e.kube.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("create claim: %v", err)
		}
		p := fixture.Pod(e.ns, fmt.Sprintf("%s-%d", name, i), c.Name)
		p.UID = ""
		p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: name}
		p.Labels = map[string]string{"gang": name}
		if mutate != nil {
			mutate(i, p)
		}
		created, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatalf("create pod: %v", err)
		}
		pods = append(pods, created)
	}
	return pods
}

func (e *env) nodesOf(pods []*v1.Pod) map[string]int {
	all := e.pods()
	out := map[string]int{}
	for _, p := range pods {
		out[all[p.Name].Spec.NodeName]++
	}
	return out
}

// Required pod anti-affinity between the workers of a gang: on four 8-GPU nodes, where
// bin-packing alone puts a 4-pod gang on one node, each pod lands on its own node.
func TestGangWithAntiAffinityLandsOnFourNodes(t *testing.T) {
	e := newEnv(t)
	for i := range 4 {
		e.addNode(fmt.Sprintf("n%d", i), 8, false, nil)
	}
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gangWith("anti", q, 4, func(_ int, p *v1.Pod) {
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gang": "anti"}}, TopologyKey: v1.LabelHostname,
		}}}}
	})
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 60*time.Second)
	if got := e.nodesOf(pods); len(got) != 4 {
		t.Fatalf("pods per node = %v, want one on each of 4 nodes", got)
	}
}

// maxSkew 1 across two racks holds for a gang although bin-packing prefers the fuller rack.
func TestGangSpreadAcrossRacks(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("a", 8, false, map[string]string{"rack": "a"})
	b := e.addNode("b", 8, false, map[string]string{"rack": "b"})
	q := e.addQueue("q", "", "", "", 1)
	e.startScheduler(defaultOptions())
	// Rack a gets busier first, so bin-packing alone would put the whole gang there.
	busy := e.gangWith("busy", q, 2, func(_ int, p *v1.Pod) { p.Spec.NodeSelector = map[string]string{"rack": "a"} })
	e.waitBound(busy, 60*time.Second)
	pods := e.gangWith("spread", q, 4, func(_ int, p *v1.Pod) {
		p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "rack", WhenUnsatisfiable: v1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gang": "spread"}},
		}}
	})
	e.waitBound(pods, 60*time.Second)
	if got := e.nodesOf(pods); got[a] != 2 || got[b] != 2 {
		t.Fatalf("pods per rack = %v, want 2 and 2", got)
	}
}

// A pod already on node a holds host port 29500: the gang's pods that want it go elsewhere,
// one per node.
func TestGangAvoidsHostPortClash(t *testing.T) {
	e := newEnv(t)
	a := e.addNode("a", 8, false, nil)
	b := e.addNode("b", 8, false, nil)
	c := e.addNode("c", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	port := func(_ int, p *v1.Pod) {
		p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 29500, HostPort: 29500, Protocol: v1.ProtocolTCP}}
	}
	holder := e.gangWith("holder", q, 1, func(i int, p *v1.Pod) { port(i, p); p.Spec.NodeSelector = map[string]string{v1.LabelHostname: a} })
	e.startScheduler(defaultOptions())
	e.waitBound(holder, 60*time.Second)
	pods := e.gangWith("ports", q, 2, port)
	e.waitBound(pods, 60*time.Second)
	if got := e.nodesOf(pods); got[a] != 0 || got[b] != 1 || got[c] != 1 {
		t.Fatalf("pods per node = %v, want one on each of %s and %s (port held on %s)", got, b, c, a)
	}
}

func (e *env) storage(pvs map[string]string) {
	e.t.Helper()
	class := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: e.id + "-local"}, Provisioner: "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
	if _, err := e.kube.StorageV1().StorageClasses().Create(e.ctx, class, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = e.kube.StorageV1().StorageClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	for name, node := range pvs {
		pv := &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: e.id + "-" + name},
			Spec: v1.PersistentVolumeSpec{
				Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
				AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				StorageClassName:       class.Name,
				PersistentVolumeSource: v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt/" + name}},
				NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
					MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
				}}}},
			},
		}
		created, err := e.kube.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		// Without a PV controller nothing marks the new PV Available, as the controller's
		// first sync would (with one, it may do so at the same time).
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if created.Status.Phase == v1.VolumeAvailable {
				return nil
			}
			created.Status.Phase = v1.VolumeAvailable
			_, err := e.kube.CoreV1().PersistentVolumes().UpdateStatus(e.ctx, created, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				created, _ = e.kube.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{})
			}
			return err
		}); err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() {
			_ = e.kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
		})
	}
}

func (e *env) pvc(name string) {
	e.t.Helper()
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, StorageClassName: ptr.To(e.id + "-local"),
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("5Gi")}},
		},
	}
	if _, err := e.kube.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func withVolume(claim string) func(int, *v1.Pod) {
	return func(i int, p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: fmt.Sprintf("%s-%d", claim, i)},
		}})
	}
}

// A gang of 4 with a WaitForFirstConsumer PVC each and static local PVs on 4 of 5 nodes: the
// pods land on the PVs' nodes, the committer binds the volumes (the volume binder's PreBind)
// before the pods, and the PV controller binds every claim. This control plane runs the
// persistentvolume-binder controller, which the shared one does not.
func TestGangWithWaitForFirstConsumerVolumesBinds(t *testing.T) {
	cp := framework.StartForTest(t, framework.Options{Controllers: append(append([]string(nil), framework.DefaultControllers...), "persistentvolume-binder-controller")})
	e := newEnvOn(t, cp)
	pvNodes := map[string]string{}
	for i := range 5 {
		n := e.addNode(fmt.Sprintf("n%d", i), 8, false, nil)
		if i > 0 {
			pvNodes[fmt.Sprintf("pv-%d", i)] = n
		}
	}
	e.storage(pvNodes)
	q := e.addQueue("q", "", "", "", 1)
	for i := range 4 {
		e.pvc(fmt.Sprintf("data-%d", i))
	}
	pods := e.gangWith("vol", q, 4, withVolume("data"))
	e.startScheduler(defaultOptions())
	e.waitBound(pods, 90*time.Second)
	all := e.pods()
	onPVNode := map[string]bool{}
	for _, n := range pvNodes {
		onPVNode[n] = true
	}
	for _, p := range pods {
		if n := all[p.Name].Spec.NodeName; !onPVNode[n] {
			t.Fatalf("pod %s on %s, which has no PV", p.Name, n)
		}
	}
	for i := range 4 {
		pvc, err := e.kube.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, fmt.Sprintf("data-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" {
			t.Fatalf("claim %s: phase %s volume %q, want Bound", pvc.Name, pvc.Status.Phase, pvc.Spec.VolumeName)
		}
		pv, err := e.kube.CoreV1().PersistentVolumes().Get(e.ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod := all[fmt.Sprintf("vol-%d", i)]
		if want := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]; pod.Spec.NodeName != want {
			t.Fatalf("pod %s on %s but its volume %s is on %s", pod.Name, pod.Spec.NodeName, pv.Name, want)
		}
	}
}

// Without a PV controller a volume never binds: the commit fails after the volume bind
// timeout and is undone like a claim — the pod stays unbound, its ResourceClaim is released,
// the PV's claimRef is taken back — and the gang says CommitFailed.
func TestVolumeThatCannotBindFailsTheCommit(t *testing.T) {
	e := newEnv(t)
	n := e.addNode("a", 8, false, nil)
	e.storage(map[string]string{"pv-a": n})
	q := e.addQueue("q", "", "", "", 1)
	e.pvc("data-0")
	pods := e.gangWith("vol", q, 1, withVolume("data"))
	opts := defaultOptions()
	opts.VolumeBindTimeout = 2 * time.Second
	e.startScheduler(opts)
	e.waitCondition("vol", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return c.Reason == v1alpha1.ReasonCommitFailed && strings.Contains(c.Message, "volumes")
	})
	if got := e.boundCount(pods); got != 0 {
		t.Fatalf("%d pods bound although their volume could not bind", got)
	}
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := e.kube.ResourceV1().ResourceClaims(e.ns).Get(ctx, "vol-0", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pv, err := e.kube.CoreV1().PersistentVolumes().Get(ctx, e.id+"-pv-a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		// The gang is retried, so look for a moment in which nothing is held.
		return c.Status.Allocation == nil && pv.Spec.ClaimRef == nil, nil
	}); err != nil {
		t.Fatalf("claim and PV not released after the failed commit: %v", err)
	}
}

// A binding that fails part-way is completed within one period: the failed bindings are
// retried and the whole gang binds.
func TestPartialBindingIsCompleted(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gang("g", q, 4, gpuClaim)
	var mu sync.Mutex
	failed := map[string]int{}
	opts := defaultOptions()
	opts.Hooks.BeforeBind = func(p *v1.Pod, attempt int) error {
		mu.Lock()
		defer mu.Unlock()
		if p.Name == "g-2" && attempt == 0 {
			failed[p.Name]++
			return errors.New("injected: API server unavailable")
		}
		return nil
	}
	e.startScheduler(opts)
	e.waitBound(pods, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if failed["g-2"] == 0 {
		t.Fatal("the injected binding failure never happened")
	}
	e.checkClaims()
}

// A binding that keeps failing part-way is rolled back within one period: the pods already
// bound are evicted (no gang is left with some pods bound and others waiting), the claims of
// the pod that never bound are released, and the gang says so. (Without a kubelet the evicted
// pods stay Terminating.)
func TestPartialBindingIsRolledBack(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	pods := e.gang("g", q, 4, gpuClaim)
	opts := defaultOptions()
	opts.Period = 500 * time.Millisecond
	opts.Hooks.BeforeBind = func(p *v1.Pod, _ int) error {
		if p.Name == "g-3" {
			return errors.New("injected: binding refused")
		}
		return nil
	}
	start := time.Now()
	e.startScheduler(opts)
	if err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := e.kube.CoreV1().Events(e.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PodGroup,involvedObject.name=g,reason=BindRolledBack"})
		return err == nil && len(evs.Items) > 0, nil
	}); err != nil {
		t.Fatal("no BindRolledBack event")
	}
	// Every pod that was bound is going away: none is left bound while g-3 waits.
	remaining := e.pods()
	for _, p := range pods {
		if cur := remaining[p.Name]; cur != nil && cur.Spec.NodeName != "" && cur.DeletionTimestamp == nil {
			t.Fatalf("pod %s is still bound after the rollback", p.Name)
		}
	}
	if cur := remaining["g-3"]; cur == nil || cur.Spec.NodeName != "" {
		t.Fatalf("g-3 should still be there, unbound: %+v", cur)
	}
	t.Logf("rolled back %s after the scheduler started (period %s)", time.Since(start).Round(time.Millisecond), opts.Period)
	if err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := e.kube.ResourceV1().ResourceClaims(e.ns).Get(ctx, "g-3", metav1.GetOptions{})
		return err == nil && c.Status.Allocation == nil, nil
	}); err != nil {
		t.Fatal("claim of the pod that never bound was not released")
	}
}

var _ = resourceapi.Finalizer
