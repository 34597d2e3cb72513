package deployments_test

import (
	"os"
	"testing"

	"github.com/tessera-gpu/tessera/test/framework"
)

// TestMain stops the shared control plane of the API-server tests.
func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }
