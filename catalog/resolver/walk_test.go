package resolver

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tessera-gpu/tessera/catalog"
)

// storeResolver is a resolver whose owner lookups read informer stores filled
// by the test, and whose pods come from a pod lister (WithPodLister).
type storeResolver struct {
	*Resolver
	stores map[schema.GroupVersionKind]cache.Indexer
	pods   cache.Indexer
}

func newStoreResolver(t *testing.T, kinds ...schema.GroupVersionKind) *storeResolver {
	t.Helper()
	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &storeResolver{
		Resolver: &Resolver{mapped: map[types.UID]mappedEntry{}, getters: map[schema.GroupVersionKind]getter{}, full: map[schema.GroupVersionKind]bool{}},
		stores:   map[schema.GroupVersionKind]cache.Indexer{},
		pods:     cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
	}
	s.cat.Store(cat)
	for _, gvk := range kinds {
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		s.stores[gvk] = idx
		s.full[gvk] = true
		lister := cache.NewGenericLister(idx, schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind})
		s.getters[gvk] = func(ns, name string) (metav1.Object, runtime.Object, error) {
			o, err := lister.ByNamespace(ns).Get(name)
			if err != nil {
				return nil, nil, err
			}
			mo, err := meta.Accessor(o)
			return mo, o, err
		}
	}
	s.full[podGVK] = true
	pl := corelisters.NewPodLister(s.pods)
	s.getters[podGVK] = func(ns, name string) (metav1.Object, runtime.Object, error) {
		p, err := pl.Pods(ns).Get(name)
		if err != nil {
			return nil, nil, err
		}
		return p, p, nil
	}
	return s
}

func (s *storeResolver) add(t *testing.T, gvk schema.GroupVersionKind, o runtime.Object) {
	t.Helper()
	if err := s.stores[gvk].Add(o); err != nil {
		t.Fatal(err)
	}
}

var (
	lwsGVK = schema.GroupVersionKind{Group: "leaderworkerset.x-k8s.io", Version: "v1", Kind: "LeaderWorkerSet"}
	stsGVK = appsv1.SchemeGroupVersion.WithKind("StatefulSet")
)

func controller(apiVersion, kind, name string, uid types.UID) []metav1.OwnerReference {
	yes := true
	return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &yes}}
}

// TestResolveThroughPodsAndStatefulSets walks a LeaderWorkerSet's chain as the
// LWS controller builds it: a worker pod is owned by its group's worker
// StatefulSet, which is owned by the group's leader pod, which is owned by the
// leader StatefulSet, owned by the LeaderWorkerSet. StatefulSet and Pod have
// definitions of their own: the topmost known object (the LWS) must win.
func TestResolveThroughPodsAndStatefulSets(t *testing.T) {
	s := newStoreResolver(t, lwsGVK, stsGVK)
	lws := &unstructured.Unstructured{}
	lws.SetGroupVersionKind(lwsGVK)
	lws.SetNamespace("ns")
	lws.SetName("vllm")
	lws.SetUID("lws-uid")
	lws.SetResourceVersion("1")
	_ = unstructured.SetNestedField(lws.Object, int64(2), "spec", "replicas")
	_ = unstructured.SetNestedField(lws.Object, int64(4), "spec", "leaderWorkerTemplate", "size")
	_ = unstructured.SetNestedField(lws.Object, map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "w"}}}}, "spec", "leaderWorkerTemplate", "workerTemplate")
	s.add(t, lwsGVK, lws)
	leaderSts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vllm", UID: "leader-sts", ResourceVersion: "1",
		OwnerReferences: controller("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "vllm", "lws-uid")}}
	s.add(t, stsGVK, leaderSts)
	labels := func(group, worker string) map[string]string {
		return map[string]string{"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": group, "leaderworkerset.sigs.k8s.io/worker-index": worker}
	}
	leader := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vllm-1", UID: "leader-pod", Labels: labels("1", "0"),
		OwnerReferences: controller("apps/v1", "StatefulSet", "vllm", "leader-sts")}}
	if err := s.pods.Add(leader); err != nil {
		t.Fatal(err)
	}
	workerSts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vllm-1", UID: "worker-sts", ResourceVersion: "1",
		OwnerReferences: controller("v1", "Pod", "vllm-1", "leader-pod")}}
	s.add(t, stsGVK, workerSts)
	worker := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vllm-1-2", Labels: labels("1", "2"),
		OwnerReferences: controller("apps/v1", "StatefulSet", "vllm-1", "worker-sts")}}

	ctx := context.Background()
	for _, tc := range []struct {
		pod       *corev1.Pod
		component string
	}{{leader, "leader"}, {worker, "worker"}} {
		pw, err := s.Resolve(ctx, tc.pod)
		if err != nil {
			t.Fatalf("%s: %v", tc.pod.Name, err)
		}
		if pw.GVK != lwsGVK || pw.Name != "vllm" || pw.Component != tc.component || pw.Replica != "1" ||
			pw.Gang == nil || pw.Gang.Name != "group-1" || pw.Gang.MinMember != 4 {
			t.Errorf("%s: %+v gang %+v", tc.pod.Name, pw, pw.Gang)
		}
	}
	a, _ := s.Resolve(ctx, leader)
	b, _ := s.Resolve(ctx, worker)
	if a.GangKey() != b.GangKey() || a.GangKey() != "ns/LeaderWorkerSet/vllm/group-1" {
		t.Errorf("gang keys %q and %q", a.GangKey(), b.GangKey())
	}

	// A StatefulSet nobody owns is itself the workload: no gang.
	lone := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", UID: "db-uid", ResourceVersion: "1"}}
	s.add(t, stsGVK, lone)
	pw, err := s.Resolve(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db-0", OwnerReferences: controller("apps/v1", "StatefulSet", "db", "db-uid")}})
	if err != nil || pw.GVK != stsGVK || pw.Gang != nil {
		t.Errorf("lone StatefulSet: %+v, %v", pw, err)
	}

	// An owner whose UID differs from the reference (deleted and re-created).
	stale := worker.DeepCopy()
	stale.OwnerReferences[0].UID = "old"
	if _, err := s.Resolve(ctx, stale); !errors.Is(err, ErrOwnerNotFound) {
		t.Errorf("stale owner: %v", err)
	}

	// An owner cycle ends at the depth limit with an error, not a hang.
	cyc1 := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1", UID: "c1", OwnerReferences: controller("apps/v1", "StatefulSet", "c2", "c2")}}
	cyc2 := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c2", UID: "c2", OwnerReferences: controller("apps/v1", "StatefulSet", "c1", "c1")}}
	s.add(t, stsGVK, cyc1)
	s.add(t, stsGVK, cyc2)
	if _, err := s.Resolve(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", OwnerReferences: controller("apps/v1", "StatefulSet", "c1", "c1")}}); err == nil {
		t.Error("an owner cycle resolved")
	}
}

// TestOwnerOfAKindNotWatchedYetIsRetried: a JobSet's pod whose JobSet kind has
// no informer yet (its CRD appeared after the resolver looked) must not be
// mapped by its Job (a gang per Job instead of the JobSet's): the resolver says
// retry and asks its rediscovery loop to look for the kind now.
func TestOwnerOfAKindNotWatchedYetIsRetried(t *testing.T) {
	jobGVK := schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}
	s := newStoreResolver(t, jobGVK)
	s.lookAgain = make(chan struct{}, 1)
	job := &unstructured.Unstructured{}
	job.SetGroupVersionKind(jobGVK)
	job.SetNamespace("ns")
	job.SetName("train-workers-0")
	job.SetUID("job-uid")
	job.SetResourceVersion("1")
	job.SetOwnerReferences(controller("jobset.x-k8s.io/v1alpha2", "JobSet", "train", "js-uid"))
	_ = unstructured.SetNestedField(job.Object, map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "w"}}}}, "spec", "template")
	s.add(t, jobGVK, job)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "train-workers-0-0", OwnerReferences: controller("batch/v1", "Job", "train-workers-0", "job-uid")}}

	_, err := s.Resolve(context.Background(), pod)
	if !errors.Is(err, ErrOwnerNotFound) {
		t.Fatalf("got %v, want ErrOwnerNotFound (retry), not the Job's gang", err)
	}
	select {
	case <-s.lookAgain:
	default:
		t.Error("the resolver did not ask to look for the JobSet kind")
	}
	// A kind no definition names still ends the walk: the Job is the workload.
	job.SetOwnerReferences(controller("example.com/v1", "Trainer", "t", "t-uid"))
	s.add(t, jobGVK, job)
	pw, err := s.Resolve(context.Background(), pod)
	if err != nil || pw.GVK != jobGVK {
		t.Errorf("owner of an unknown kind: %+v, %v", pw, err)
	}
}
