// Package v1alpha1 holds the scheduling API of tessera (group scheduling.tessera.dev): the
// cluster-scoped, hierarchical Queue and the namespaced PodGroup (one gang). The CRDs in
// deployments/crds are generated from these types by controller-gen (go generate).
//
// +kubebuilder:object:generate=true
// +groupName=scheduling.tessera.dev
package v1alpha1

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object crd:crdVersions=v1 paths=. output:crd:artifacts:config=../../../deployments/crds
