package mapper

import (
	"context"
	"errors"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/catalog"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

type fakeResolver struct {
	wl  *Workload
	err error
}

func (f fakeResolver) Resolve(context.Context, *v1.Pod) (*Workload, error) { return f.wl, f.err }

func pod(labels, annotations map[string]string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "worker-0", UID: "u1", Labels: labels, Annotations: annotations},
		Spec: v1.PodSpec{Priority: ptr.To[int32](7)}}
}

func TestMap(t *testing.T) {
	nsLabels := func(string) map[string]string { return map[string]string{v1alpha1.QueueLabel: "ns-queue"} }
	job := &Workload{APIVersion: "kubeflow.org/v1", Kind: "PyTorchJob", Name: "train", UID: "w1", Component: "worker",
		Gang: "train-job", MinMember: 4, Labels: map[string]string{v1alpha1.QueueLabel: "wl-queue"}}
	for _, tc := range []struct {
		name                 string
		m                    Mapper
		pod                  *v1.Pod
		group, queue, reason string
		minMember            int32
		desired, retry       bool
	}{
		{name: "annotation names a hand-made group", m: Mapper{Resolver: fakeResolver{wl: job}}, pod: pod(nil, map[string]string{v1alpha1.PodGroupAnnotation: "mine"}),
			group: "mine", reason: v1alpha1.ReasonManual},
		{name: "catalog gang, workload queue wins", m: Mapper{Resolver: fakeResolver{wl: job}, NamespaceLabels: nsLabels}, pod: pod(map[string]string{v1alpha1.QueueLabel: "pod-queue"}, nil),
			group: "train-job", queue: "wl-queue", reason: v1alpha1.ReasonCatalog, minMember: 4, desired: true},
		{name: "unknown kind falls back to one pod, pod queue", m: Mapper{Resolver: fakeResolver{}, NamespaceLabels: nsLabels}, pod: pod(map[string]string{v1alpha1.QueueLabel: "pod-queue"}, nil),
			group: "pod-worker-0", queue: "pod-queue", reason: v1alpha1.ReasonUnknownWorkload, minMember: 1, desired: true},
		{name: "namespace default queue", m: Mapper{NamespaceLabels: nsLabels}, pod: pod(nil, nil),
			group: "pod-worker-0", queue: "ns-queue", reason: v1alpha1.ReasonUnknownWorkload, minMember: 1, desired: true},
		{name: "no queue anywhere", m: Mapper{}, pod: pod(nil, nil),
			group: "pod-worker-0", queue: "", reason: v1alpha1.ReasonUnknownWorkload, minMember: 1, desired: true},
		{name: "catalog error falls back with the reason", m: Mapper{Resolver: fakeResolver{err: errors.New("jq failed")}}, pod: pod(nil, nil),
			group: "pod-worker-0", reason: v1alpha1.ReasonCatalogUnavailable, minMember: 1, desired: true},
		{name: "no component matches: its own reason", m: Mapper{Resolver: fakeResolver{err: fmt.Errorf("PyTorchJob a/train: %w", catalog.ErrNoComponent)}}, pod: pod(nil, nil),
			group: "pod-worker-0", reason: v1alpha1.ReasonNoComponent, minMember: 1, desired: true},
		{name: "owner not cached yet: retry", m: Mapper{Resolver: fakeResolver{err: fmt.Errorf("%w: x", ErrRetry)}}, pod: pod(nil, nil), retry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.m.Map(context.Background(), tc.pod)
			if got.Retry != tc.retry {
				t.Fatalf("Retry = %v", got.Retry)
			}
			if tc.retry {
				return
			}
			if got.Group != tc.group || got.Reason != tc.reason || (got.Desired != nil) != tc.desired {
				t.Fatalf("got group %q reason %q desired %v", got.Group, got.Reason, got.Desired != nil)
			}
			if got.Desired != nil {
				if got.Desired.Spec.Queue != tc.queue || got.Desired.Spec.MinMember != tc.minMember || got.Desired.Namespace != "ns" {
					t.Fatalf("desired spec = %+v", got.Desired.Spec)
				}
				if got.Desired.Spec.Priority != 7 {
					t.Fatalf("priority = %d, want the pod's 7", got.Desired.Spec.Priority)
				}
				if len(got.Desired.OwnerReferences) != 1 || got.Desired.Labels[ManagedByLabel] == "" {
					t.Fatalf("desired meta = %+v", got.Desired.ObjectMeta)
				}
			}
		})
	}
}

func TestGroupName(t *testing.T) {
	for in, want := range map[string]string{"Train_Job/0": "train-job-0", "--": "gang", "a.b": "a.b"} {
		if got := groupName(in); got != want {
			t.Errorf("groupName(%q) = %q, want %q", in, got, want)
		}
	}
}

// A pod naming an upstream PodGroup (spec.schedulingGroup) is a gang of that PodGroup's
// gang policy, whatever the catalog says; the catalog still names the workload and its queue.
func TestMapUpstreamPodGroup(t *testing.T) {
	job := &Workload{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "w1", Component: "worker",
		Gang: "job-train", MinMember: 8, Labels: map[string]string{v1alpha1.QueueLabel: "wl-queue"}}
	up := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "train-pg", UID: "pg1"},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 4}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: "rack"}}},
			Priority:              ptr.To[int32](100),
		},
	}
	groups := map[string]*schedulingv1beta1.PodGroup{"ns/train-pg": up}
	m := Mapper{Resolver: fakeResolver{wl: job}, UpstreamPodGroup: func(ns, name string) *schedulingv1beta1.PodGroup { return groups[ns+"/"+name] }}
	p := pod(nil, nil)
	p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("train-pg")}
	got := m.Map(context.Background(), p)
	if got.Retry || got.Upstream != "train-pg" || got.Reason != ReasonSchedulingGroup || got.Desired == nil {
		t.Fatalf("mapping = %+v", got)
	}
	spec := got.Desired.Spec
	if got.Group != "podgroup-train-pg" || spec.MinMember != 4 || spec.Queue != "wl-queue" || spec.Priority != 100 ||
		spec.Topology == nil || spec.Topology.Key != "rack" || spec.Topology.Mode != v1alpha1.TopologyRequired {
		t.Fatalf("desired PodGroup %s = %+v", got.Group, spec)
	}
	if got.Workload != "Job ns/train" {
		t.Errorf("workload = %q", got.Workload)
	}
	// A basic policy: a group of one at a time.
	up.Spec.SchedulingPolicy = schedulingv1beta1.PodGroupSchedulingPolicy{Basic: &schedulingv1beta1.BasicSchedulingPolicy{}}
	if got := m.Map(context.Background(), p); got.Desired.Spec.MinMember != 1 {
		t.Errorf("basic policy minMember = %d, want 1", got.Desired.Spec.MinMember)
	}
	// Not in the informer yet: retried, not a fallback.
	p.Spec.SchedulingGroup.PodGroupName = ptr.To("later")
	if got := m.Map(context.Background(), p); !got.Retry {
		t.Errorf("unknown upstream PodGroup: %+v, want retry", got)
	}
}
