// Package e2e holds end-to-end tests that run against a real kube-apiserver,
// etcd and kube-controller-manager started by test/framework.
package e2e

import (
	"os"
	"testing"

	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }
