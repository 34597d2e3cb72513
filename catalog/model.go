package catalog

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// Role of a component in its workload.
type Role string

// Roles a component can have.
const (
	RoleLeader  Role = "leader"
	RoleWorker  Role = "worker"
	RoleService Role = "service"
)

// Status is the common status of a workload.
type Status string

// Common statuses. StatusUnknown is reported when the object has a status that no
// mapping of its definition matches.
const (
	StatusInitializing Status = "initializing"
	StatusPending      Status = "pending"
	StatusProgressing  Status = "progressing"
	StatusRunning      Status = "running"
	StatusCompleted    Status = "completed"
	StatusFailed       Status = "failed"
	StatusSuspended    Status = "suspended"
	StatusSuspending   Status = "suspending"
	StatusResuming     Status = "resuming"
	StatusDegraded     Status = "degraded"
	StatusUnknown      Status = "unknown"
)

// DefinitionRef names the definition a workload was mapped with.
type DefinitionRef struct {
	Name string `json:"name"`
	// File the definition was loaded from; empty for built-in definitions and for
	// WorkloadDefinition objects.
	File string `json:"file,omitempty"`
	// Source is "builtin", "file" or "cluster".
	Source string `json:"source"`
}

// Workload is the common model of one workload object.
type Workload struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	// GenerateName is the object's metadata.generateName; set when the object
	// has no name yet (the API server completes it on creation).
	GenerateName string        `json:"generateName,omitempty"`
	Namespace    string        `json:"namespace,omitempty"`
	UID          types.UID     `json:"uid,omitempty"`
	Definition   DefinitionRef `json:"definition"`
	// Components are the pod-bearing and structural components, one entry per
	// instance (e.g. one per replicated job of a JobSet).
	Components []Component `json:"components"`
	// Pods at full scale: every pod-bearing component at its replicas; MinPods
	// and MaxPods with every component at its minReplicas and maxReplicas.
	Pods    int64 `json:"pods"`
	MinPods int64 `json:"minPods"`
	MaxPods int64 `json:"maxPods"`
	// GPUs at full scale, at minimum and at maximum scale: whole GPUs.
	GPUs    float64 `json:"gpus"`
	MinGPUs float64 `json:"minGPUs"`
	MaxGPUs float64 `json:"maxGPUs"`
	// GPUUnits are the GPUs as quotas count them (contract): whole GPUs plus
	// fractions (KAI gpu-fraction annotations, shares of shared GPUs), at full,
	// minimum and maximum scale.
	GPUUnits    float64 `json:"gpuUnits"`
	MinGPUUnits float64 `json:"minGPUUnits"`
	MaxGPUUnits float64 `json:"maxGPUUnits"`
	// Gangs are the shapes of the workload's gangs; pods of components that are in
	// no gang are scheduled one by one.
	Gangs  []Gang `json:"gangs"`
	Status Status `json:"status"`
	// StatusMessage is the message of the condition that decided the status, if any.
	StatusMessage string `json:"statusMessage,omitempty"`
}

// GroupVersionKind of the workload.
func (w *Workload) GroupVersionKind() schema.GroupVersionKind {
	return schema.FromAPIVersionAndKind(w.APIVersion, w.Kind)
}

// Component is one instance of a definition component.
type Component struct {
	// Name is the instance id for components with instances, else the component name.
	Name string `json:"name"`
	// Component is the name of the component in the definition.
	Component string `json:"component"`
	// Instance id; empty for components without instances.
	Instance string `json:"instance,omitempty"`
	// Parent is the definition name of the parent component; empty for the root.
	Parent string `json:"parent,omitempty"`
	Role   Role   `json:"role"`
	// Kind of the object the operator creates for the component, when the
	// definition says.
	Kind string `json:"kind,omitempty"`
	// PodBearing is true when the component's replicas are pods (a leaf with a pod spec).
	PodBearing bool `json:"podBearing"`
	// Replicas at full scale, and the bounds (equal to Replicas where the workload
	// sets none).
	Replicas    int64 `json:"replicas"`
	MinReplicas int64 `json:"minReplicas"`
	MaxReplicas int64 `json:"maxReplicas"`
	// GPUsPerPod in whole-GPU equivalents: nvidia.com/gpu and tessera.dev/gpu limits
	// plus whole-GPU DRA requests that could be resolved.
	GPUsPerPod float64 `json:"gpusPerPod"`
	// GPUUnitsPerPod adds fractions to the whole GPUs (see Workload.GPUUnits).
	GPUUnitsPerPod float64 `json:"gpuUnitsPerPod"`
	// Stage is the startup stage of the component's pods (0 unless the
	// definition's startupDefinition says the operator creates them later).
	Stage int64 `json:"stage,omitempty"`
	// GangKey splits the component's pod group into gangs (the definition's
	// gangKeyPath): the gang is "<group>-<key>".
	GangKey string `json:"gangKey,omitempty"`
	// UnresolvedClaims names resource claims whose devices could not be counted
	// (the claim or template was not available).
	UnresolvedClaims []string `json:"unresolvedClaims,omitempty"`
	// PodTemplate is the pod template, assembled from fragments where the workload
	// keeps them apart.
	// (as decoded JSON: an object with metadata and spec).
	PodTemplate map[string]any `json:"podTemplate,omitempty"`
}

// Gang is one shape of gang of a workload.
type Gang struct {
	// Name of the gang; for gangs split per instance, "<podGroup>-<instance>".
	Name string `json:"name"`
	// MinMember pods must be placed together.
	MinMember int64 `json:"minMember"`
	// Count of gangs of this shape (e.g. 3 for a LeaderWorkerSet with 3 groups).
	Count int64 `json:"count"`
	// Pods in one gang at full scale.
	Pods int64 `json:"pods"`
	// Components (names as in Components) whose pods are in the gang.
	Components []string `json:"components"`
	// Stage is the startup stage the gang's pods are in, and Stages the number
	// of stages of its pod group: with Stages > 1 the operator creates the
	// stages one after the other and each is a gang of its own.
	Stage  int64 `json:"stage,omitempty"`
	Stages int64 `json:"stages,omitempty"`
}
