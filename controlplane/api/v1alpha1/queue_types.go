package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Resource names a Queue accounts for.
const (
	// ResourceGPU is counted in GPU units: a whole GPU is 1, a MIG device its memory slices over
	// the GPU's, a fraction its memory over the GPU's memory.
	ResourceGPU = "gpu"
	// ResourceCPU is the sum of the pods' CPU requests.
	ResourceCPU = "cpu"
	// ResourceMemory is the sum of the pods' memory requests.
	ResourceMemory = "memory"
)

// Condition types and reasons of a Queue.
const (
	// QueueConditionValid is False when the queue cannot admit gangs: its parent is missing or
	// the parent chain loops. CRD validation can only see one object, so loops longer than a
	// queue naming itself are detected here, by the scheduler.
	QueueConditionValid = "Valid"

	ReasonParentLoop     = "ParentLoop"
	ReasonParentNotFound = "ParentNotFound"
	ReasonValid          = "Valid"
)

// Queue is a node in the hierarchy of team quotas. Gangs are submitted to leaf queues; a gang is
// admitted only if its queue and every ancestor stay within their limits.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tq
// +kubebuilder:printcolumn:name="Parent",type=string,JSONPath=`.spec.parent`
// +kubebuilder:printcolumn:name="GPU quota",type=string,JSONPath=`.spec.resources.gpu.quota`
// +kubebuilder:printcolumn:name="GPU limit",type=string,JSONPath=`.spec.resources.gpu.limit`
// +kubebuilder:printcolumn:name="GPU allocated",type=string,JSONPath=`.status.allocated.gpu`
// +kubebuilder:validation:XValidation:rule="!has(self.spec.parent) || self.spec.parent != self.metadata.name",message="spec.parent must not name the queue itself"
type Queue struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   QueueSpec   `json:"spec"`
	Status QueueStatus `json:"status,omitempty"`
}

// QueueSpec is the desired quota of a queue.
type QueueSpec struct {
	// Parent is the name of the parent Queue; empty for a root queue.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Parent string `json:"parent,omitempty"`

	// Priority orders queues that are otherwise equal (higher first).
	// +optional
	Priority int32 `json:"priority,omitempty"`

	// Resources holds the quota per resource. A resource that is not listed has no quota
	// (nothing is guaranteed) and no limit.
	// +optional
	Resources QueueResources `json:"resources,omitempty"`
}

// QueueResources holds a quota per accounted resource.
type QueueResources struct {
	// GPU in GPU units (fractions allowed, e.g. "0.5").
	// +optional
	GPU *ResourceQuota `json:"gpu,omitempty"`
	// CPU in cores, as in pod requests.
	// +optional
	CPU *ResourceQuota `json:"cpu,omitempty"`
	// Memory in bytes, as in pod requests.
	// +optional
	Memory *ResourceQuota `json:"memory,omitempty"`
}

// ResourceQuota is the quota of one resource.
//
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || !quantity(string(self.quota)).isLessThan(quantity('0'))",message="quota must not be negative"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !quantity(string(self.limit)).isLessThan(quantity('0'))",message="limit must not be negative"
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || !has(self.limit) || !quantity(string(self.limit)).isLessThan(quantity(string(self.quota)))",message="limit must not be below quota"
type ResourceQuota struct {
	// Quota is guaranteed to the queue: gangs within quota are placed before any gang that
	// borrows.
	// +optional
	Quota *resource.Quantity `json:"quota,omitempty"`
	// Limit is never exceeded by the queue (including what it borrows). Unset means no limit.
	// +optional
	Limit *resource.Quantity `json:"limit,omitempty"`
	// OverQuotaWeight is the queue's share of idle capacity beyond its quota, relative to its
	// siblings. 0 means the queue never borrows. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1
	OverQuotaWeight *int32 `json:"overQuotaWeight,omitempty"`
}

// QueueStatus is what the scheduler observed for the queue, including its descendants.
type QueueStatus struct {
	// Allocated is the usage of bound pods per resource (gpu, cpu, memory).
	// +optional
	Allocated map[string]resource.Quantity `json:"allocated,omitempty"`
	// Requested is the usage of bound pods plus the demand of waiting gangs.
	// +optional
	Requested map[string]resource.Quantity `json:"requested,omitempty"`
	// FairShare is what the queue deserves now, per resource: its quota (as far as it
	// wants it), then its share of the rest of its parent's fair share by over-quota
	// weight — lowered by past usage (Usage) — among the siblings that want more. A queue
	// below its fair share may reclaim from siblings above theirs.
	// +optional
	FairShare map[string]resource.Quantity `json:"fairShare,omitempty"`
	// Usage is the queue's past usage, kept by the scheduler across restarts.
	// +optional
	Usage *QueueUsage `json:"usage,omitempty"`
	// Conditions: Valid.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// QueueUsage is a queue's usage history: per resource, an exponentially decayed average of
// what the queue (with its descendants) held, as a fraction of the cluster's capacity. An
// hour of the whole cluster an hour ago counts as much as half an hour of it now when the
// half-life is an hour. It shrinks the queue's over-quota share (see FairShare).
type QueueUsage struct {
	// Average per resource (gpu, cpu, memory), 0 to 1, in thousandths ("250m" is a quarter
	// of the cluster on average).
	// +optional
	Average map[string]resource.Quantity `json:"average,omitempty"`
	// HalfLife the average decays with.
	// +optional
	HalfLife metav1.Duration `json:"halfLife,omitempty"`
	// UpdateTime is when Average was computed; a scheduler that starts continues from it.
	// +optional
	UpdateTime metav1.Time `json:"updateTime,omitempty"`
}

// QueueList is a list of Queues.
//
// +kubebuilder:object:root=true
type QueueList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Queue `json:"items"`
}
