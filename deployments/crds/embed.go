// Package crds embeds the CustomResourceDefinitions tessera serves (Queue, PodGroup, ShadowReport, WorkloadDefinition), so that
// the sandbox and tests apply the same files that users install.
package crds

import "embed"

// FS holds every YAML file of this directory.
//
//go:embed *.yaml
var FS embed.FS
