package opbin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEmbeddedModulesMatchTestOperators: the embedded copies are
// test/operators/modules' files byte for byte (run `go generate
// ./sandbox/opbin` after changing them), every module there has an
// operator here, and each operator's module is pinned by its go.mod.
func TestEmbeddedModulesMatchTestOperators(t *testing.T) {
	dirs, err := os.ReadDir(filepath.Join("..", "..", "test", "operators", "modules"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != len(All) {
		t.Errorf("%d modules in test/operators/modules, %d operators here", len(dirs), len(All))
	}
	for _, d := range dirs {
		op, ok := Lookup(d.Name())
		if !ok {
			t.Errorf("test/operators/modules/%s has no operator in opbin.All", d.Name())
			continue
		}
		for name, data := range op.ModuleFiles() {
			want, err := os.ReadFile(filepath.Join("..", "..", "test", "operators", "modules", d.Name(), name))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data, want) {
				t.Errorf("embedded %s of %s differs from test/operators/modules/%s/%s: run go generate ./sandbox/opbin", name, op.Name, d.Name(), name)
			}
		}
		if op.Version() == "unknown" {
			t.Errorf("%s: go.mod does not require %s", op.Name, op.Module)
		}
		if !strings.HasPrefix(op.Package, op.Module) {
			t.Errorf("%s: package %s is not in module %s", op.Name, op.Package, op.Module)
		}
	}
}

// TestStampsAreTheScriptsStamps: the cache keys are the ones
// hack/build-operators.sh computed before it ran this package, so the
// operators built by it are reused, not built again.
func TestStampsAreTheScriptsStamps(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	goVersion, err := exec.Command("go", "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range All {
		mod := filepath.Join("..", "..", "test", "operators", "modules", op.Name)
		script := `stamp=$( (cat "$1/go.mod" "$1/go.sum" "$1/tools.go"; echo "$2"; go version) | sha256sum | cut -c1-16)
echo "$stamp $(echo "$stamp $3" | sha256sum | cut -c1-16)"`
		out, err := exec.Command("bash", "-c", script, "bash", mod, op.Package, op.Copies).Output()
		if err != nil {
			t.Fatal(err)
		}
		bin, files := op.Stamps(string(goVersion))
		if got, want := bin+" "+files, strings.TrimSpace(string(out)); got != want {
			t.Errorf("%s: stamps %s, the script's %s", op.Name, got, want)
		}
	}
}

// fakeGo answers `go version`, builds an executable for `go build -o OUT
// PKG` (logging PKG), and for `go list -m -f {{.Dir}} MODULE` prints a
// module directory laid out with the files every operator copies.
func fakeGo(t *testing.T) (goCmd, buildLog string) {
	t.Helper()
	dir := t.TempDir()
	buildLog = filepath.Join(dir, "builds.log")
	mod := filepath.Join(dir, "module")
	for _, op := range All {
		for _, c := range strings.Fields(op.Copies) {
			_, glob, _ := strings.Cut(c, "=")
			name := strings.ReplaceAll(glob, "*", op.Name)
			if err := os.MkdirAll(filepath.Join(mod, filepath.Dir(name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(mod, name), []byte("# "+op.Name+"\n"), 0o444); err != nil {
				t.Fatal(err)
			}
		}
	}
	script := `#!/bin/sh
if [ "$1" = version ]; then echo "go version go1.26.0 linux/amd64"; exit 0; fi
if [ "$1" = list ]; then echo "` + mod + `"; exit 0; fi
out=""; pkg=""
shift
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2;;
    -ldflags) shift 2;;
    -*) shift;;
    *) pkg=$1; shift;;
  esac
done
[ -f go.mod ] && [ -f tools.go ] || { echo "go: cannot find main module" >&2; exit 1; }
echo "$pkg" >> ` + buildLog + `
printf '#!/bin/sh\n' > "$out"; chmod +x "$out"
`
	goCmd = filepath.Join(dir, "go")
	if err := os.WriteFile(goCmd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return goCmd, buildLog
}

func TestEnsureBuildsWhatIsMissing(t *testing.T) {
	goCmd, log := fakeGo(t)
	base := t.TempDir()
	var out bytes.Buffer
	opts := Options{Dir: base, Out: &out, Go: goCmd}
	dirs, err := Ensure(context.Background(), opts, "mpi-operator", "trainer")
	if err != nil {
		t.Fatal(err)
	}
	if dirs["trainer"] != filepath.Join(base, "trainer") {
		t.Errorf("dirs %v", dirs)
	}
	logged := func() []string {
		data, _ := os.ReadFile(log)
		return strings.Fields(string(data))
	}
	if b := logged(); strings.Join(b, " ") != "github.com/kubeflow/mpi-operator/cmd/mpi-operator github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager" {
		t.Errorf("built %v", b)
	}
	for _, want := range []string{"] mpi-operator", "] trainer", "built 2 operators in ", "trainer (github.com/kubeflow/trainer/v2 v"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, out.String())
		}
	}
	// The operator's own files are copied beside it, writable.
	for _, f := range []string{"trainer/crds/trainer.kubeflow.org_trainer.yaml", "trainer/runtimes/trainer_distributed.yaml", "trainer/webhooks/manifests.yaml", "mpi-operator/crds/kubeflow.org_mpijobs.yaml"} {
		fi, err := os.Stat(filepath.Join(base, f))
		if err != nil || fi.Mode()&0o200 == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if v, _ := os.ReadFile(filepath.Join(base, "trainer", ".version")); !strings.HasPrefix(string(v), "github.com/kubeflow/trainer/v2 v") {
		t.Errorf(".version %q", v)
	}
	// Again: nothing to do; with one more operator, only it is built.
	out.Reset()
	if _, err := Ensure(context.Background(), opts, "trainer", "mpi-operator", "jobset"); err != nil {
		t.Fatal(err)
	}
	if b := logged(); len(b) != 3 || b[2] != "sigs.k8s.io/jobset" {
		t.Errorf("built %v, want jobset added", b)
	}
	// Copied files gone (an older build): copied again, the binary kept.
	if err := os.Remove(filepath.Join(base, "jobset", filesStampFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(context.Background(), opts, "jobset"); err != nil {
		t.Fatal(err)
	}
	if b := logged(); len(b) != 3 {
		t.Errorf("built %v after only the copies went stale", b)
	}
	if _, err := Ensure(context.Background(), opts, "nope"); err == nil || !strings.Contains(err.Error(), "unknown operator nope") {
		t.Errorf("unknown operator: %v", err)
	}
}

// TestDirNeedsNoCheckout: outside a checkout an operator is looked for
// where a checkout's bin/operators/<name> points: the cache directory of
// its stamp.
func TestDirNeedsNoCheckout(t *testing.T) {
	t.Setenv(EnvDir, "")
	for _, op := range All {
		inside, err := Dir(context.Background(), Options{}, op.Name)
		if err != nil {
			t.Fatal(err)
		}
		link, linkErr := filepath.EvalSymlinks(filepath.Join("..", "..", "bin", "operators", op.Name))
		wd, _ := os.Getwd()
		if err := os.Chdir(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		outside, err := Dir(context.Background(), Options{}, op.Name)
		_ = os.Chdir(wd)
		if err != nil {
			t.Fatal(err)
		}
		if outside != inside {
			t.Errorf("%s: Dir outside a checkout = %s, inside = %s", op.Name, outside, inside)
		}
		if linkErr == nil && link != outside {
			t.Errorf("%s: bin/operators links to %s, the CLI would look in %s", op.Name, link, outside)
		}
	}
}
