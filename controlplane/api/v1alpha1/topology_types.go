package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Topology is an ordered list of node labels, broadest first (block > rack > host), that
// group nodes into nested domains. Gangs name a level to stay within (required) or to prefer
// (preferred): in their PodGroup's topology, in the upstream PodGroup's topology constraint,
// or in the annotations KAI Scheduler (kai.scheduler/topology*) and Kueue
// (kueue.x-k8s.io/podset-*-topology) users write. It has the shape of KAI Scheduler's and
// Kueue's Topology objects, so their definitions carry over by changing the apiVersion.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Levels",type=string,JSONPath=`.spec.levels[*].nodeLabel`
type Topology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TopologySpec `json:"spec"`
}

// TopologySpec lists the levels.
type TopologySpec struct {
	// Levels from the broadest (e.g. a block of racks) to the narrowest (e.g. the host).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +kubebuilder:validation:XValidation:rule="self.all(l, self.exists_one(m, m.nodeLabel == l.nodeLabel))",message="levels must name distinct node labels"
	Levels []TopologyLevel `json:"levels"`
}

// TopologyLevel is one level: the node label whose values are its domains.
type TopologyLevel struct {
	// NodeLabel is the node label key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	NodeLabel string `json:"nodeLabel"`
}

// TopologyList is a list of Topologies.
//
// +kubebuilder:object:root=true
type TopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Topology `json:"items"`
}
