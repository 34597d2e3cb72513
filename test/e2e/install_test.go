package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"

	"github.com/tessera-gpu/tessera/test/framework"
)

const modulePath = "github.com/tessera-gpu/tessera"

// TestInstalledCLIRunsOutsideACheckout is what a new user does:
//
//	go install github.com/tessera-gpu/tessera/cmd/tessera@<commit>
//	cd an/empty/directory && tessera sandbox up
//
// The module is on no public proxy, so the test serves this repository's
// commit (HEAD, or a commit of the working tree's tracked changes made with
// `git stash create`) from a file-based GOPROXY: a module zip made with
// golang.org/x/mod/zip from git's tree, its go.mod, and .info files for the
// pseudo-version and for the bare commit hash, which is what `go install
// ...@<commit>` asks the proxy for. Every dependency comes from the module
// cache or, failing that, the usual proxy.
// The installed binary then starts the sandbox in an empty directory with a
// real operator (JobSet) — finding the Kubernetes binaries and the operator
// in ~/.cache/tessera by the stamps of its embedded modules, with no
// checkout to look in — and its kubectl, top and down work; the directory
// stays empty.
//
// Cost: one `go install` of the CLI (its dependencies are in the build
// cache: about a minute here) and one sandbox start (about 10s).
func TestInstalledCLIRunsOutsideACheckout(t *testing.T) {
	if _, err := framework.BinDir(); err != nil {
		t.Fatal(err)
	}
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rev, how := revisionToInstall(t, root)
	version := serveModule(t, root, rev)
	t.Logf("installing %s@%s (%s) as %s from %s", modulePath, rev[:12], how, version.v, version.proxy)

	gobin := t.TempDir()
	work := t.TempDir() // go install runs outside any module
	install := exec.Command("go", "install", modulePath+"/cmd/tessera@"+rev[:12])
	install.Dir = work
	install.Env = append(os.Environ(),
		"GOBIN="+gobin,
		// The file proxy first; the usual proxy after it for the checksum
		// database (the go command reaches sum.golang.org through it) and
		// anything the module cache lacks.
		"GOPROXY=file://"+version.proxy+","+goEnv(t, "GOPROXY"),
		"GONOSUMDB="+modulePath, // not on sum.golang.org
		"GOFLAGS=",
		"GOWORK=off",
	)
	t.Cleanup(func() { removeFromModuleCache(t, version.v, rev[:12]) })
	start := time.Now()
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	t.Logf("go install took %s", time.Since(start).Round(time.Second))
	tessera := filepath.Join(gobin, "tessera")

	out, err := exec.Command(tessera, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), version.v) {
		t.Errorf("tessera --version = %q (%v), want the module version %s", out, err, version.v)
	}

	empty := t.TempDir()
	state := shortTempDir(t)
	env := append(os.Environ(), "TESSERA_SANDBOX_DIR="+state)
	up := exec.Command(tessera, "sandbox", "up", "--nodes", "2", "--operators", "jobset")
	up.Dir = empty
	up.Env = env
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	up.Stderr = &stderr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var narration bytes.Buffer
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			narration.WriteString(sc.Text() + "\n")
			if !signalled && strings.HasPrefix(sc.Text(), "tessera sandbox is up") {
				close(ready)
				signalled = true
			}
		}
		exited <- up.Wait()
	}()
	t.Cleanup(func() {
		if up.ProcessState == nil {
			_ = up.Process.Kill()
		}
	})
	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("tessera sandbox up exited early: %v\n%s\n%s", err, narration.String(), stderr.String())
	case <-time.After(4 * time.Minute):
		t.Fatalf("tessera sandbox up not up after 4m:\n%s", narration.String())
	}

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(tessera, args...)
		cmd.Dir = empty
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tessera %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if nodes := run("sandbox", "kubectl", "get", "nodes", "-o", "name"); nodes != "node/gpu-node-0\nnode/gpu-node-1\n" {
		t.Errorf("tessera sandbox kubectl get nodes -o name:\n%s", nodes)
	}
	if crd := run("sandbox", "kubectl", "get", "crd", "jobsets.jobset.x-k8s.io", "-o", "name"); crd != "customresourcedefinition.apiextensions.k8s.io/jobsets.jobset.x-k8s.io\n" {
		t.Errorf("the JobSet operator's CRD from the installed CLI: %q", crd)
	}
	if v := run("sandbox", "kubectl", "version", "--client", "-o", "json"); !strings.Contains(v, `"gitVersion": "v1.37.2"`) {
		t.Errorf("sandbox kubectl is not v1.37.2:\n%s", v)
	}
	if top := run("top", "--once", "--kubeconfig", filepath.Join(state, "kubeconfig")); !strings.Contains(top, "gpu-node-1 [········]     0/8") {
		t.Errorf("tessera top --once from the installed CLI:\n%s", top)
	}
	run("sandbox", "down")
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("tessera sandbox up: %v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("tessera sandbox up still running after down")
	}
	if !strings.Contains(narration.String(), "starting workload operators: jobset") {
		t.Errorf("no operator in the narration:\n%s", narration.String())
	}
	if !strings.Contains(narration.String(), "nothing left running") {
		t.Errorf("no clean stop in the narration:\n%s", narration.String())
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("the sandbox wrote into the working directory: %v", entries)
	}
}

// revisionToInstall is HEAD when the tracked files are unchanged, else a
// commit of the working tree's tracked changes (untracked files are not in
// it; commit them to test them here).
func revisionToInstall(t *testing.T, root string) (rev, how string) {
	t.Helper()
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	if stash := git("stash", "create", "tessera install test"); stash != "" {
		return stash, "HEAD plus the working tree's tracked changes"
	}
	return git("rev-parse", "HEAD"), "HEAD"
}

type served struct {
	v     string // the pseudo-version
	proxy string // the GOPROXY directory
}

// serveModule writes a file-based module proxy for the module at rev.
func serveModule(t *testing.T, root, rev string) served {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "show", "-s", "--format=%ct", rev).Output()
	if err != nil {
		t.Fatal(err)
	}
	secs, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	when := time.Unix(secs, 0).UTC()
	v := module.PseudoVersion("v0", "", when, rev[:12])
	proxy := filepath.Join(t.TempDir(), "proxy")
	dir := filepath.Join(proxy, filepath.FromSlash(modulePath), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	zipPath := filepath.Join(dir, v+".zip")
	f, err := os.Create(zipPath)
	if err != nil {
		t.Fatal(err)
	}
	// The tree at rev, through git archive (modzip.CreateFromVCS wants a
	// .git directory, which a worktree does not have); CreateFromDir leaves
	// out what a module zip must not hold (nested modules such as test/k8s).
	tree := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, rev, tree)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive: %v\n%s", err, out)
	}
	if err := modzip.CreateFromDir(f, module.Version{Path: modulePath, Version: v}, tree); err != nil {
		t.Fatalf("module zip: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := exec.Command("git", "-C", root, "show", rev+":go.mod").Output()
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"Version": v, "Time": when.Format(time.RFC3339)})
	for name, data := range map[string][]byte{
		v + ".mod":         gomod,
		v + ".info":        info,
		rev[:12] + ".info": info, // the query `@<commit>`
		"list":             []byte(v + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return served{v: v, proxy: proxy}
}

// removeFromModuleCache deletes what the install put in the module cache for
// this pseudo-version (the extracted, read-only tree and the downloads), so
// that test runs do not pile up copies of the repository.
func removeFromModuleCache(t *testing.T, version, query string) {
	cache := goEnv(t, "GOMODCACHE")
	extracted := filepath.Join(cache, filepath.FromSlash(modulePath)+"@"+version)
	_ = filepath.WalkDir(extracted, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(path, 0o755)
		}
		return nil
	})
	_ = os.RemoveAll(extracted)
	downloads := filepath.Join(cache, "cache", "download", filepath.FromSlash(modulePath), "@v")
	for _, pattern := range []string{version + ".*", query + ".*"} {
		matches, _ := filepath.Glob(filepath.Join(downloads, pattern))
		for _, m := range matches {
			_ = os.Remove(m)
		}
	}
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}
