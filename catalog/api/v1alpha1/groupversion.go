package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of tessera's catalog objects.
const GroupName = "catalog.tessera.dev"

// SchemeGroupVersion is the group and version of this package's types.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource of WorkloadDefinition objects, for dynamic clients and informers.
var WorkloadDefinitionsResource = SchemeGroupVersion.WithResource("workloaddefinitions")

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers WorkloadDefinition and its list in a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &WorkloadDefinition{}, &WorkloadDefinitionList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
