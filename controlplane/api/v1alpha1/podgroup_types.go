package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Well-known labels and annotations.
const (
	// QueueLabel names the Queue of a workload, a pod or (as default) a namespace.
	QueueLabel = "tessera.dev/queue"
	// PodGroupAnnotation on a pod names the PodGroup (same namespace) the pod belongs to. The
	// scheduler's mapper sets it; a user may set it to form a gang by hand.
	PodGroupAnnotation = "scheduling.tessera.dev/pod-group"
	// SchedulerName is the spec.schedulerName with which pods opt in to tessera.
	SchedulerName = "tessera-scheduler"
	// PreemptibleLabel "false" on a PriorityClass makes the gangs of its pods
	// non-preemptible (PodGroup spec.preemptible overrides it).
	PreemptibleLabel = "scheduling.tessera.dev/preemptible"
)

// PodGroup condition types.
const (
	// PodGroupConditionScheduled is True once minMember pods are bound; False says why not, in
	// numbers.
	PodGroupConditionScheduled = "Scheduled"
	// PodGroupConditionQueueResolved is False when the gang has no queue or its queue does not
	// exist or is invalid; such a gang is never placed.
	PodGroupConditionQueueResolved = "QueueResolved"
	// PodGroupConditionMapped says how the gang was found: from the catalog, by hand
	// (annotation), or as a fallback one-pod gang for an unknown workload kind.
	PodGroupConditionMapped = "Mapped"
)

// PodGroup condition reasons.
const (
	ReasonScheduled          = "Scheduled"
	ReasonWaitingForMembers  = "WaitingForMembers"
	ReasonWaitingForClaims   = "WaitingForClaims"
	ReasonUnschedulable      = "Unschedulable"
	ReasonQuotaExceeded      = "QuotaExceeded"
	ReasonCommitFailed       = "CommitFailed"
	ReasonNoQueue            = "NoQueue"
	ReasonQueueNotFound      = "QueueNotFound"
	ReasonQueueInvalid       = "QueueInvalid"
	ReasonQueueFound         = "QueueFound"
	ReasonCatalog            = "Catalog"
	ReasonManual             = "Manual"
	ReasonUnknownWorkload    = "UnknownWorkload"
	ReasonCatalogUnavailable = "CatalogUnavailable"
	// ReasonNoComponent: the catalog knows the pod's workload, but no
	// component's pod selector matches the pod (labels the operator did not
	// set, or a definition that does not fit this operator version).
	ReasonNoComponent = "NoComponent"
)

// TopologyMode says whether a gang must or should stay in one topology domain.
// +kubebuilder:validation:Enum=Required;Preferred
type TopologyMode string

const (
	TopologyRequired  TopologyMode = "Required"
	TopologyPreferred TopologyMode = "Preferred"
)

// PodGroup is one gang: at least minMember of its pods are placed together or none is.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pg
// +kubebuilder:printcolumn:name="Queue",type=string,JSONPath=`.spec.queue`
// +kubebuilder:printcolumn:name="MinMember",type=integer,JSONPath=`.spec.minMember`
// +kubebuilder:printcolumn:name="Scheduled",type=integer,JSONPath=`.status.scheduled`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Position",type=integer,JSONPath=`.status.queuePosition.overall`,priority=1
type PodGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   PodGroupSpec   `json:"spec"`
	Status PodGroupStatus `json:"status,omitempty"`
}

// PodGroupSpec describes a gang.
type PodGroupSpec struct {
	// MinMember is how many pods must be placed at once.
	// +kubebuilder:validation:Minimum=1
	MinMember int32 `json:"minMember"`

	// Queue is the name of the (leaf) Queue the gang is charged to. Empty means no queue was
	// found: the gang waits with QueueResolved=False.
	// +optional
	Queue string `json:"queue,omitempty"`

	// Priority orders gangs inside a queue (higher first).
	// +optional
	Priority int32 `json:"priority,omitempty"`

	// Components of the workload that belong to this gang.
	// +optional
	// +listType=map
	// +listMapKey=name
	Components []PodGroupComponent `json:"components,omitempty"`

	// Topology keeps the gang inside one topology domain.
	// +optional
	Topology *TopologyConstraint `json:"topology,omitempty"`

	// Workload is the top-level object the gang was derived from.
	// +optional
	Workload *WorkloadReference `json:"workload,omitempty"`

	// Preemptible false makes the gang non-preemptible: it is never evicted for another gang
	// (priority preemption, reclaim, consolidation), and it runs only within its queue's
	// quota (never on borrowed capacity). Unset: the label
	// scheduling.tessera.dev/preemptible on the gang's PriorityClass, else preemptible.
	// Preemptibility is apart from priority: a high-priority gang may be preemptible by
	// an even higher one, a low-priority one protected.
	// +optional
	Preemptible *bool `json:"preemptible,omitempty"`
}

// PodGroupComponent is one component of the workload within the gang.
type PodGroupComponent struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// MinMember pods of this component count toward the gang's minMember.
	// +kubebuilder:validation:Minimum=0
	MinMember int32 `json:"minMember"`
}

// TopologyConstraint keeps a gang inside topology domains: nodes that share the value of a
// node label (a block, a rack, an NVLink domain). With a Topology's ordered levels (block >
// rack > host) a gang can require one level and prefer a narrower one: "stay in one block,
// on as few racks as possible".
//
// +kubebuilder:validation:XValidation:rule="has(self.key) || has(self.required) || has(self.preferred)",message="one of key, required or preferred must be set"
type TopologyConstraint struct {
	// Key is a node label key; Mode says whether the gang must (Required) or should
	// (Preferred) stay in one of its domains. The older form of Required/Preferred.
	// +optional
	Key string `json:"key,omitempty"`
	// Mode Required: the gang binds only inside one domain of Key. Preferred: one domain if
	// possible.
	// +kubebuilder:default=Preferred
	// +optional
	Mode TopologyMode `json:"mode,omitempty"`
	// Required is the node label key of the level the gang must stay within: all its pods
	// in one domain of it.
	// +optional
	Required string `json:"required,omitempty"`
	// Preferred is the node label key of a (narrower) level the gang should stay within if
	// it fits; when it does not, the gang is spread over as few of its domains as possible.
	// +optional
	Preferred string `json:"preferred,omitempty"`
	// Topology names the Topology whose levels order the keys; empty: the only Topology, or
	// the scheduler's --topology-keys.
	// +optional
	Topology string `json:"topology,omitempty"`
}

// WorkloadReference points at the top-level workload of a gang.
type WorkloadReference struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
}

// PodGroupPhase summarises the gang.
type PodGroupPhase string

const (
	PodGroupPending   PodGroupPhase = "Pending"
	PodGroupScheduled PodGroupPhase = "Scheduled"
	PodGroupRunning   PodGroupPhase = "Running"
	// PodGroupFinished: every pod of the gang that the scheduler placed has
	// ended (succeeded or failed) and none waits.
	PodGroupFinished PodGroupPhase = "Finished"
)

// PodGroupStatus says where the gang stands and, while it waits, why, in numbers.
type PodGroupStatus struct {
	// +optional
	Phase PodGroupPhase `json:"phase,omitempty"`
	// Members is how many pods of the gang exist.
	// +optional
	Members int32 `json:"members,omitempty"`
	// Scheduled is how many pods of the gang are bound.
	// +optional
	Scheduled int32 `json:"scheduled,omitempty"`
	// Running is how many pods of the gang run.
	// +optional
	Running int32 `json:"running,omitempty"`
	// Succeeded is how many pods of the gang have completed successfully.
	// They count toward minMember for the phase: a gang whose pods finish one
	// by one is still Running, not Pending.
	// +optional
	Succeeded int32 `json:"succeeded,omitempty"`
	// Failed is how many pods of the gang have failed.
	// +optional
	Failed int32 `json:"failed,omitempty"`
	// QueuePosition is where a waiting gang stands: its place among the waiting gangs of
	// its queue and among all waiting gangs, in the order the scheduler tries them. Unset
	// while the gang is not ready to be placed (pods or claims missing, no queue) and once
	// it is placed. Published at most every --queue-position-period per gang (positions
	// move with every gang ahead that is placed).
	// +optional
	QueuePosition *QueuePosition `json:"queuePosition,omitempty"`
	// Reservation: the nodes the scheduler keeps for this waiting gang after it evicted
	// pods for it (priority preemption, reclaim, consolidation): other gangs do not use
	// them until this gang is placed, goes away, or the reservation expires. Kept in the
	// status so that a new scheduler (restart, failover) keeps it too.
	// +optional
	Reservation *Reservation `json:"reservation,omitempty"`
	// Conditions: Scheduled, QueueResolved, Mapped.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// QueuePosition is a waiting gang's place in line (1 is next).
type QueuePosition struct {
	// InQueue is the position among the waiting gangs of the gang's queue (priority, then
	// age).
	InQueue int32 `json:"inQueue"`
	// Overall is the position among all waiting gangs of the cluster: queues take turns by
	// fair share, as the scheduler takes them.
	Overall int32 `json:"overall"`
}

// Reservation is capacity kept for a waiting gang that pods were evicted for.
type Reservation struct {
	// Nodes kept for the gang (sorted).
	Nodes []string `json:"nodes"`
	// Reason is why: Preempting, Reclaiming or Consolidating.
	Reason string `json:"reason"`
	// Since is when the pods were evicted; the reservation ends twice the scheduler's
	// eviction wait later at the latest.
	Since metav1.Time `json:"since"`
}

// PodGroupList is a list of PodGroups.
//
// +kubebuilder:object:root=true
type PodGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodGroup `json:"items"`
}
