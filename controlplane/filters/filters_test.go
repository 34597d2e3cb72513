package filters

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

func node(name string, labels map[string]string) *v1.Node {
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1.LabelHostname] = name
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: v1.NodeStatus{Allocatable: v1.ResourceList{
			v1.ResourceCPU: resource.MustParse("8"), v1.ResourceMemory: resource.MustParse("32Gi"), v1.ResourcePods: resource.MustParse("110"),
		}},
	}
}

func pod(name string, mutate ...func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"app": "train"}},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}}}},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func antiAffinity(p *v1.Pod) {
	p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}},
			TopologyKey:   v1.LabelHostname,
		}},
	}}
}

type env struct {
	t       *testing.T
	ctx     context.Context
	filters *Filters
}

func newEnv(t *testing.T, volumes bool, objs ...runtime.Object) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset(objs...)
	inf := informers.NewSharedInformerFactory(client, 0)
	f, err := New(ctx, Config{Informers: inf, Client: client, Volumes: volumes})
	if err != nil {
		t.Fatal(err)
	}
	inf.Start(ctx.Done())
	inf.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { cancel(); inf.Shutdown() })
	return &env{t: t, ctx: ctx, filters: f}
}

// fits runs the static and dynamic filters of p on node within session s.
func fits(t *testing.T, s *Session, ps *PodState, node string) string {
	t.Helper()
	if r := s.StaticFilter(ps, node); r != "" {
		return r
	}
	r, err := s.DynamicFilter(ps, node)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// place prepares p, checks it fits node, and assumes it there.
func place(t *testing.T, s *Session, p *v1.Pod, node string) *PodState {
	t.Helper()
	ps, err := s.Prepare(p)
	if err != nil {
		t.Fatal(err)
	}
	if r := fits(t, s, ps, node); r != "" {
		t.Fatalf("pod %s does not fit %s: %s", p.Name, node, r)
	}
	if r, err := s.Assume(ps, node); err != nil || r != "" {
		t.Fatalf("assume %s on %s: %q %v", p.Name, node, r, err)
	}
	return ps
}

func TestTentativePodsCountForAntiAffinity(t *testing.T) {
	e := newEnv(t, false)
	view := NewView([]*v1.Node{node("n1", nil), node("n2", nil)}, nil, nil)
	s := e.filters.Begin(e.ctx, view)
	defer s.End()
	a, b := pod("a", antiAffinity), pod("b", antiAffinity)
	// Both states are prepared before either pod is placed, as the solver does.
	psB, err := s.Prepare(b)
	if err != nil {
		t.Fatal(err)
	}
	place(t, s, a, "n1")
	if r := fits(t, s, psB, "n1"); !strings.Contains(r, "anti-affinity") {
		t.Fatalf("b on n1 next to tentative a: got %q, want an anti-affinity rejection", r)
	}
	if r := fits(t, s, psB, "n2"); r != "" {
		t.Fatalf("b on n2: %s", r)
	}
	// Taking a back makes n1 fit again (RemovePod on b's state).
	s.Forget()
	if r := fits(t, s, psB, "n1"); r != "" {
		t.Fatalf("b on n1 after a was taken back: %s", r)
	}
}

func TestTentativePodsCountForSpreadAndPorts(t *testing.T) {
	e := newEnv(t, false)
	nodes := []*v1.Node{
		node("a1", map[string]string{"rack": "a"}), node("a2", map[string]string{"rack": "a"}),
		node("b1", map[string]string{"rack": "b"}),
	}
	view := NewView(nodes, nil, nil)
	s := e.filters.Begin(e.ctx, view)
	defer s.End()
	spread := func(p *v1.Pod) {
		p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "rack", WhenUnsatisfiable: v1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}},
		}}
	}
	port := func(p *v1.Pod) {
		p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 8080, HostPort: 8080, Protocol: v1.ProtocolTCP}}
	}
	p1, p2 := pod("p1", spread, port), pod("p2", spread, port)
	ps2, err := s.Prepare(p2)
	if err != nil {
		t.Fatal(err)
	}
	place(t, s, p1, "a1")
	if r := fits(t, s, ps2, "a2"); !strings.Contains(r, "topology spread") {
		t.Fatalf("p2 on rack a with p1 there: got %q, want a spread rejection", r)
	}
	if r := fits(t, s, ps2, "a1"); r == "" {
		t.Fatal("p2 on a1 fits although p1 holds host port 8080 there (and rack a is full)")
	}
	if r := fits(t, s, ps2, "b1"); r != "" {
		t.Fatalf("p2 on rack b: %s", r)
	}
}

func TestStaticFiltersAreTheKubeSchedulers(t *testing.T) {
	e := newEnv(t, false)
	tainted := node("tainted", nil)
	tainted.Spec.Taints = []v1.Taint{{Key: "gpu", Effect: v1.TaintEffectNoSchedule}}
	cordoned := node("cordoned", nil)
	cordoned.Spec.Unschedulable = true
	small := node("small", nil)
	small.Status.Allocatable[v1.ResourceCPU] = resource.MustParse("500m")
	view := NewView([]*v1.Node{tainted, cordoned, small, node("plain", map[string]string{"zone": "z1"})}, nil, nil)
	s := e.filters.Begin(e.ctx, view)
	defer s.End()
	ps, err := s.Prepare(pod("p", func(p *v1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "z1"} }))
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]string{"tainted": "untolerated taint", "cordoned": "unschedulable", "small": "affinity/selector", "plain": ""} {
		if got := fits(t, s, ps, n); (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("node %s: got %q, want %q", n, got, want)
		}
	}
	ps, err = s.Prepare(pod("q"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fits(t, s, ps, "small"); !strings.Contains(got, "Insufficient cpu") {
		t.Errorf("1 CPU on a 500m node: got %q", got)
	}
	if got, want := e.filters.Plugins(), []string{"NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity", "NodePorts", "NodeResourcesFit", "PodTopologySpread", "InterPodAffinity"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("plugins without volumes: %v, want %v", got, want)
	}
}

func wffcClass() *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "local"},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
	}
}

func localPV(name, node string) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			Capacity:         v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: "local",
			PersistentVolumeSource: v1.PersistentVolumeSource{
				Local: &v1.LocalVolumeSource{Path: "/mnt/" + name},
			},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeAvailable},
	}
}

func pvc(name string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptr.To("local"),
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("5Gi")}},
		},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimPending},
	}
}

func withPVC(name string) func(*v1.Pod) {
	return func(p *v1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: name},
		}})
	}
}

// Two gang pods with their own WaitForFirstConsumer claims and one local PV per node: once
// the first pod's volume is assumed on n1, the second pod no longer fits n1.
func TestTentativeVolumeBindings(t *testing.T) {
	e := newEnv(t, true, wffcClass(), localPV("pv-n1", "n1"), localPV("pv-n2", "n2"), pvc("data-0"), pvc("data-1"))
	view := NewView([]*v1.Node{node("n1", nil), node("n2", nil), node("n3", nil)}, nil, nil)
	s := e.filters.Begin(e.ctx, view)
	defer s.End()
	p0, p1 := pod("p0", withPVC("data-0")), pod("p1", withPVC("data-1"))
	ps1, err := s.Prepare(p1)
	if err != nil {
		t.Fatal(err)
	}
	if r := fits(t, s, ps1, "n3"); !strings.Contains(r, "didn't find available persistent volumes") {
		t.Fatalf("n3 has no PV: got %q", r)
	}
	ps0 := place(t, s, p0, "n1")
	if r := fits(t, s, ps1, "n1"); r == "" {
		t.Fatal("p1 fits n1 although p0's claim took the only PV there")
	}
	if r := fits(t, s, ps1, "n2"); r != "" {
		t.Fatalf("p1 on n2: %s", r)
	}
	v := s.VolumesOf(ps0, "n1")
	if !v.Any() {
		t.Fatal("p0 has volumes to bind")
	}
	s.Forget()
	if r := fits(t, s, ps1, "n1"); r != "" {
		t.Fatalf("after p0 was taken back, p1 fits n1 again: %s", r)
	}
}
