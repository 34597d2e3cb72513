// Package examples embeds the example manifests of the user guide, so that
// the sandbox and tests apply the same files that users install.
package examples

import "embed"

// FS holds every YAML file of this directory.
//
//go:embed *.yaml
var FS embed.FS
