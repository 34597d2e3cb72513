// Package mapper finds the gang of a tessera pod and the PodGroup that should describe it:
// an explicit PodGroup named by the pod's annotation, else the workload the catalog resolves
// from the pod's owners, else a one-pod gang with a reason. It also resolves the gang's queue
// (tessera.dev/queue on the workload, the pod, or the namespace).
package mapper

import (
	"context"
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/catalog"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Workload is what a Resolver says about a pod's workload.
type Workload struct {
	// APIVersion, Kind, Name, UID of the top-level workload object.
	APIVersion, Kind, Name string
	UID                    types.UID
	// Labels of the workload (the queue label is looked up here first).
	Labels map[string]string
	// Component of the pod within the workload.
	Component string
	// Gang is the name of the pod's gang (unique within the workload's namespace).
	Gang string
	// MinMember of the gang.
	MinMember int32
	// Components of the gang with their minimum pods.
	Components []v1alpha1.PodGroupComponent
	// Priority of the gang, when the workload says.
	Priority int32
}

// Resolver maps a pod to its workload and gang. The catalog implements it; nil Workload and nil
// error mean the pod's workload kind is unknown.
type Resolver interface {
	Resolve(ctx context.Context, pod *v1.Pod) (*Workload, error)
}

// ManagedByLabel marks PodGroups the mapper created (and may update).
const ManagedByLabel = "scheduling.tessera.dev/managed-by"

// Mapping is the outcome for one pod.
type Mapping struct {
	// Group is the PodGroup's name in the pod's namespace.
	Group string
	// Desired is the PodGroup the mapper wants to exist; nil for a hand-made group (the
	// annotation), which the mapper never writes.
	Desired *v1alpha1.PodGroup
	// Reason and Message explain how the gang was found (Mapped condition).
	Reason, Message string
	// Retry: the workload could not be resolved yet; skip the pod this cycle.
	Retry bool
	// Upstream names the scheduling.k8s.io PodGroup the pod's spec.schedulingGroup points at,
	// when the gang comes from the Kubernetes gang API.
	Upstream string
	// Workload names the gang's workload for messages ("Job ns/train"); may be empty.
	Workload string
}

// ReasonSchedulingGroup: the pod names an upstream PodGroup (spec.schedulingGroup).
const ReasonSchedulingGroup = "SchedulingGroup"

// Mapper maps pods to gangs.
type Mapper struct {
	Resolver Resolver
	// NamespaceLabels returns a namespace's labels (queue default); nil when unknown.
	NamespaceLabels func(name string) map[string]string
	// UpstreamPodGroup returns a scheduling.k8s.io PodGroup, or nil when it is not known (yet);
	// nil when the API server does not serve the Kubernetes gang API.
	UpstreamPodGroup func(namespace, name string) *schedulingv1beta1.PodGroup
}

// Map finds the pod's gang.
func (m *Mapper) Map(ctx context.Context, pod *v1.Pod) Mapping {
	if name := pod.Annotations[v1alpha1.PodGroupAnnotation]; name != "" {
		return Mapping{Group: name, Reason: v1alpha1.ReasonManual, Message: "pod names its PodGroup with " + v1alpha1.PodGroupAnnotation}
	}
	var wl *Workload
	var resolveErr error
	if m.Resolver != nil {
		wl, resolveErr = m.Resolver.Resolve(ctx, pod)
	}
	if errors.Is(resolveErr, ErrRetry) {
		return Mapping{Retry: true, Message: resolveErr.Error()}
	}
	if sg := pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil && m.UpstreamPodGroup != nil {
		return m.mapUpstream(pod, *sg.PodGroupName, wl)
	}
	if wl == nil || wl.Gang == "" {
		// Fallback: the pod alone is its gang.
		reason, msg := v1alpha1.ReasonUnknownWorkload, "no workload definition knows the pod's owners; the pod is a gang of one"
		if wl != nil {
			reason, msg = v1alpha1.ReasonCatalog, fmt.Sprintf("%s %s: component %s is in no gang; the pod is a gang of one", wl.Kind, wl.Name, wl.Component)
		}
		switch {
		case errors.Is(resolveErr, catalog.ErrNoComponent):
			reason, msg = v1alpha1.ReasonNoComponent, fmt.Sprintf("%v; the pod is a gang of one", resolveErr)
		case resolveErr != nil:
			reason, msg = v1alpha1.ReasonCatalogUnavailable, fmt.Sprintf("catalog could not resolve the pod (%v); the pod is a gang of one", resolveErr)
		}
		pg := m.podGroup(pod, groupName("pod-"+pod.Name), 1, nil, metav1.OwnerReference{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		})
		pg.Spec.Queue = m.queueOf(pod, nil)
		pg.Spec.Priority = ptr.Deref(pod.Spec.Priority, 0)
		pg.Spec.Workload = &v1alpha1.WorkloadReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name}
		return Mapping{Group: pg.Name, Desired: pg, Reason: reason, Message: msg}
	}
	minMember := max(wl.MinMember, 1)
	pg := m.podGroup(pod, groupName(wl.Gang), minMember, wl.Components, metav1.OwnerReference{
		APIVersion: wl.APIVersion, Kind: wl.Kind, Name: wl.Name, UID: wl.UID, Controller: ptr.To(false),
	})
	pg.Spec.Queue = m.queueOf(pod, wl.Labels)
	// The workload's priority, else the pod's (resolved from its PriorityClass at admission).
	pg.Spec.Priority = wl.Priority
	if pg.Spec.Priority == 0 {
		pg.Spec.Priority = ptr.Deref(pod.Spec.Priority, 0)
	}
	pg.Spec.Workload = &v1alpha1.WorkloadReference{APIVersion: wl.APIVersion, Kind: wl.Kind, Name: wl.Name}
	return Mapping{Group: pg.Name, Desired: pg, Reason: v1alpha1.ReasonCatalog, Workload: fmt.Sprintf("%s %s/%s", wl.Kind, pod.Namespace, wl.Name),
		Message: fmt.Sprintf("%s %s, component %s: gang %s of %d pods", wl.Kind, wl.Name, wl.Component, wl.Gang, minMember)}
}

// mapUpstream takes the gang from the pod's upstream PodGroup (the Kubernetes gang API): its
// gang policy's minCount (a basic policy is a gang of one at a time: minMember 1), its first
// topology constraint (required), its priority. The catalog still names the workload (and
// its queue label).
func (m *Mapper) mapUpstream(pod *v1.Pod, name string, wl *Workload) Mapping {
	up := m.UpstreamPodGroup(pod.Namespace, name)
	if up == nil {
		return Mapping{Retry: true, Message: fmt.Sprintf("PodGroup %s/%s (scheduling.k8s.io) is not known yet", pod.Namespace, name)}
	}
	minMember, policy := int32(1), "basic"
	if g := up.Spec.SchedulingPolicy.Gang; g != nil {
		minMember, policy = max(g.MinCount, 1), fmt.Sprintf("gang of %d", g.MinCount)
	}
	owner := metav1.OwnerReference{APIVersion: schedulingv1beta1.SchemeGroupVersion.String(), Kind: "PodGroup", Name: up.Name, UID: up.UID, Controller: ptr.To(false)}
	pg := m.podGroup(pod, groupName("podgroup-"+name), minMember, nil, owner)
	var labels map[string]string
	workload := ""
	if wl != nil {
		labels = wl.Labels
		workload = fmt.Sprintf("%s %s/%s", wl.Kind, pod.Namespace, wl.Name)
		pg.Spec.Workload = &v1alpha1.WorkloadReference{APIVersion: wl.APIVersion, Kind: wl.Kind, Name: wl.Name}
	} else {
		pg.Spec.Workload = &v1alpha1.WorkloadReference{APIVersion: schedulingv1beta1.SchemeGroupVersion.String(), Kind: "PodGroup", Name: up.Name}
	}
	pg.Spec.Queue = m.queueOf(pod, labels)
	pg.Spec.Priority = ptr.Deref(up.Spec.Priority, ptr.Deref(pod.Spec.Priority, 0))
	if c := up.Spec.SchedulingConstraints; c != nil && len(c.Topology) > 0 {
		pg.Spec.Topology = &v1alpha1.TopologyConstraint{Key: c.Topology[0].Key, Mode: v1alpha1.TopologyRequired}
	}
	return Mapping{Group: pg.Name, Desired: pg, Upstream: up.Name, Workload: workload, Reason: ReasonSchedulingGroup,
		Message: fmt.Sprintf("pod names PodGroup %s (scheduling.k8s.io): %s", up.Name, policy)}
}

func (m *Mapper) podGroup(pod *v1.Pod, name string, minMember int32, comps []v1alpha1.PodGroupComponent, owner metav1.OwnerReference) *v1alpha1.PodGroup {
	return &v1alpha1.PodGroup{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PodGroup"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       pod.Namespace,
			Name:            name,
			Labels:          map[string]string{ManagedByLabel: v1alpha1.SchedulerName},
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Spec: v1alpha1.PodGroupSpec{MinMember: minMember, Components: comps},
	}
}

// queueOf: the workload's label, else the pod's, else the namespace's. Empty when none.
func (m *Mapper) queueOf(pod *v1.Pod, workloadLabels map[string]string) string {
	if q := workloadLabels[v1alpha1.QueueLabel]; q != "" {
		return q
	}
	if q := pod.Labels[v1alpha1.QueueLabel]; q != "" {
		return q
	}
	if m.NamespaceLabels != nil {
		return m.NamespaceLabels(pod.Namespace)[v1alpha1.QueueLabel]
	}
	return ""
}

// groupName makes a valid object name out of a gang name.
func groupName(s string) string {
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	out := strings.Trim(b.String(), "-.")
	if len(out) > validation.DNS1123SubdomainMaxLength {
		out = out[:validation.DNS1123SubdomainMaxLength]
	}
	if out == "" {
		out = "gang"
	}
	return out
}
