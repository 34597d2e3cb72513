// Package e2e holds end-to-end tests that run against a real kube-apiserver,
// etcd and kube-controller-manager started by test/framework, the sandbox,
// the installed CLI and the web view in a browser.
package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) {
	code := framework.Run(m)
	if cliPath != "" {
		_ = os.RemoveAll(filepath.Dir(cliPath))
	}
	os.Exit(code)
}
