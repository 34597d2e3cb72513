// Package realnode holds the end-to-end tests on a real node: the real
// kubelet v1.37 and containerd v2 (sandbox/realnode) drive tessera-node on mock
// GPUs, and real containers report what they received.
//
// The tests need root, runc, the CNI plugins, busybox-static and the node
// binaries of hack/build-node.sh. Without them they are skipped, unless
// TESSERA_REQUIRE_REAL_NODE is set (.ci/run sets it), which makes a missing
// prerequisite a failure. One real node runs per machine at a time: the tests
// of this package run one after another, and sandbox/realnode's machine lock
// keeps any other test binary or sandbox from starting a second kubelet.
package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/sandbox/realnode"
	"github.com/tessera-gpu/tessera/test/framework"
)

// EnvRequire makes missing real-node prerequisites a failure instead of a skip.
const EnvRequire = "TESSERA_REQUIRE_REAL_NODE"

var (
	// tesseraNode is the tessera-node binary built from this checkout.
	tesseraNode string
	// unavailable says why this machine cannot run a real node ("" if it can).
	unavailable string
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(killedOwnerChild())
	}
	if err := realnode.Check(""); err != nil {
		unavailable = err.Error()
	} else {
		dir, err := os.MkdirTemp("", "tessera-node-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		tesseraNode = filepath.Join(dir, "tessera-node")
		root, err := framework.RepoRoot()
		if err == nil {
			build := exec.Command("go", "build", "-o", tesseraNode, "./cmd/tessera-node")
			build.Dir = root
			var out []byte
			if out, err = build.CombinedOutput(); err != nil {
				err = fmt.Errorf("%w\n%s", err, out)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "build tessera-node:", err)
			_ = os.RemoveAll(dir)
			os.Exit(1)
		}
		baseline := realnode.TakeBaseline()
		code := framework.RunWith(m, framework.Options{ExtraAPIServerFlags: realnode.APIServerFlags})
		_ = os.RemoveAll(dir)
		// Every test tears its node down and checks it; this catches what a
		// test that died half-way (or a missed cleanup) left on the machine.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		left := baseline.Leftovers(ctx, "")
		cancel()
		if len(left) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: the real-node tests left things on this machine:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
		os.Exit(code)
	}
	os.Exit(framework.RunWith(m, framework.Options{ExtraAPIServerFlags: realnode.APIServerFlags}))
}
