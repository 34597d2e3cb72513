// Package k8sbin finds, or builds from the Go module proxy, the real Kubernetes
// binaries of the pinned release — etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kubectl — in the user's cache,
// without a checkout of tessera: the pinned module (test/k8s: go.mod, go.sum
// and etcd's three-line main) is embedded.
//
// The binaries go into ~/.cache/tessera/k8s/<stamp>, where stamp hashes the
// module files, the build flags and `go version` exactly as hack/build-k8s.sh
// always has, so the tests, CI and an installed `tessera sandbox up` share
// one build. Each binary is built only when something asks for it: the
// sandbox needs etcd, kube-apiserver, kube-controller-manager and kubectl;
// kube-scheduler is built for the tests and benchmarks only.
package k8sbin

import (
	"context"
	"crypto/sha256"
	_ "embed" // the pinned module's files
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/sandbox/internal/binbuild"
)

//go:generate sh -c "cp ../../test/k8s/go.mod module/go.mod.txt && cp ../../test/k8s/go.sum module/go.sum.txt && cp ../../test/k8s/etcd/main.go module/etcd/main.go.txt"

// The module test/k8s, copied by `go generate` (a test fails when the copies
// differ): embed cannot reach a nested module, and a file named go.mod here
// would make this directory a module of its own.
var (
	//go:embed module/go.mod.txt
	goMod []byte
	//go:embed module/go.sum.txt
	goSum []byte
	//go:embed module/etcd/main.go.txt
	etcdMain []byte
)

// ModuleFiles are the embedded module's files by their path in test/k8s.
func ModuleFiles() map[string][]byte {
	return map[string][]byte{"go.mod": goMod, "go.sum": goSum, "etcd/main.go": etcdMain}
}

// Binary is one program of the pinned release.
type Binary struct {
	// Name is the file name in the binary directory.
	Name string
	// Package is what `go build` builds, in the embedded module.
	Package string
}

// The binaries this package builds.
var (
	Etcd              = Binary{Name: "etcd", Package: "./etcd"}
	APIServer         = Binary{Name: "kube-apiserver", Package: "k8s.io/kubernetes/cmd/kube-apiserver"}
	ControllerManager = Binary{Name: "kube-controller-manager", Package: "k8s.io/kubernetes/cmd/kube-controller-manager"}
	Kubectl           = Binary{Name: "kubectl", Package: "k8s.io/kubernetes/cmd/kubectl"}
	Scheduler         = Binary{Name: "kube-scheduler", Package: "k8s.io/kubernetes/cmd/kube-scheduler"}
)

// ControlPlane is what a control plane runs on; Sandbox adds kubectl; All
// adds kube-scheduler, which only the tests and benchmarks run.
var (
	ControlPlane = []Binary{Etcd, APIServer, ControllerManager}
	Sandbox      = []Binary{Etcd, APIServer, ControllerManager, Kubectl}
	All          = []Binary{Etcd, APIServer, ControllerManager, Kubectl, Scheduler}
)

// Lookup returns the binary of that name.
func Lookup(name string) (Binary, bool) {
	for _, b := range All {
		if b.Name == name {
			return b, true
		}
	}
	return Binary{}, false
}

// EnvDir names a directory to use (and build into) instead of the cache.
const EnvDir = "TESSERA_K8S_BIN"

// KubernetesVersion is the pinned k8s.io/kubernetes version, e.g. v1.37.2.
func KubernetesVersion() string {
	for line := range strings.SplitSeq(string(goMod), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "k8s.io/kubernetes" {
			return f[1]
		}
	}
	return "unknown"
}

// KubeLDFlags make the Kubernetes binaries (the kubelet too) report the pinned version instead
// of v0.0.0-master. They are part of the stamp, in the very words of
// hack/build-k8s.sh up to this package.
func KubeLDFlags() string {
	v := KubernetesVersion()
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	major, minor := parts[0], ""
	if len(parts) > 1 {
		minor = parts[1]
	}
	return "-s -w -X k8s.io/component-base/version.gitVersion=" + v +
		" -X k8s.io/component-base/version.gitMajor=" + major +
		" -X k8s.io/component-base/version.gitMinor=" + minor +
		" -X k8s.io/component-base/version.gitTreeState=clean" +
		" -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
}

// Stamp is the cache key: the module files, the build flags and the Go
// toolchain (the output of `go version`, newline included).
func Stamp(goVersion string) string {
	h := sha256.New()
	h.Write(goMod)
	h.Write(goSum)
	h.Write(etcdMain)
	h.Write([]byte(KubeLDFlags() + "\n"))
	h.Write([]byte(goVersion))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// CacheRoot is ~/.cache/tessera (or $XDG_CACHE_HOME/tessera).
func CacheRoot() (string, error) { return binbuild.CacheRoot() }

// Options say where to look and whom to tell.
type Options struct {
	// Dir overrides the directory; default $TESSERA_K8S_BIN, else the cache.
	Dir string
	// Out receives one progress line per binary built (with its build time);
	// on a terminal the line counts up while the build runs. Nil: silence.
	Out io.Writer
	// Go is the go command; default "go" on PATH.
	Go string
}

func (o *Options) goCmd() string {
	if o.Go != "" {
		return o.Go
	}
	return "go"
}

// GoVersion runs `go version`; its output is part of the stamp.
func GoVersion(ctx context.Context, goCmd string) (string, error) {
	return binbuild.GoVersion(ctx, goCmd, "the Kubernetes binaries")
}

// Dir returns the directory the binaries of this release are in, or will be
// built into, without building anything.
func Dir(ctx context.Context, opts Options) (string, error) {
	dir, _, err := resolve(ctx, opts)
	return dir, err
}

func resolve(ctx context.Context, opts Options) (dir, stamp string, err error) {
	goVersion, err := GoVersion(ctx, opts.goCmd())
	if err != nil {
		return "", "", err
	}
	stamp = Stamp(goVersion)
	dir = opts.Dir
	if dir == "" {
		dir = os.Getenv(EnvDir)
	}
	if dir == "" {
		root, err := CacheRoot()
		if err != nil {
			return "", "", err
		}
		dir = filepath.Join(root, "k8s", stamp)
	}
	return dir, stamp, nil
}

const stampFile = binbuild.StampFile

// Missing lists which of bins are not built in dir for this stamp.
func Missing(dir, stamp string, bins []Binary) []Binary {
	if !binbuild.HasStamp(dir, stamp) {
		return bins // another release or toolchain built here: everything again
	}
	var missing []Binary
	for _, b := range bins {
		if !binbuild.Executable(filepath.Join(dir, b.Name)) {
			missing = append(missing, b)
		}
	}
	return missing
}

// Ensure returns the directory holding bins, building those that are
// missing. Concurrent callers (two terminals, parallel test binaries) build
// each binary once: they take turns on a lock in the directory.
func Ensure(ctx context.Context, opts Options, bins ...Binary) (string, error) {
	dir, stamp, err := resolve(ctx, opts)
	if err != nil {
		return "", err
	}
	if len(Missing(dir, stamp, bins)) == 0 {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("binary directory: %w", err)
	}
	unlock, err := binbuild.Lock(ctx, filepath.Join(dir, ".lock"), opts.Out, "the Kubernetes binaries")
	if err != nil {
		return "", err
	}
	defer unlock()
	missing := Missing(dir, stamp, bins) // another process may have built them meanwhile
	if len(missing) == 0 {
		return dir, nil
	}
	if !binbuild.HasStamp(dir, stamp) {
		// Not ours (or a half-written directory): start afresh.
		for _, b := range All {
			_ = os.Remove(filepath.Join(dir, b.Name))
		}
		if err := os.WriteFile(filepath.Join(dir, stampFile), []byte(stamp+"\n"), 0o644); err != nil {
			return "", fmt.Errorf("write %s: %w", stampFile, err)
		}
	}
	src, err := writeModule(dir)
	if err != nil {
		return "", err
	}
	p := binbuild.NewProgress(opts.Out)
	p.Printf("Kubernetes %s: building %s from the Go module proxy into %s (once; later runs reuse them)\n",
		KubernetesVersion(), names(missing), dir)
	start := time.Now()
	for i, b := range missing {
		if err := build(ctx, opts.goCmd(), src, dir, b, p, fmt.Sprintf("%d/%d", i+1, len(missing))); err != nil {
			return "", err
		}
	}
	if len(missing) > 1 {
		p.Printf("  built %d binaries in %s\n", len(missing), binbuild.Elapsed(start))
	}
	return dir, nil
}

// writeModule puts the embedded module where go build can use it: beside the
// binaries, since it is what they were built from.
func writeModule(dir string) (string, error) {
	src := filepath.Join(dir, ".src")
	for name, data := range ModuleFiles() {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", fmt.Errorf("module source: %w", err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return "", fmt.Errorf("module source: %w", err)
		}
	}
	return src, nil
}

func build(ctx context.Context, goCmd, src, dir string, b Binary, p *binbuild.Progress, step string) error {
	ldflags := KubeLDFlags()
	if b == Etcd {
		ldflags = "-s -w"
	}
	tmp := filepath.Join(dir, "."+b.Name+".tmp")
	cmd := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-ldflags", ldflags, "-o", tmp, b.Package)
	cmd.Dir = src
	// CGO_ENABLED=0: static binaries, and no C compiler output on screen.
	cmd.Env = binbuild.Env("CGO_ENABLED=0")
	if err := p.Run(cmd, step, b.Name); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("%w (package %s)", err, b.Package)
	}
	if err := os.Rename(tmp, filepath.Join(dir, b.Name)); err != nil {
		return fmt.Errorf("install %s: %w", b.Name, err)
	}
	return nil
}

func names(bins []Binary) string {
	n := make([]string, len(bins))
	for i, b := range bins {
		n[i] = b.Name
	}
	return strings.Join(n, ", ")
}
