//go:build tools

// Package tools pins the operator that hack/build-operators.sh builds.
package tools

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
)
