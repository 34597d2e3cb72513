// Package v1alpha1 holds the report of tessera's shadow mode (group scheduling.tessera.dev):
// ShadowReport, one object per gang, saying what tessera would have decided for the gang on
// the same snapshot and what the scheduler in use actually did. It is its own Go package (not
// controlplane/api/v1alpha1) so that the CLI can read reports without the scheduler's
// packages and so that its generated code stays apart from Queue's and PodGroup's. The CRD in
// deployments/crds is generated from these types by controller-gen (go generate).
//
// +kubebuilder:object:generate=true
// +groupName=scheduling.tessera.dev
package v1alpha1

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object crd:crdVersions=v1 paths=. output:crd:artifacts:config=../../../../deployments/crds
