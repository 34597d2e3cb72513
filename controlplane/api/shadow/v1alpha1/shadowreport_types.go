package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Decisions tessera would have made.
const (
	// DecisionPlaced: tessera would have placed the gang (whole, or minMember of it).
	DecisionPlaced = "Placed"
	// DecisionWaiting: tessera would not have placed it (yet); Reason and Message say why.
	DecisionWaiting = "Waiting"
)

// GangNamespaceLabel and GangNameLabel on a report name its gang, for selectors.
const (
	GangNamespaceLabel = "scheduling.tessera.dev/gang-namespace"
	GangNameLabel      = "scheduling.tessera.dev/gang"
)

// ShadowReport compares, for one gang of pods placed by another scheduler (or by tessera
// itself), what that scheduler did with what tessera's decision function would have done on
// the same snapshot. tessera-scheduler --shadow writes one per gang, in its own namespace,
// and nothing else. Like a PolicyReport it has no spec and status: the whole object is an
// observation. Every field is a fact with a timestamp, never a running clock, so that a gang
// whose situation does not change causes no write.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=shr,categories=tessera
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.gang.namespace`
// +kubebuilder:printcolumn:name="Gang",type=string,JSONPath=`.gang.name`
// +kubebuilder:printcolumn:name="Scheduler",type=string,JSONPath=`.gang.schedulerName`
// +kubebuilder:printcolumn:name="Bound",type=integer,JSONPath=`.actual.bound`
// +kubebuilder:printcolumn:name="MinMember",type=integer,JSONPath=`.gang.minMember`
// +kubebuilder:printcolumn:name="Tessera",type=string,JSONPath=`.tessera.decision`
// +kubebuilder:printcolumn:name="Cycles",type=integer,JSONPath=`.tessera.cycles`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ShadowReport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Gang is the gang the report is about, as tessera's catalog maps it.
	Gang Gang `json:"gang"`
	// Actual is what the scheduler in use did.
	Actual Actual `json:"actual"`
	// Tessera is what tessera would have decided.
	Tessera Tessera `json:"tessera"`
}

// Gang identifies the gang and says when it became ready.
type Gang struct {
	// Namespace of the gang's pods.
	Namespace string `json:"namespace"`
	// Name is the PodGroup name tessera gives the gang.
	Name string `json:"name"`
	// Workload names the gang's workload ("JobSet ns/train"); empty for a gang of one pod.
	// +optional
	Workload string `json:"workload,omitempty"`
	// SchedulerName is the spec.schedulerName of the gang's pods.
	SchedulerName string `json:"schedulerName"`
	// Queue is the gang's queue (tessera.dev/queue); empty when it has none.
	// +optional
	Queue string `json:"queue,omitempty"`
	// MappedReason and MappedMessage say how the catalog mapped the gang's pods (the
	// PodGroup's Mapped condition): Catalog, Manual, SchedulingGroup, or a mapping error
	// (UnknownWorkload, NoComponent, CatalogUnavailable: the pods fell back to gangs of one).
	// +optional
	MappedReason string `json:"mappedReason,omitempty"`
	// +optional
	MappedMessage string `json:"mappedMessage,omitempty"`
	// MinMember is how many pods must be placed together.
	MinMember int32 `json:"minMember"`
	// Pods is the number of the gang's live pods when it became ready (or when it was last
	// seen, for a gang that never became ready).
	Pods int32 `json:"pods"`
	// ReadyTime is when the gang became ready: its minMember-th pod and every claim of its
	// pods existed (the later of their creation times). Unset for a gang that never did.
	// +optional
	ReadyTime *metav1.MicroTime `json:"readyTime,omitempty"`
	// EndedTime is when the gang's pods were all gone or finished; the report is final.
	// +optional
	EndedTime *metav1.MicroTime `json:"endedTime,omitempty"`
}

// Actual is what the scheduler in use did with the gang.
type Actual struct {
	// Bound is how many of the gang's pods are (or, once ended, were at most) bound.
	Bound int32 `json:"bound"`
	// FirstBoundTime is when its first pod was bound.
	// +optional
	FirstBoundTime *metav1.MicroTime `json:"firstBoundTime,omitempty"`
	// FullyBoundTime is when minMember of its pods were bound.
	// +optional
	FullyBoundTime *metav1.MicroTime `json:"fullyBoundTime,omitempty"`
	// PartialStartTime and PartialEndTime bound the span during which some but fewer than
	// minMember of its pods were bound; PartialEndTime is unset while that lasts.
	// +optional
	PartialStartTime *metav1.MicroTime `json:"partialStartTime,omitempty"`
	// +optional
	PartialEndTime *metav1.MicroTime `json:"partialEndTime,omitempty"`
	// MaxPartial is the most pods bound at once while the gang was partly placed.
	// +optional
	MaxPartial int32 `json:"maxPartial,omitempty"`
	// DeadlockTime is when the gang was found deadlocked: partly placed, its waiting pods
	// unschedulable, and no pod of it bound for the deadlock timeout.
	// +optional
	DeadlockTime *metav1.MicroTime `json:"deadlockTime,omitempty"`
	// DeadlockMessage says how many pods were bound and waiting, for how long, and why the
	// scheduler in use found the first waiting pod unschedulable.
	// +optional
	DeadlockMessage string `json:"deadlockMessage,omitempty"`
	// Nodes the gang's bound pods are on, sorted.
	// +optional
	Nodes []string `json:"nodes,omitempty"`
	// Pods are the bound pods, where and when.
	// +optional
	Pods []PodPlacement `json:"pods,omitempty"`
	// GPUUnits the bound pods' claims hold.
	// +optional
	GPUUnits *resource.Quantity `json:"gpuUnits,omitempty"`
	// FragmentationPercent is the cluster's GPU fragmentation right after the gang was fully
	// bound: the share of free GPU units that lie on nodes partly in use.
	// +optional
	FragmentationPercent *int32 `json:"fragmentationPercent,omitempty"`
	// QuotaViolation is what tessera's quota check says of the binding, when it took a queue
	// beyond its limit (the other scheduler allowed it).
	// +optional
	QuotaViolation string `json:"quotaViolation,omitempty"`
}

// Tessera is what tessera's decision function would have done with the gang.
type Tessera struct {
	// Decision is Placed or Waiting; empty until the gang is ready.
	// +optional
	// +kubebuilder:validation:Enum="";Placed;Waiting
	Decision string `json:"decision,omitempty"`
	// Reason and Message: the gang's condition as tessera would have written it
	// (Unschedulable, QuotaExceeded, WaitingForMembers, ... or Scheduled).
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// DecidedTime is the cycle in which tessera would have placed the gang.
	// +optional
	DecidedTime *metav1.MicroTime `json:"decidedTime,omitempty"`
	// Cycles counts tessera's decision cycles from the gang's readiness to its placement,
	// the placing one included; for a gang that ended without being placed, the cycles it
	// waited.
	// +optional
	Cycles int32 `json:"cycles,omitempty"`
	// Nodes tessera would have used, sorted.
	// +optional
	Nodes []string `json:"nodes,omitempty"`
	// Pods are where tessera would have put each pod, with its devices.
	// +optional
	Pods []PodPlacement `json:"pods,omitempty"`
	// GPUUnits of the devices tessera would have allocated.
	// +optional
	GPUUnits *resource.Quantity `json:"gpuUnits,omitempty"`
	// FragmentationPercent is the cluster's GPU fragmentation right after tessera's
	// placement (same measure as Actual's).
	// +optional
	FragmentationPercent *int32 `json:"fragmentationPercent,omitempty"`
	// Reclaim lists the gangs (namespace/name) tessera would have evicted for this gang: to
	// give its queue its quota or fair share back (reclaim), or because it has the higher
	// priority in its queue (preemption).
	// +optional
	Reclaim []string `json:"reclaim,omitempty"`
}

// PodPlacement is one pod on one node.
type PodPlacement struct {
	Name string `json:"name"`
	Node string `json:"node"`
	// BoundTime is when the pod was bound (actual placements only).
	// +optional
	BoundTime *metav1.MicroTime `json:"boundTime,omitempty"`
	// Devices are the allocated devices, driver/pool/device.
	// +optional
	Devices []string `json:"devices,omitempty"`
}

// ShadowReportList is a list of ShadowReports.
//
// +kubebuilder:object:root=true
type ShadowReportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ShadowReport `json:"items"`
}
