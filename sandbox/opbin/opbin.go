// Package opbin finds, or builds from the Go module proxy, the real workload
// operators that the operator tests and `tessera sandbox up --operators`
// run — JobSet, LeaderWorkerSet, KubeRay, the MPI Operator, Kubeflow Trainer
// v2 and the training-operator (PyTorchJob), and Kueue for the fair benchmark
// harness — in the user's cache, without a
// checkout of tessera: the pinned modules (test/operators/modules/<name>:
// go.mod, go.sum, tools.go; one per operator, since their k8s.io and
// controller-runtime versions differ and cannot share one build list) are
// embedded.
//
// Each operator goes into ~/.cache/tessera/operators/<name>/<stamp>, where
// the stamp hashes its module files, its main package and `go version`,
// exactly as hack/build-operators.sh always has, so a pin change rebuilds
// that operator only and CI, the tests and an installed CLI share the
// builds. Beside the binary (manager) the directory holds the operator's own
// CRDs, webhook configurations and (Trainer) training runtimes, copied from
// the same module; a second stamp keys those copies.
package opbin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"

	"github.com/tessera-gpu/tessera/sandbox/internal/binbuild"
)

//go:generate sh -c "for m in jobset lws kuberay mpi-operator trainer training-operator kueue; do mkdir -p modules/$DOLLAR{m} && for f in go.mod go.sum tools.go; do cp ../../test/operators/modules/$DOLLAR{m}/$DOLLAR{f} modules/$DOLLAR{m}/$DOLLAR{f}.txt; done; done"

// The modules of test/operators/modules, copied by `go generate` (a test
// fails when the copies differ): embed cannot reach a nested module.
//
//go:embed modules
var modules embed.FS

// Operator is one operator's build.
type Operator struct {
	// Name is its directory (bin/operators/<name>, the cache's
	// operators/<name>) and module directory (test/operators/modules/<name>).
	Name string
	// Module is the operator's module, pinned by a require line.
	Module string
	// Package is the main package built as manager.
	Package string
	// Copies are "dest=glob" pairs (space-separated) of files copied from
	// the operator's module into dest/ beside the binary.
	Copies string
}

// All are the operators, in hack/build-operators.sh's order.
var All = []Operator{
	{"jobset", "sigs.k8s.io/jobset", "sigs.k8s.io/jobset", "crds=config/components/crd/bases/*.yaml webhooks=config/components/webhook/manifests.yaml webhook-patches=config/components/webhook/patches/*-patch.yaml"},
	{"lws", "sigs.k8s.io/lws", "sigs.k8s.io/lws/cmd", "crds=config/crd/bases/*.yaml webhooks=config/webhook/manifests.yaml webhook-patches=config/webhook/*-patch.yaml"},
	{"kuberay", "github.com/ray-project/kuberay/ray-operator", "github.com/ray-project/kuberay/ray-operator", "crds=config/crd/bases/*.yaml"},
	{"mpi-operator", "github.com/kubeflow/mpi-operator", "github.com/kubeflow/mpi-operator/cmd/mpi-operator", "crds=manifests/base/kubeflow.org_mpijobs.yaml"},
	{"trainer", "github.com/kubeflow/trainer/v2", "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager", "crds=manifests/base/crds/trainer.kubeflow.org_*.yaml webhooks=manifests/base/webhook/manifests.yaml webhook-patches=manifests/base/webhook/patch.yaml runtimes=manifests/base/runtimes/*_distributed.yaml"},
	// Only the PyTorchJob CRD: the MPIJob (kubeflow.org/v1) CRD of the
	// training-operator would collide with the MPI Operator's v2beta1 one.
	{"training-operator", "github.com/kubeflow/training-operator", "github.com/kubeflow/training-operator/cmd/training-operator.v1", "crds=manifests/base/crds/kubeflow.org_pytorchjobs.yaml webhooks=manifests/base/webhook/manifests.yaml webhook-patches=manifests/base/webhook/patch.yaml"},
	// Kueue's manager (the fair benchmark harness's queue pair, test/bench
	// fair_kueue_test.go): its CRDs only; the harness creates its Jobs
	// suspended and labelled, so no webhook needs to be served.
	{"kueue", "sigs.k8s.io/kueue", "sigs.k8s.io/kueue/cmd/kueue", "crds=config/components/crd/bases/*.yaml"},
}

// Lookup returns the operator of that name.
func Lookup(name string) (Operator, bool) {
	for _, o := range All {
		if o.Name == name {
			return o, true
		}
	}
	return Operator{}, false
}

// ModuleFiles are the embedded module's files (go.mod, go.sum, tools.go).
func (o Operator) ModuleFiles() map[string][]byte {
	out := map[string][]byte{}
	for _, f := range []string{"go.mod", "go.sum", "tools.go"} {
		data, err := modules.ReadFile(path.Join("modules", o.Name, f+".txt"))
		if err != nil {
			panic(fmt.Sprintf("opbin: embedded %s of %s: %v", f, o.Name, err)) // a build without `go generate`
		}
		out[f] = data
	}
	return out
}

// Version is the operator's pinned module version.
func (o Operator) Version() string {
	f, err := modfile.ParseLax("go.mod", o.ModuleFiles()["go.mod"], nil)
	if err != nil {
		return "unknown"
	}
	for _, r := range f.Require {
		if r.Mod.Path == o.Module {
			return r.Mod.Version
		}
	}
	return "unknown"
}

// Stamps are the cache keys: the binary's (module files, main package, `go
// version` with its newline) and the copied files' (the binary's and what
// is copied), as hack/build-operators.sh computed them: (cat go.mod go.sum
// tools.go; echo "$pkg"; go version) | sha256sum, and echo "$stamp $copies"
// | sha256sum.
func (o Operator) Stamps(goVersion string) (bin, files string) {
	h := sha256.New()
	m := o.ModuleFiles()
	h.Write(m["go.mod"])
	h.Write(m["go.sum"])
	h.Write(m["tools.go"])
	h.Write([]byte(o.Package + "\n"))
	h.Write([]byte(goVersion))
	bin = hex.EncodeToString(h.Sum(nil))[:16]
	sum := sha256.Sum256([]byte(bin + " " + o.Copies + "\n"))
	return bin, hex.EncodeToString(sum[:])[:16]
}

// EnvDir names a directory to use (and build into) instead of the cache:
// one directory per operator under it.
const EnvDir = "TESSERA_OPERATORS_BIN"

// Options say where to look and whom to tell.
type Options struct {
	// Dir overrides $TESSERA_OPERATORS_BIN: operators are in Dir/<name>.
	Dir string
	// Out receives one progress line per operator built; nil: silence.
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

// Dir returns the directory the operator is in, or will be built into,
// without building anything.
func Dir(ctx context.Context, opts Options, name string) (string, error) {
	op, ok := Lookup(name)
	if !ok {
		return "", unknown(name)
	}
	goVersion, err := binbuild.GoVersion(ctx, opts.goCmd(), "the workload operators")
	if err != nil {
		return "", err
	}
	return dir(opts, op, goVersion)
}

func unknown(name string) error {
	names := make([]string, len(All))
	for i, o := range All {
		names[i] = o.Name
	}
	return fmt.Errorf("unknown operator %s (known: %s)", name, strings.Join(names, ", "))
}

func dir(opts Options, op Operator, goVersion string) (string, error) {
	base := opts.Dir
	if base == "" {
		base = os.Getenv(EnvDir)
	}
	if base != "" {
		return filepath.Join(base, op.Name), nil
	}
	root, err := binbuild.CacheRoot()
	if err != nil {
		return "", err
	}
	bin, _ := op.Stamps(goVersion)
	return filepath.Join(root, "operators", op.Name, bin), nil
}

// Built reports whether the operator and its files are in dir for goVersion.
func Built(op Operator, dir, goVersion string) bool {
	bin, files := op.Stamps(goVersion)
	return binbuild.HasStamp(dir, bin) && binbuild.Executable(filepath.Join(dir, "manager")) && hasFileStamp(dir, files)
}

const filesStampFile = ".files-stamp"

func hasFileStamp(dir, stamp string) bool {
	data, err := os.ReadFile(filepath.Join(dir, filesStampFile))
	return err == nil && strings.TrimSpace(string(data)) == stamp
}

// Ensure returns the directories of the named operators (default all),
// building those that are missing. Concurrent callers build each once.
func Ensure(ctx context.Context, opts Options, names ...string) (map[string]string, error) {
	if len(names) == 0 {
		for _, o := range All {
			names = append(names, o.Name)
		}
	}
	goVersion, err := binbuild.GoVersion(ctx, opts.goCmd(), "the workload operators")
	if err != nil {
		return nil, err
	}
	dirs := map[string]string{}
	var missing []Operator
	for _, n := range names {
		op, ok := Lookup(n)
		if !ok {
			return nil, unknown(n)
		}
		d, err := dir(opts, op, goVersion)
		if err != nil {
			return nil, err
		}
		dirs[n] = d
		if !Built(op, d, goVersion) {
			missing = append(missing, op)
		}
	}
	if len(missing) == 0 {
		return dirs, nil
	}
	p := binbuild.NewProgress(opts.Out)
	var what []string
	for _, op := range missing {
		what = append(what, op.Name+" ("+op.Module+" "+op.Version()+")")
	}
	p.Printf("workload operators: building %s from the Go module proxy into %s (once; later runs reuse them)\n", strings.Join(what, ", "), filepath.Dir(dirs[missing[0].Name]))
	start := time.Now()
	for i, op := range missing {
		if err := ensureOne(ctx, opts, op, dirs[op.Name], goVersion, p, fmt.Sprintf("%d/%d", i+1, len(missing))); err != nil {
			return nil, err
		}
	}
	if len(missing) > 1 {
		p.Printf("  built %d operators in %s\n", len(missing), binbuild.Elapsed(start))
	}
	return dirs, nil
}

func ensureOne(ctx context.Context, opts Options, op Operator, out, goVersion string, p *binbuild.Progress, step string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("operator directory: %w", err)
	}
	unlock, err := binbuild.Lock(ctx, out+".lock", opts.Out, "the operator "+op.Name)
	if err != nil {
		return err
	}
	defer unlock()
	bin, files := op.Stamps(goVersion)
	src := filepath.Join(out, ".src")
	if !binbuild.HasStamp(out, bin) || !binbuild.Executable(filepath.Join(out, "manager")) {
		if err := os.RemoveAll(out); err != nil {
			return fmt.Errorf("operator directory: %w", err)
		}
		if err := writeModule(src, op); err != nil {
			return err
		}
		tmp := filepath.Join(out, ".manager.tmp")
		cmd := exec.CommandContext(ctx, opts.goCmd(), "build", "-trimpath", "-ldflags", "-s -w", "-o", tmp, op.Package)
		cmd.Dir = src
		cmd.Env = binbuild.Env("CGO_ENABLED=0")
		if err := p.Run(cmd, step, op.Name); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("%w (package %s)", err, op.Package)
		}
		if err := os.Rename(tmp, filepath.Join(out, "manager")); err != nil {
			return fmt.Errorf("install %s: %w", op.Name, err)
		}
		if err := os.WriteFile(filepath.Join(out, ".version"), []byte(op.Module+" "+op.Version()+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, binbuild.StampFile), []byte(bin+"\n"), 0o644); err != nil {
			return err
		}
	}
	if hasFileStamp(out, files) {
		return nil
	}
	if err := writeModule(src, op); err != nil {
		return err
	}
	return copyFiles(ctx, opts.goCmd(), src, out, op, files)
}

func writeModule(src string, op Operator) error {
	if err := os.MkdirAll(src, 0o755); err != nil {
		return fmt.Errorf("module source: %w", err)
	}
	for name, data := range op.ModuleFiles() {
		if err := os.WriteFile(filepath.Join(src, name), data, 0o644); err != nil {
			return fmt.Errorf("module source: %w", err)
		}
	}
	return nil
}

// copyFiles copies the operator's CRDs, webhook configurations and
// runtimes from its module (in the module cache once built) beside it.
func copyFiles(ctx context.Context, goCmd, src, out string, op Operator, stamp string) error {
	cmd := exec.CommandContext(ctx, goCmd, "list", "-m", "-f", "{{.Dir}}", op.Module)
	cmd.Dir = src
	cmd.Env = binbuild.Env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dirOut, err := cmd.Output()
	moduleDir := strings.TrimSpace(string(dirOut))
	if err != nil || moduleDir == "" {
		return fmt.Errorf("%s: find module %s: %v %s", op.Name, op.Module, err, stderr.String())
	}
	for _, c := range strings.Fields(op.Copies) {
		dest, glob, _ := strings.Cut(c, "=")
		if err := os.RemoveAll(filepath.Join(out, dest)); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(out, dest), 0o755); err != nil {
			return err
		}
		matches, err := filepath.Glob(filepath.Join(moduleDir, glob))
		if err != nil || len(matches) == 0 {
			return fmt.Errorf("%s: %s missing in %s", op.Name, glob, op.Module)
		}
		for _, f := range matches {
			data, err := os.ReadFile(f)
			if err != nil {
				return fmt.Errorf("%s: %w", op.Name, err)
			}
			// Module cache files are read-only; the copies need not be.
			if err := os.WriteFile(filepath.Join(out, dest, filepath.Base(f)), data, 0o644); err != nil {
				return fmt.Errorf("%s: %w", op.Name, err)
			}
		}
	}
	return os.WriteFile(filepath.Join(out, filesStampFile), []byte(stamp+"\n"), 0o644)
}

// Names lists the operator names.
func Names() []string {
	out := make([]string, len(All))
	for i, o := range All {
		out[i] = o.Name
	}
	return out
}
