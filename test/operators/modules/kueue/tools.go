//go:build tools

// Package tools pins the operator that hack/build-operators.sh builds.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
