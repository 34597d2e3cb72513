package nodebin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/tessera-gpu/tessera/sandbox/internal/binbuild"
)

// TesseraModule is tessera's module; tessera-node is its cmd/tessera-node.
const TesseraModule = "github.com/tessera-gpu/tessera"

// ErrNoModuleVersion says that this program was built in a checkout (its
// build info has no module version), so tessera-node cannot be built from
// the Go module proxy at the same version: it belongs beside this program.
var ErrNoModuleVersion = errors.New("this program was built in a checkout, not installed from a module version, so tessera-node cannot be built from the Go module proxy at its version: build it beside this program (make build)")

// ModuleVersion is the version of tessera this program was installed at
// (`go install github.com/tessera-gpu/tessera/cmd/tessera@v…`), or "" for a
// build in a checkout.
func ModuleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Main.Path != TesseraModule || bi.Main.Version == "" || bi.Main.Version == "(devel)" {
		return ""
	}
	return bi.Main.Version
}

// TesseraNode returns a tessera-node binary of tessera at version (a module
// version, as ModuleVersion gives), building it into
// ~/.cache/tessera/tessera-node/<version>-<go> with `go install
// github.com/tessera-gpu/tessera/cmd/tessera-node@<version>` when it is not
// there: an installed CLI has no tessera-node beside it. It needs cgo (the
// real NVML backend's go-nvml), as the hook does.
func TesseraNode(ctx context.Context, opts Options, version string) (string, error) {
	if version == "" {
		return "", ErrNoModuleVersion
	}
	goVersion, err := binbuild.GoVersion(ctx, opts.goCmd(), "tessera-node")
	if err != nil {
		return "", err
	}
	root, err := binbuild.CacheRoot()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(goVersion))
	dir := filepath.Join(root, "tessera-node", strings.ReplaceAll(version, "/", "_")+"-"+hex.EncodeToString(sum[:])[:8])
	bin := filepath.Join(dir, "tessera-node")
	if binbuild.Executable(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("tessera-node directory: %w", err)
	}
	unlock, err := binbuild.Lock(ctx, filepath.Join(dir, ".lock"), opts.Out, "tessera-node")
	if err != nil {
		return "", err
	}
	defer unlock()
	if binbuild.Executable(bin) {
		return bin, nil
	}
	if _, err := exec.LookPath("gcc"); err != nil && os.Getenv("CC") == "" {
		return "", errors.New("tessera-node needs cgo and there is no gcc on PATH (apt-get install gcc)")
	}
	gobin := filepath.Join(dir, ".gobin")
	defer os.RemoveAll(gobin)
	pkg := TesseraModule + "/cmd/tessera-node@" + version
	cmd := exec.CommandContext(ctx, opts.goCmd(), "install", "-trimpath", pkg)
	cmd.Dir = dir
	cmd.Env = binbuild.Env("CGO_ENABLED=1", "CGO_CFLAGS="+quietCFlags(), "GOBIN="+gobin)
	p := binbuild.NewProgress(opts.Out)
	p.Printf("tessera-node %s: building it from the Go module proxy into %s (once)\n", version, dir)
	if err := p.Run(cmd, "1/1", "tessera-node"); err != nil {
		return "", fmt.Errorf("%w (%s)", err, pkg)
	}
	if err := os.Rename(filepath.Join(gobin, "tessera-node"), bin); err != nil {
		return "", fmt.Errorf("install tessera-node: %w", err)
	}
	return bin, nil
}

// quietCFlags are the caller's CGO_CFLAGS, or flags that silence go-nvml's
// deprecated declarations.
func quietCFlags() string {
	if f := os.Getenv("CGO_CFLAGS"); f != "" {
		return f
	}
	return "-O2 -g -Wno-deprecated-declarations"
}
