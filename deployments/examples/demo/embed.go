// Package demo embeds the manifests of the sandbox demo scenario
// (`tessera sandbox up --scenario demo`), applied in file-name order. The user
// guide shows the same files.
package demo

import "embed"

// FS holds the scenario's manifests.
//
//go:embed *.yaml
var FS embed.FS
