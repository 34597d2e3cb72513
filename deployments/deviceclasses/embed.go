// Package deviceclasses embeds the DeviceClasses of the gpu.tessera.dev driver, so that
// the sandbox and tests apply the same files that users install.
package deviceclasses

import "embed"

// FS holds every YAML file of this directory.
//
//go:embed *.yaml
var FS embed.FS
