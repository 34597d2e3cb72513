//go:build tools

// Package tools pins the operator that hack/build-operators.sh builds.
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
)
