package deployments_test

import (
	"os"
	"testing"

	"github.com/tessera-gpu/tessera/test/framework"
)

// TestMain stops the shared control plane of the API-server tests and removes
// the binaries the tests built.
func TestMain(m *testing.M) {
	code := framework.Run(m)
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}
