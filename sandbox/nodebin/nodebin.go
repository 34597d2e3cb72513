// Package nodebin finds, or builds from the Go module proxy, the binaries of
// a real node — the kubelet, containerd with its runc shim and ctr, the pods'
// pause program and the NVIDIA container toolkit's nvidia-cdi-hook — in the
// user's cache, without a checkout of tessera: the pinned modules are
// embedded.
//
//   - kubelet: k8s.io/kubernetes/cmd/kubelet from the module that builds the
//     control plane (test/k8s, embedded by sandbox/k8sbin), with its version
//     flags. The kubelet needs a few go.sum lines the control plane does not
//     (k8s.io/cri-streaming, otelrestful), so it is built with -modfile
//     against a copy, and the build fails if resolving them changed any
//     version the module pins.
//   - containerd, containerd-shim-runc-v2, ctr: from test/containerd
//     (github.com/containerd/containerd/v2, tags no_btrfs no_devmapper no_zfs,
//     CGO off). Debian's containerd 1.6 has no CDI.
//   - pause: ./pause, the pods' sandbox image (there is no registry).
//   - nvidia-cdi-hook: github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
//     at exactly the version tessera's go.mod requires (the nvcdi that writes
//     the CDI specs whose hooks run it), with cgo (go-nvml needs it).
//
// They go into ~/.cache/tessera/node/<stamp>, where the stamp hashes the
// pinned module files, the build flags and `go version`; hack/build-node.sh
// runs this code, so CI, the tests and an installed `tessera sandbox up
// --real-node` share one build. runc and the CNI plugins come from the
// distribution (Debian's runc, containernetworking-plugins).
package nodebin

import (
	"context"
	"crypto/sha256"
	_ "embed" // the pinned modules' files
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"

	"github.com/tessera-gpu/tessera/sandbox/internal/binbuild"
	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
)

//go:generate sh -c "cp ../../test/containerd/go.mod module/containerd/go.mod.txt && cp ../../test/containerd/go.sum module/containerd/go.sum.txt && cp ../../test/containerd/tools.go module/containerd/tools.go.txt && go list -m -f '{{.Version}}' github.com/NVIDIA/nvidia-container-toolkit > module/nvidia-container-toolkit.version.txt"

// Copies made by `go generate` (a test fails when they differ): embed cannot
// reach a nested module, nor tessera's go.mod above this directory.
var (
	//go:embed module/containerd/go.mod.txt
	containerdGoMod []byte
	//go:embed module/containerd/go.sum.txt
	containerdGoSum []byte
	//go:embed module/containerd/tools.go.txt
	containerdTools []byte
	//go:embed module/nvidia-container-toolkit.version.txt
	toolkitVersion string
	//go:embed pause/main.go
	pauseMain []byte
)

// ContainerdModuleFiles are the embedded copies of test/containerd's files.
func ContainerdModuleFiles() map[string][]byte {
	return map[string][]byte{"go.mod": containerdGoMod, "go.sum": containerdGoSum, "tools.go": containerdTools}
}

// ToolkitVersion is the NVIDIA container toolkit version tessera's go.mod
// requires, e.g. v1.18.2.
func ToolkitVersion() string { return strings.TrimSpace(toolkitVersion) }

// ContainerdVersion is the pinned github.com/containerd/containerd/v2 version.
func ContainerdVersion() string {
	return requireVersion(containerdGoMod, "github.com/containerd/containerd/v2")
}

func requireVersion(gomod []byte, path string) string {
	f, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		return "unknown"
	}
	for _, r := range f.Require {
		if r.Mod.Path == path {
			return r.Mod.Version
		}
	}
	return "unknown"
}

// Binary is one program of a real node.
type Binary struct {
	// Name is the file name in the binary directory.
	Name string
	// Package is what is built.
	Package string
	kind    kind
}

type kind int

const (
	kubelet kind = iota
	containerd
	pause
	cdiHook
)

// HookPackage is nvidia-cdi-hook's main package.
const HookPackage = "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"

// The binaries this package builds.
var (
	Kubelet       = Binary{Name: "kubelet", Package: "k8s.io/kubernetes/cmd/kubelet", kind: kubelet}
	Containerd    = Binary{Name: "containerd", Package: "github.com/containerd/containerd/v2/cmd/containerd", kind: containerd}
	Shim          = Binary{Name: "containerd-shim-runc-v2", Package: "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", kind: containerd}
	Ctr           = Binary{Name: "ctr", Package: "github.com/containerd/containerd/v2/cmd/ctr", kind: containerd}
	Pause         = Binary{Name: "pause", Package: "./pause", kind: pause}
	NVIDIACDIHook = Binary{Name: "nvidia-cdi-hook", Package: HookPackage, kind: cdiHook}
)

// All are the binaries a real node runs.
var All = []Binary{Kubelet, Containerd, Shim, Ctr, Pause, NVIDIACDIHook}

// EnvDir names a directory to use (and build into) instead of the cache.
const EnvDir = "TESSERA_NODE_BIN"

// containerdTags keep containerd free of the snapshotters that need C
// libraries.
const containerdTags = "no_btrfs no_devmapper no_zfs"

func containerdLDFlags() string {
	return "-s -w -X github.com/containerd/containerd/v2/version.Version=" + ContainerdVersion() +
		" -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
}

// hookLDFlags set the version nvidia-cdi-hook --version reports, as NVIDIA's
// Makefile does (without the v).
func hookLDFlags() string {
	return "-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=" + strings.TrimPrefix(ToolkitVersion(), "v")
}

// buildFlags is the line of build flags in the stamp.
func buildFlags() string {
	return k8sbin.KubeLDFlags() + "|" + containerdTags + "|" + containerdLDFlags() + "|" + HookPackage + "@" + ToolkitVersion() + "|" + hookLDFlags()
}

// Stamp is the cache key: the pinned module files (test/k8s's go.mod and
// go.sum, test/containerd's, pause's main.go), the build flags with the
// toolkit version, and the Go toolchain (`go version`'s output, newline
// included) — in shell: (cat k8s/go.mod k8s/go.sum containerd/go.mod
// containerd/go.sum pause/main.go; echo "$flags"; go version) | sha256sum.
func Stamp(goVersion string) string {
	h := sha256.New()
	k8s := k8sbin.ModuleFiles()
	for _, b := range [][]byte{k8s["go.mod"], k8s["go.sum"], containerdGoMod, containerdGoSum, pauseMain} {
		h.Write(b)
	}
	h.Write([]byte(buildFlags() + "\n"))
	h.Write([]byte(goVersion))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Options say where to look and whom to tell.
type Options struct {
	// Dir overrides the directory; default $TESSERA_NODE_BIN, else the cache.
	Dir string
	// Out receives one progress line per binary built; nil: silence.
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

// Dir returns the directory the node binaries are in, or will be built
// into, without building anything.
func Dir(ctx context.Context, opts Options) (string, error) {
	dir, _, err := resolve(ctx, opts)
	return dir, err
}

func resolve(ctx context.Context, opts Options) (dir, stamp string, err error) {
	goVersion, err := binbuild.GoVersion(ctx, opts.goCmd(), "the node binaries (kubelet, containerd, nvidia-cdi-hook)")
	if err != nil {
		return "", "", err
	}
	stamp = Stamp(goVersion)
	if dir = opts.Dir; dir == "" {
		dir = os.Getenv(EnvDir)
	}
	if dir == "" {
		root, err := binbuild.CacheRoot()
		if err != nil {
			return "", "", err
		}
		dir = filepath.Join(root, "node", stamp)
	}
	return dir, stamp, nil
}

// Missing lists which of bins are not built in dir for this stamp.
func Missing(dir, stamp string, bins []Binary) []Binary {
	if !binbuild.HasStamp(dir, stamp) {
		return bins
	}
	var missing []Binary
	for _, b := range bins {
		if !binbuild.Executable(filepath.Join(dir, b.Name)) {
			missing = append(missing, b)
		}
	}
	return missing
}

// Ensure returns the directory holding bins (default All), building those
// that are missing. Concurrent callers build each binary once.
func Ensure(ctx context.Context, opts Options, bins ...Binary) (string, error) {
	if len(bins) == 0 {
		bins = All
	}
	dir, stamp, err := resolve(ctx, opts)
	if err != nil {
		return "", err
	}
	if len(Missing(dir, stamp, bins)) == 0 {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("node binary directory: %w", err)
	}
	unlock, err := binbuild.Lock(ctx, filepath.Join(dir, ".lock"), opts.Out, "the node binaries")
	if err != nil {
		return "", err
	}
	defer unlock()
	missing := Missing(dir, stamp, bins)
	if len(missing) == 0 {
		return dir, nil
	}
	if !binbuild.HasStamp(dir, stamp) {
		for _, b := range All {
			_ = os.Remove(filepath.Join(dir, b.Name))
		}
		if err := os.WriteFile(filepath.Join(dir, binbuild.StampFile), []byte(stamp+"\n"), 0o644); err != nil {
			return "", fmt.Errorf("write %s: %w", binbuild.StampFile, err)
		}
	}
	src, err := writeModules(dir)
	if err != nil {
		return "", err
	}
	p := binbuild.NewProgress(opts.Out)
	p.Printf("node binaries (kubelet %s, containerd %s, nvidia-cdi-hook %s): building %s from the Go module proxy into %s (once; later runs reuse them)\n",
		k8sbin.KubernetesVersion(), ContainerdVersion(), ToolkitVersion(), names(missing), dir)
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

// writeModules puts the embedded modules where go build can use them,
// beside the binaries: .src/k8s, .src/containerd, .src/pause.
func writeModules(dir string) (string, error) {
	src := filepath.Join(dir, ".src")
	files := map[string][]byte{
		"pause/go.mod":  []byte("module tessera.local/pause\n\ngo 1.26\n"),
		"pause/main.go": pauseMain,
	}
	for name, data := range k8sbin.ModuleFiles() {
		files["k8s/"+name] = data
	}
	for name, data := range ContainerdModuleFiles() {
		files["containerd/"+name] = data
	}
	for name, data := range files {
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
	tmp := filepath.Join(dir, "."+b.Name+".tmp")
	_ = os.Remove(tmp)
	var cmd *exec.Cmd
	env := binbuild.Env("CGO_ENABLED=0") // static binaries, no C compiler output
	switch b.kind {
	case kubelet:
		// A fresh copy of the pinned go.mod and go.sum every time: the build
		// may add go.sum lines to the copy, never to the pins.
		k8s := k8sbin.ModuleFiles()
		modFile := filepath.Join(src, "k8s", "kubelet.mod")
		if err := os.WriteFile(modFile, k8s["go.mod"], 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(src, "k8s", "kubelet.sum"), k8s["go.sum"], 0o644); err != nil {
			return err
		}
		cmd = exec.CommandContext(ctx, goCmd, "build", "-mod=mod", "-modfile="+modFile, "-trimpath", "-ldflags", k8sbin.KubeLDFlags(), "-o", tmp, b.Package)
		cmd.Dir = filepath.Join(src, "k8s")
	case containerd:
		cmd = exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-tags", containerdTags, "-ldflags", containerdLDFlags(), "-o", tmp, b.Package)
		cmd.Dir = filepath.Join(src, "containerd")
	case pause:
		cmd = exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp, ".")
		cmd.Dir = filepath.Join(src, "pause")
	case cdiHook:
		// go install pkg@version builds the toolkit's own module at that
		// version. go-nvml needs cgo; the hook runs on the host, beside runc.
		if _, err := exec.LookPath("gcc"); err != nil && os.Getenv("CC") == "" {
			return fmt.Errorf("build %s: it needs cgo and there is no gcc on PATH (apt-get install gcc)", b.Name)
		}
		gobin := filepath.Join(dir, ".gobin")
		if err := os.MkdirAll(gobin, 0o755); err != nil {
			return err
		}
		defer os.RemoveAll(gobin)
		cmd = exec.CommandContext(ctx, goCmd, "install", "-trimpath", "-ldflags", hookLDFlags(), b.Package+"@"+ToolkitVersion())
		cmd.Dir = dir
		env = binbuild.Env("CGO_ENABLED=1", "CGO_CFLAGS="+quietCFlags(), "GOBIN="+gobin)
	}
	cmd.Env = env
	if err := p.Run(cmd, step, b.Name); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("%w (package %s)", err, b.Package)
	}
	if b.kind == cdiHook {
		if err := os.Rename(filepath.Join(dir, ".gobin", b.Name), tmp); err != nil {
			return fmt.Errorf("install %s: %w", b.Name, err)
		}
	}
	if b.kind == kubelet {
		if err := checkPins(k8sbin.ModuleFiles()["go.mod"], filepath.Join(src, "k8s", "kubelet.mod")); err != nil {
			_ = os.Remove(tmp)
			return err
		}
	}
	if err := os.Rename(tmp, filepath.Join(dir, b.Name)); err != nil {
		return fmt.Errorf("install %s: %w", b.Name, err)
	}
	return nil
}

// checkPins fails when building the kubelet changed a version the control
// plane's module pins.
func checkPins(pinned []byte, modFile string) error {
	built, err := os.ReadFile(modFile)
	if err != nil {
		return fmt.Errorf("kubelet module file: %w", err)
	}
	want, err := modfile.ParseLax("go.mod", pinned, nil)
	if err != nil {
		return fmt.Errorf("pinned go.mod: %w", err)
	}
	got, err := modfile.ParseLax(modFile, built, nil)
	if err != nil {
		return fmt.Errorf("kubelet module file: %w", err)
	}
	have := map[string]string{}
	for _, r := range got.Require {
		have[r.Mod.Path] = r.Mod.Version
	}
	var changed []string
	for _, r := range want.Require {
		if v := have[r.Mod.Path]; v != r.Mod.Version {
			changed = append(changed, fmt.Sprintf("%s %s → %s", r.Mod.Path, r.Mod.Version, v))
		}
	}
	if len(changed) > 0 {
		return errors.New("building the kubelet would change these pins of test/k8s/go.mod: " + strings.Join(changed, ", "))
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
