package k8sbin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEmbeddedModuleMatchesTestK8s: the embedded copies are test/k8s's files
// byte for byte (run `go generate ./sandbox/k8sbin` after changing them).
func TestEmbeddedModuleMatchesTestK8s(t *testing.T) {
	for name, data := range ModuleFiles() {
		want, err := os.ReadFile(filepath.Join("..", "..", "test", "k8s", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(data, want) {
			t.Errorf("embedded %s differs from test/k8s/%s: run go generate ./sandbox/k8sbin", name, name)
		}
	}
}

// TestStampIsTheScriptsStamp: the cache key is the one hack/build-k8s.sh has
// always computed — `(cat go.mod go.sum etcd/main.go; echo "$ldflags"; go
// version) | sha256sum` — so caches built before this package are reused.
func TestStampIsTheScriptsStamp(t *testing.T) {
	if _, err := exec.LookPath("sha256sum"); err != nil {
		t.Skip("no sha256sum")
	}
	mod := filepath.Join("..", "..", "test", "k8s")
	script := `(cat "$1/go.mod" "$1/go.sum" "$1/etcd/main.go"; echo "$2"; go version) | sha256sum | cut -c1-16`
	out, err := exec.Command("bash", "-c", script, "bash", mod, KubeLDFlags()).Output()
	if err != nil {
		t.Fatal(err)
	}
	goVersion, err := GoVersion(context.Background(), "go")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Stamp(goVersion), strings.TrimSpace(string(out)); got != want {
		t.Errorf("Stamp = %s, the script's stamp = %s", got, want)
	}
	// The flags are the script's of old, word for word.
	const old = "-s -w -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
	if KubernetesVersion() == "v1.37.2" && KubeLDFlags() != old {
		t.Errorf("ldflags changed:\n got %s\nwant %s", KubeLDFlags(), old)
	}
}

// fakeGo writes a go command that answers `go version` and, for `go build -o
// OUT PKG`, writes an executable OUT after a moment, logging each build; a
// package named in $FAIL fails to build with compiler-like output.
func fakeGo(t *testing.T) (goCmd, buildLog string) {
	t.Helper()
	dir := t.TempDir()
	buildLog = filepath.Join(dir, "builds.log")
	script := `#!/bin/sh
if [ "$1" = version ]; then echo "go version go1.26.0 linux/amd64"; exit 0; fi
out=""; pkg=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out=$2; shift 2;;
    -ldflags) shift 2;;
    -*) shift;;
    *) pkg=$1; shift;;
  esac
done
[ -f go.mod ] || { echo "go: cannot find main module" >&2; exit 1; }
if [ "$pkg" = "$FAIL" ]; then echo "go: downloading example.com/x v1.0.0" >&2; echo "$pkg: undefined: something" >&2; exit 1; fi
echo "$pkg" >> ` + buildLog + `
sleep 0.2
printf '#!/bin/sh\necho %s\n' "$pkg" > "$out"; chmod +x "$out"
`
	goCmd = filepath.Join(dir, "go")
	if err := os.WriteFile(goCmd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return goCmd, buildLog
}

func builds(t *testing.T, log string) []string {
	data, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(data))
}

func TestEnsureBuildsOnlyWhatIsMissing(t *testing.T) {
	goCmd, log := fakeGo(t)
	dir := filepath.Join(t.TempDir(), "bin")
	var out bytes.Buffer
	opts := Options{Dir: dir, Out: &out, Go: goCmd}
	got, err := Ensure(context.Background(), opts, Sandbox...)
	if err != nil {
		t.Fatal(err)
	}
	if got != dir {
		t.Errorf("dir = %s, want %s", got, dir)
	}
	want := []string{"./etcd", "k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kubectl"}
	if b := builds(t, log); strings.Join(b, " ") != strings.Join(want, " ") {
		t.Errorf("built %v, want %v (no kube-scheduler for the sandbox)", b, want)
	}
	for _, b := range Sandbox {
		line := "] " + b.Name
		if !strings.Contains(out.String(), line) || !strings.Contains(out.String(), "built in ") {
			t.Errorf("no progress line for %s:\n%s", b.Name, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "kube-scheduler")); !os.IsNotExist(err) {
		t.Errorf("kube-scheduler built for the sandbox")
	}
	if !strings.Contains(out.String(), "built 4 binaries in ") {
		t.Errorf("no total build time:\n%s", out.String())
	}
	// The module was built from the embedded files.
	if data, err := os.ReadFile(filepath.Join(dir, ".src", "go.mod")); err != nil || !bytes.Equal(data, goMod) {
		t.Errorf("module go.mod not written from the embedded copy: %v", err)
	}

	// Again: nothing to build, nothing said.
	out.Reset()
	if _, err := Ensure(context.Background(), opts, Sandbox...); err != nil {
		t.Fatal(err)
	}
	if n := len(builds(t, log)); n != 4 || out.Len() != 0 {
		t.Errorf("second Ensure built %d binaries in all and said %q", n, out.String())
	}
	// Asking for everything builds kube-scheduler alone.
	if _, err := Ensure(context.Background(), opts, All...); err != nil {
		t.Fatal(err)
	}
	if b := builds(t, log); len(b) != 5 || b[4] != Scheduler.Package {
		t.Errorf("builds %v, want kube-scheduler added", b)
	}

	// A directory stamped for another toolchain or release is rebuilt whole.
	if err := os.WriteFile(filepath.Join(dir, stampFile), []byte("0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(context.Background(), opts, ControlPlane...); err != nil {
		t.Fatal(err)
	}
	if b := builds(t, log); len(b) != 8 {
		t.Errorf("after a stamp change: builds %v, want the control plane rebuilt", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "kubectl")); !os.IsNotExist(err) {
		t.Errorf("kubectl of the old stamp left in place")
	}
}

func TestEnsureFailedBuildLeavesNoBinary(t *testing.T) {
	goCmd, _ := fakeGo(t)
	t.Setenv("FAIL", APIServer.Package)
	dir := filepath.Join(t.TempDir(), "bin")
	var out bytes.Buffer
	_, err := Ensure(context.Background(), Options{Dir: dir, Out: &out, Go: goCmd}, ControlPlane...)
	if err == nil || !strings.Contains(err.Error(), "build kube-apiserver") || !strings.Contains(err.Error(), "undefined: something") {
		t.Fatalf("want the failed build and its output in the error, got %v", err)
	}
	if !strings.Contains(out.String(), "kube-apiserver") || !strings.Contains(out.String(), "failed after") {
		t.Errorf("progress does not say the build failed:\n%s", out.String())
	}
	if strings.Contains(out.String(), "go: downloading") {
		t.Errorf("go's own output reached the progress lines:\n%s", out.String())
	}
	for _, name := range []string{"kube-apiserver", ".kube-apiserver.tmp", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("%s exists after the failed build", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd")); err != nil {
		t.Errorf("etcd, built before the failure, is gone: %v", err)
	}
}

// TestEnsureConcurrentCallersBuildOnce: two processes asking at once (two
// test binaries, two terminals) build each binary once.
func TestEnsureConcurrentCallersBuildOnce(t *testing.T) {
	goCmd, log := fakeGo(t)
	dir := filepath.Join(t.TempDir(), "bin")
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := Ensure(context.Background(), Options{Dir: dir, Go: goCmd}, ControlPlane...)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if b := builds(t, log); len(b) != 3 {
		t.Errorf("builds %v, want each of the three once", b)
	}
}

func TestDirUsesCacheAndOverride(t *testing.T) {
	goCmd, _ := fakeGo(t)
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv(EnvDir, "")
	dir, err := Dir(context.Background(), Options{Go: goCmd})
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(cache, "tessera", "k8s", Stamp("go version go1.26.0 linux/amd64\n"))
	if dir != want {
		t.Errorf("Dir = %s, want %s", dir, want)
	}
	t.Setenv(EnvDir, "/somewhere")
	if dir, _ := Dir(context.Background(), Options{Go: goCmd}); dir != "/somewhere" {
		t.Errorf("with %s set: Dir = %s", EnvDir, dir)
	}
	if _, err := Dir(context.Background(), Options{Go: filepath.Join(cache, "no-go")}); err == nil || !strings.Contains(err.Error(), "Go toolchain") {
		t.Errorf("without go: want an error naming the Go toolchain, got %v", err)
	}
}
