package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkloadDefinition tells tessera how to read one workload kind: its components,
// their pod templates and replica counts, its status, and which pods form gangs.
// The spec is the Workload Map format unchanged.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=wdef
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.spec.structureDefinition.rootComponent.kind.group`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.structureDefinition.rootComponent.kind.version`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.structureDefinition.rootComponent.kind.kind`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type WorkloadDefinition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkloadMapSpec          `json:"spec"`
	Status WorkloadDefinitionStatus `json:"status,omitempty"`
}

// WorkloadDefinitionStatus reports whether the catalog accepted the definition.
type WorkloadDefinitionStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WorkloadDefinitionList is a list of WorkloadDefinitions.
//
// +kubebuilder:object:root=true
type WorkloadDefinitionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadDefinition `json:"items"`
}

// WorkloadMapSpec is the spec of a Workload Map definition (also the spec of the
// run.ai/v1alpha1 Karta and optimization.nvidia.com/v1alpha1 ResourceInterface envelopes).
type WorkloadMapSpec struct {
	// StructureDefinition is the tree of components of the workload.
	StructureDefinition StructureDefinition `json:"structureDefinition"`
	// OptimizationInstructions says how pods are grouped for gang scheduling.
	// +optional
	OptimizationInstructions OptimizationInstructions `json:"optimizationInstructions,omitempty"`
}

// StructureDefinition is the component tree of a workload kind.
//
// +kubebuilder:validation:XValidation:rule="has(self.rootComponent.kind)",message="the root component needs a kind: it selects the workloads the definition reads"
type StructureDefinition struct {
	// RootComponent is the workload object itself; its kind selects the definition.
	RootComponent ComponentDefinition `json:"rootComponent"`
	// ChildComponents hang below the root through ownerRef.
	// +optional
	// +listType=map
	// +listMapKey=name
	ChildComponents []ComponentDefinition `json:"childComponents,omitempty"`
	// AdditionalChildKinds are kinds the workload's operator creates between the
	// workload and its pods (e.g. PodClique under a PodCliqueSet); the pod resolver
	// walks through them.
	// +optional
	AdditionalChildKinds []GroupVersionKind `json:"additionalChildKinds,omitempty"`
}

// GroupVersionKind names an API kind.
type GroupVersionKind struct {
	// +optional
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

// ComponentDefinition is one node of the component tree. All paths are jq
// expressions evaluated on the workload object, except those of PodSelector, which
// are evaluated on a pod.
type ComponentDefinition struct {
	// Name identifies the component within the definition.
	Name string `json:"name"`
	// Kind of the object the operator creates for this component (optional).
	// +optional
	Kind *GroupVersionKind `json:"kind,omitempty"`
	// OwnerRef names the parent component; empty on the root.
	// +optional
	OwnerRef *string `json:"ownerRef,omitempty"`
	// +optional
	SpecDefinition *SpecDefinition `json:"specDefinition,omitempty"`
	// +optional
	ScaleDefinition *ScaleDefinition `json:"scaleDefinition,omitempty"`
	// StatusDefinition is read on the root component only.
	// +optional
	StatusDefinition *StatusDefinition `json:"statusDefinition,omitempty"`
	// +optional
	SuspendDefinition *SuspendDefinition `json:"suspendDefinition,omitempty"`
	// InstanceIdPath yields one id per instance for a component that holds several pod
	// definitions (a list or a map in the workload).
	// +optional
	InstanceIdPath *string `json:"instanceIdPath,omitempty"` //nolint:revive // field name fixed by the format
	// +optional
	PodSelector *PodSelector `json:"podSelector,omitempty"`
	// StartupDefinition says in which order the operator creates the pods of
	// the component's instances (a tessera extension of the format).
	// +optional
	StartupDefinition *StartupDefinition `json:"startupDefinition,omitempty"`
	// GangKeyPath yields one key per instance (a tessera extension of the
	// format): instances of one pod group with different keys are different
	// all-or-nothing gangs, named "<group>-<key>" (an empty key keeps the group's
	// name). For operators that cut one group into several gangs, as Grove makes
	// a base PodGang and one scaled PodGang per scaling-group replica beyond
	// minAvailable.
	// +optional
	GangKeyPath *string `json:"gangKeyPath,omitempty"`
}

// StartupDefinition describes staged creation: an operator that creates some
// pods only after others run or finish (JobSet startupPolicy InOrder and
// dependsOn, MPIJob launcherCreationPolicy WaitForWorkersReady, LeaderWorkerSet
// startupPolicy LeaderReady). Pods of one pod group in different stages can
// never all exist at once, so each stage becomes a gang of its own.
type StartupDefinition struct {
	// StagePath yields one stage per instance (0 first, a non-negative integer),
	// in the order of the component's other paths; without it every instance is
	// in stage 0.
	// +optional
	StagePath *string `json:"stagePath,omitempty"`
}

// SpecDefinition says where the component's pod spec is: exactly one of a pod
// template, a pod spec (with optional metadata), or fragments.
//
// +kubebuilder:validation:XValidation:rule="(has(self.podTemplateSpecPath) ? 1 : 0) + (has(self.podSpecPath) ? 1 : 0) + (has(self.fragmentedPodSpecDefinition) ? 1 : 0) == 1",message="set exactly one of podTemplateSpecPath, podSpecPath or fragmentedPodSpecDefinition"
// +kubebuilder:validation:XValidation:rule="!has(self.metadataPath) || has(self.podSpecPath)",message="metadataPath is only allowed with podSpecPath"
type SpecDefinition struct {
	// +optional
	PodTemplateSpecPath *string `json:"podTemplateSpecPath,omitempty"`
	// +optional
	PodSpecPath *string `json:"podSpecPath,omitempty"`
	// +optional
	MetadataPath *string `json:"metadataPath,omitempty"`
	// +optional
	FragmentedPodSpecDefinition *FragmentedPodSpecDefinition `json:"fragmentedPodSpecDefinition,omitempty"`
}

// FragmentedPodSpecDefinition gives the paths of the parts of a pod spec that a
// workload keeps in different places.
type FragmentedPodSpecDefinition struct {
	// +optional
	SchedulerNamePath *string `json:"schedulerNamePath,omitempty"`
	// +optional
	LabelsPath *string `json:"labelsPath,omitempty"`
	// +optional
	AnnotationsPath *string `json:"annotationsPath,omitempty"`
	// ResourcesPath yields the resource requirements of the main container.
	// +optional
	ResourcesPath *string `json:"resourcesPath,omitempty"`
	// +optional
	ResourceClaimsPath *string `json:"resourceClaimsPath,omitempty"`
	// +optional
	PodAffinityPath *string `json:"podAffinityPath,omitempty"`
	// +optional
	NodeAffinityPath *string `json:"nodeAffinityPath,omitempty"`
	// +optional
	ContainersPath *string `json:"containersPath,omitempty"`
	// +optional
	ContainerPath *string `json:"containerPath,omitempty"`
	// +optional
	PriorityClassNamePath *string `json:"priorityClassNamePath,omitempty"`
	// +optional
	ImagePath *string `json:"imagePath,omitempty"`
}

// ScaleDefinition gives the replica counts of a component.
type ScaleDefinition struct {
	// +optional
	ReplicasPath *string `json:"replicasPath,omitempty"`
	// +optional
	MinReplicasPath *string `json:"minReplicasPath,omitempty"`
	// +optional
	MaxReplicasPath *string `json:"maxReplicasPath,omitempty"`
}

// SuspendDefinition lists the assignments that suspend and resume the workload.
type SuspendDefinition struct {
	// +listType=atomic
	SuspendActions []SuspendAction `json:"suspendActions"`
	// +listType=atomic
	ResumeActions []SuspendAction `json:"resumeActions"`
}

// SuspendAction assigns Value at Path.
type SuspendAction struct {
	Path string `json:"path"`
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	Value apiextensionsv1.JSON `json:"value"`
}

// PodSelector tells, from a pod, whether it belongs to this component and which
// instance and replica it is.
type PodSelector struct {
	// +optional
	ComponentTypeSelector *ComponentTypeSelector `json:"componentTypeSelector,omitempty"`
	// +optional
	ComponentInstanceSelector *ComponentInstanceSelector `json:"componentInstanceSelector,omitempty"`
	// +optional
	ReplicaSelector *ReplicaSelector `json:"replicaSelector,omitempty"`
}

// ComponentTypeSelector matches pods whose KeyPath equals Value (or, without Value,
// is present).
type ComponentTypeSelector struct {
	KeyPath string `json:"keyPath"`
	// +optional
	Value *string `json:"value,omitempty"`
}

// ComponentInstanceSelector yields the pod's instance id.
type ComponentInstanceSelector struct {
	IdPath string `json:"idPath"` //nolint:revive // field name fixed by the format
}

// ReplicaSelector yields the pod's replica index (or group id).
type ReplicaSelector struct {
	KeyPath string `json:"keyPath"`
}

// StatusDefinition maps the workload's own status to a common status.
type StatusDefinition struct {
	// +optional
	PhaseDefinition *PhaseDefinition `json:"phaseDefinition,omitempty"`
	// +optional
	ConditionsDefinition *ConditionsDefinition `json:"conditionsDefinition,omitempty"`
	StatusMappings       StatusMappings        `json:"statusMappings"`
}

// PhaseDefinition gives the path of a phase or state string.
type PhaseDefinition struct {
	Path string `json:"path"`
}

// ConditionsDefinition gives the path of a conditions list and its field names.
type ConditionsDefinition struct {
	Path string `json:"path"`
	// +optional
	TypeFieldName string `json:"typeFieldName,omitempty"`
	// +optional
	StatusFieldName string `json:"statusFieldName,omitempty"`
	// +optional
	MessageFieldName *string `json:"messageFieldName,omitempty"`
	// +optional
	ReasonFieldName *string `json:"reasonFieldName,omitempty"`
}

// StatusMappings lists, per common status, matchers of which any one suffices.
type StatusMappings struct {
	// +optional
	Initializing []StatusMatcher `json:"initializing,omitempty"`
	// +optional
	Pending []StatusMatcher `json:"pending,omitempty"`
	// +optional
	Progressing []StatusMatcher `json:"progressing,omitempty"`
	// +optional
	Running []StatusMatcher `json:"running,omitempty"`
	// +optional
	Completed []StatusMatcher `json:"completed,omitempty"`
	// +optional
	Failed []StatusMatcher `json:"failed,omitempty"`
	// +optional
	Degraded []StatusMatcher `json:"degraded,omitempty"`
	// +optional
	Suspended []StatusMatcher `json:"suspended,omitempty"`
	// +optional
	Suspending []StatusMatcher `json:"suspending,omitempty"`
	// +optional
	Resuming []StatusMatcher `json:"resuming,omitempty"`
}

// StatusMatcher matches when all of its parts that are set match.
type StatusMatcher struct {
	// +optional
	ByPhase string `json:"byPhase,omitempty"`
	// ByConditions: every listed condition must be present with the given status
	// (and reason, when set).
	// +optional
	ByConditions []ExpectedCondition `json:"byConditions,omitempty"`
	// +optional
	ByExpression *ExpressionMatcher `json:"byExpression,omitempty"`
}

// ExpressionMatcher matches when the jq Expression yields ExpectedResult (compared
// as text).
type ExpressionMatcher struct {
	Expression     string `json:"expression"`
	ExpectedResult string `json:"expectedResult"`
}

// ExpectedCondition is one condition a StatusMatcher requires.
type ExpectedCondition struct {
	Type string `json:"type"`
	// +optional
	Status *string `json:"status,omitempty"`
	// +optional
	Reason *string `json:"reason,omitempty"`
}

// OptimizationInstructions holds the scheduling instructions of a definition.
type OptimizationInstructions struct {
	// +optional
	GangScheduling *GangSchedulingInstruction `json:"gangScheduling,omitempty"`
}

// GangSchedulingInstruction lists the pod groups (gangs) of the workload.
type GangSchedulingInstruction struct {
	// +listType=map
	// +listMapKey=name
	PodGroups []PodGroupDefinition `json:"podGroups"`
}

// PodGroupDefinition is one kind of gang: the pods of its member components,
// split into one gang per distinct value tuple of the members' groupByKeyPaths.
type PodGroupDefinition struct {
	Name string `json:"name"`
	// +listType=map
	// +listMapKey=componentName
	Members []PodGroupMemberDefinition `json:"members"`
}

// PodGroupMemberDefinition adds a component's pods to a pod group.
type PodGroupMemberDefinition struct {
	ComponentName string `json:"componentName"`
	// GroupByKeyPaths are evaluated on pods; pods with equal values share a gang.
	// +optional
	GroupByKeyPaths []string `json:"groupByKeyPaths,omitempty"`
	// Filters are jq predicates on pods; all must hold for a pod to be a member.
	// +optional
	Filters []string `json:"filters,omitempty"`
}
