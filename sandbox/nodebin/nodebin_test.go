package nodebin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"

	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
)

// TestEmbeddedFilesMatchTheRepository: the embedded copies are
// test/containerd's files byte for byte, and the toolkit version is the one
// tessera's go.mod requires (run `go generate ./sandbox/nodebin` after
// changing them).
func TestEmbeddedFilesMatchTheRepository(t *testing.T) {
	for name, data := range ContainerdModuleFiles() {
		want, err := os.ReadFile(filepath.Join("..", "..", "test", "containerd", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, want) {
			t.Errorf("embedded %s differs from test/containerd/%s: run go generate ./sandbox/nodebin", name, name)
		}
	}
	gomod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for _, r := range f.Require {
		if r.Mod.Path == "github.com/NVIDIA/nvidia-container-toolkit" {
			want = r.Mod.Version
		}
	}
	if want == "" || ToolkitVersion() != want {
		t.Errorf("nvidia-cdi-hook would be built at %q, but go.mod requires the toolkit (nvcdi) at %q: run go generate ./sandbox/nodebin", ToolkitVersion(), want)
	}
	if !strings.HasPrefix(ContainerdVersion(), "v2.") {
		t.Errorf("containerd version %q, want the v2 that test/containerd pins", ContainerdVersion())
	}
}

// TestStampFormula: the stamp is the one documented for the shell, so that
// anyone can tell which cache directory a checkout's pins build into.
func TestStampFormula(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	script := `(cat "$1/test/k8s/go.mod" "$1/test/k8s/go.sum" "$1/test/containerd/go.mod" "$1/test/containerd/go.sum" "$1/sandbox/nodebin/pause/main.go"; echo "$2"; go version) | sha256sum | cut -c1-16`
	out, err := exec.Command("bash", "-c", script, "bash", filepath.Join("..", ".."), buildFlags()).Output()
	if err != nil {
		t.Fatal(err)
	}
	goVersion, err := exec.Command("go", "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Stamp(string(goVersion)), strings.TrimSpace(string(out)); got != want {
		t.Errorf("Stamp = %s, the shell's = %s", got, want)
	}
	for _, want := range []string{k8sbin.KubeLDFlags(), "no_btrfs no_devmapper no_zfs", HookPackage + "@" + ToolkitVersion(), "internal/info.version=" + strings.TrimPrefix(ToolkitVersion(), "v")} {
		if !strings.Contains(buildFlags(), want) {
			t.Errorf("build flags %q lack %q", buildFlags(), want)
		}
	}
}

// fakeGo writes a go command that answers `go version` and, for `go build
// -o OUT PKG` and `go install PKG@V` (into $GOBIN), writes an executable,
// logging "<subcommand> <package> cgo=<CGO_ENABLED> <flags>" per build. With
// $CHANGE_PIN set, a build with -modfile=F raises k8s.io/kubernetes in F.
func fakeGo(t *testing.T) (goCmd, buildLog string) {
	t.Helper()
	dir := t.TempDir()
	buildLog = filepath.Join(dir, "builds.log")
	script := `#!/bin/sh
if [ "$1" = version ]; then echo "go version go1.26.0 linux/amd64"; exit 0; fi
sub=$1; shift
out=""; pkg=""; flags=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2;;
    -ldflags|-tags) flags="$flags $1=$2"; shift 2;;
    -modfile=*) flags="$flags $1"; modfile=${1#-modfile=}; shift;;
    -*) flags="$flags $1"; shift;;
    *) pkg=$1; shift;;
  esac
done
[ -f go.mod ] || [ "$sub" = install ] || { echo "go: cannot find main module" >&2; exit 1; }
if [ -n "$CHANGE_PIN" ] && [ -n "$modfile" ]; then sed -i 's#k8s.io/kubernetes v1.37.2#k8s.io/kubernetes v1.37.3#' "$modfile"; fi
echo "$sub $pkg cgo=$CGO_ENABLED$flags" >> ` + buildLog + `
if [ "$sub" = install ]; then name=${pkg%@*}; mkdir -p "$GOBIN"; out="$GOBIN/${name##*/}"; fi
printf '#!/bin/sh\necho %s\n' "$pkg" > "$out"; chmod +x "$out"
`
	goCmd = filepath.Join(dir, "go")
	if err := os.WriteFile(goCmd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return goCmd, buildLog
}

func builds(t *testing.T, log string) []string {
	t.Helper()
	data, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func TestEnsureBuildsEveryNodeBinaryOnce(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: nvidia-cdi-hook cannot be built here")
	}
	goCmd, log := fakeGo(t)
	dir := filepath.Join(t.TempDir(), "node")
	var out bytes.Buffer
	opts := Options{Dir: dir, Out: &out, Go: goCmd}
	got, err := Ensure(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if got != dir {
		t.Errorf("dir %s, want %s", got, dir)
	}
	b := builds(t, log)
	if len(b) != len(All) {
		t.Fatalf("builds %q, want one per binary", b)
	}
	for i, want := range []string{
		"build k8s.io/kubernetes/cmd/kubelet cgo=0 -mod=mod -modfile=",
		"build github.com/containerd/containerd/v2/cmd/containerd cgo=0 -trimpath -tags=no_btrfs no_devmapper no_zfs",
		"build github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 cgo=0",
		"build github.com/containerd/containerd/v2/cmd/ctr cgo=0",
		"build . cgo=0",
		"install " + HookPackage + "@" + ToolkitVersion() + " cgo=1",
	} {
		if !strings.HasPrefix(b[i], want) {
			t.Errorf("build %d: %q, want %q…", i, b[i], want)
		}
	}
	for _, bin := range All {
		if fi, err := os.Stat(filepath.Join(dir, bin.Name)); err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s not installed: %v", bin.Name, err)
		}
		if !strings.Contains(out.String(), "] "+bin.Name) {
			t.Errorf("no progress line for %s:\n%s", bin.Name, out.String())
		}
	}
	if !strings.Contains(out.String(), "built 6 binaries in ") || !strings.Contains(out.String(), "nvidia-cdi-hook "+ToolkitVersion()) {
		t.Errorf("progress:\n%s", out.String())
	}
	// The pinned modules were written from the embedded copies; the pins
	// themselves are untouched by the kubelet's build.
	if data, err := os.ReadFile(filepath.Join(dir, ".src", "k8s", "go.mod")); err != nil || !bytes.Equal(data, k8sbin.ModuleFiles()["go.mod"]) {
		t.Errorf("k8s module go.mod: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, ".src", "pause", "main.go")); err != nil || !bytes.Equal(data, pauseMain) {
		t.Errorf("pause source: %v", err)
	}

	out.Reset()
	if _, err := Ensure(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if n := len(builds(t, log)); n != len(All) || out.Len() != 0 {
		t.Errorf("second Ensure: %d builds in all, said %q", n, out.String())
	}
	// One binary gone: only it is built again.
	if err := os.Remove(filepath.Join(dir, "nvidia-cdi-hook")); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if b := builds(t, log); len(b) != len(All)+1 || !strings.HasPrefix(b[len(b)-1], "install "+HookPackage) {
		t.Errorf("after removing the hook: builds %q", b)
	}
}

// TestKubeletMayNotChangeThePins: resolving the kubelet's extra go.sum
// lines must not move a version the control plane's module pins; if it
// would, nothing is installed and the error names the pin.
func TestKubeletMayNotChangeThePins(t *testing.T) {
	goCmd, _ := fakeGo(t)
	t.Setenv("CHANGE_PIN", "1")
	dir := filepath.Join(t.TempDir(), "node")
	_, err := Ensure(context.Background(), Options{Dir: dir, Go: goCmd}, Kubelet)
	if err == nil || !strings.Contains(err.Error(), "would change these pins") || !strings.Contains(err.Error(), "k8s.io/kubernetes v1.37.2 → v1.37.3") {
		t.Fatalf("want the changed pin named, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kubelet")); !os.IsNotExist(err) {
		t.Errorf("kubelet installed although it changed a pin")
	}
}

// TestDirNeedsNoCheckout: outside a checkout the node binaries are looked
// for where a checkout's bin/node points: the cache directory of the stamp.
func TestDirNeedsNoCheckout(t *testing.T) {
	t.Setenv(EnvDir, "")
	inside, err := Dir(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	link, linkErr := filepath.EvalSymlinks(filepath.Join("..", "..", "bin", "node"))
	t.Chdir(t.TempDir())
	outside, err := Dir(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if outside != inside {
		t.Errorf("Dir outside a checkout = %s, inside = %s", outside, inside)
	}
	if linkErr == nil && Missing(link, Stamp(goVersion(t)), All) == nil && link != outside {
		t.Errorf("bin/node of the checkout is %s, the CLI would look in %s", link, outside)
	}
}

func goVersion(t *testing.T) string {
	out, err := exec.Command("go", "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestTesseraNodeNeedsAModuleVersion: a program built in a checkout (as
// this test binary) does not build tessera-node from the proxy; one
// installed at a version builds cmd/tessera-node at that version, once.
func TestTesseraNodeNeedsAModuleVersion(t *testing.T) {
	if v := ModuleVersion(); v != "" {
		t.Fatalf("a test binary reports module version %q", v)
	}
	if _, err := TesseraNode(context.Background(), Options{}, ""); err != ErrNoModuleVersion {
		t.Fatalf("without a version: %v", err)
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	goCmd, log := fakeGo(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	var out bytes.Buffer
	bin, err := TesseraNode(context.Background(), Options{Go: goCmd, Out: &out}, "v0.3.0")
	if err != nil {
		t.Fatal(err)
	}
	if b := builds(t, log); len(b) != 1 || !strings.HasPrefix(b[0], "install github.com/tessera-gpu/tessera/cmd/tessera-node@v0.3.0 cgo=1") {
		t.Errorf("builds %q", b)
	}
	if !strings.Contains(out.String(), "tessera-node v0.3.0") || !strings.Contains(out.String(), "built in") {
		t.Errorf("progress:\n%s", out.String())
	}
	again, err := TesseraNode(context.Background(), Options{Go: goCmd}, "v0.3.0")
	if err != nil || again != bin || len(builds(t, log)) != 1 {
		t.Errorf("second call: %s %v, %d builds", again, err, len(builds(t, log)))
	}
}
