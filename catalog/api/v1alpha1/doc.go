// Package v1alpha1 holds the catalog.tessera.dev/v1alpha1 API: the WorkloadDefinition
// object, whose spec is a Workload Map definition (the format that KAI Scheduler and
// Run:ai read as Karta / ResourceInterface). The same spec types decode all three
// envelopes, so a definition written for those schedulers works unchanged here.
//
// +kubebuilder:object:generate=true
// +groupName=catalog.tessera.dev
package v1alpha1

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object paths=./...
//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 crd:crdVersions=v1 paths=./... output:crd:artifacts:config=../../../deployments/crds
