// Package catalog reads any workload kind through Workload Map definitions.
//
// A Catalog holds compiled definitions (built-in ones, embedded in the binary, and
// user ones from files or WorkloadDefinition objects; a user definition for the same
// kind overrides the built-in one). Catalog.Map turns a workload object into the
// common model: components with roles, replicas and GPUs per pod, total pods and
// GPUs, gangs with their minMember, and a common status. Catalog.MatchPod tells,
// for a pod of a mapped workload, its component, instance, replica and gang. The
// resolver subpackage finds a pod's top-level workload through informers.
//
// The format and the rules are documented in docs/catalog.md.
package catalog
