package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/sandbox"
	"github.com/tessera-gpu/tessera/sandbox/k8sbin"
	"github.com/tessera-gpu/tessera/test/browser"
	"github.com/tessera-gpu/tessera/test/framework"
)

// EnvScreenshot, when set, names a PNG file that TestWebViewInBrowser
// writes of the page (the README's picture: TESSERA_SCREENSHOT=$PWD/docs/images/web-view.png).
const EnvScreenshot = "TESSERA_SCREENSHOT"

// TestWebViewInBrowser runs `tessera top --web` against a sandbox in the
// middle of the demo — team B's inference on MIG slices and notebooks on
// shares, team A's 16-GPU gang running, team B's 10-GPU gang waiting for the
// research queue's limit — and loads the page in headless chromium: the DOM,
// after the page's own refreshes, shows the sandbox's four nodes with their
// MIG and shared GPUs, the queues against quota and limit, and the pending
// gang with the scheduler's reason.
func TestWebViewInBrowser(t *testing.T) {
	if _, err := browser.Path(); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.BinDir(); err != nil {
		t.Fatal(err)
	}
	// Built before the demo starts: train-a runs 45 s, and a build in the
	// middle of it (the CLI links k8s.io/apiserver's serving) can outlast it
	// on a loaded machine, leaving no gang running or waiting to look at.
	cli := buildCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var narration bytes.Buffer
	s, err := sandbox.Start(ctx, sandbox.Options{StateDir: shortTempDir(t), Out: &narration, MIG: true, Shared: true})
	if err != nil {
		t.Fatalf("start sandbox: %v\n%s", err, narration.String())
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop sandbox: %v", err)
		}
	}()

	// The demo's workloads, applied with the sandbox's kubectl.
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := k8sbin.Dir(ctx, k8sbin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl"), append(args, "--kubeconfig", s.Kubeconfig())...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	demo := filepath.Join(root, "deployments", "examples", "demo")
	for _, f := range []string{"10-team-b-inference.yaml", "20-team-b-notebooks.yaml", "30-team-a-training.yaml"} {
		kubectl("apply", "--server-side", "-f", filepath.Join(demo, f))
	}
	sched, err := schedclient.NewForConfig(s.Config())
	if err != nil {
		t.Fatal(err)
	}
	gang := func(ns, prefix string) *v1alpha1.PodGroup {
		list, err := sched.PodGroups(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			if strings.HasPrefix(list.Items[i].Name, prefix) {
				return &list.Items[i]
			}
		}
		return nil
	}
	waitFor(t, ctx, 2*time.Minute, "train-a bound", func() bool {
		g := gang("team-a", "job-train-a")
		return g != nil && g.Status.Scheduled >= g.Spec.MinMember
	})
	// train-a runs 45s; train-b waits for the research queue's limit meanwhile.
	kubectl("apply", "--server-side", "-f", filepath.Join(demo, "40-team-b-training.yaml"))
	var reason string
	waitFor(t, ctx, time.Minute, "train-b waiting for quota", func() bool {
		g := gang("team-b", "job-train-b")
		if g == nil {
			return false
		}
		c := meta.FindStatusCondition(g.Status.Conditions, v1alpha1.PodGroupConditionScheduled)
		if c == nil || c.Reason != v1alpha1.ReasonQuotaExceeded {
			return false
		}
		reason = c.Message
		return true
	})

	// tessera top --web, the CLI itself.
	web := exec.CommandContext(ctx, cli, "top", "--web", "127.0.0.1:0", "--kubeconfig", s.Kubeconfig())
	stdout, err := web.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	web.Stderr = &stderr
	if err := web.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = web.Process.Signal(os.Interrupt)
		if err := web.Wait(); err != nil {
			t.Errorf("tessera top --web did not stop cleanly on Ctrl-C: %v\n%s", err, stderr.String())
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`).FindString(line)
	if err != nil || url == "" {
		t.Fatalf("tessera top --web printed %q (%v)\n%s", line, err, stderr.String())
	}

	dom, err := browser.DumpDOM(ctx, url, browser.Options{Budget: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`data-node="gpu-node-0"`, `data-node="gpu-node-1"`, `data-node="gpu-node-2"`, `data-node="gpu-node-3"`,
		`slices: 1g.10gb×3`, // team B's inference on MIG
		`Gi of 79.5Gi`,      // the notebooks' shares (an H100 80GB has 81,408 MiB in the model)
		`data-queue="research"`, `data-queue="team-a"`, `data-queue="team-b"`,
		`data-gang="team-a/job-train-a-job" data-phase="Running"`,
		`data-gang="team-b/job-train-b-job" data-phase="Pending"`,
		`<span class="code">QuotaExceeded</span>`,
		`id="status" class="">live · `, // the page refreshed itself
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	// The reason as the scheduler wrote it, HTML-escaped by the page.
	if esc := strings.ReplaceAll(reason, `"`, "&#34;"); !strings.Contains(dom, esc) && !strings.Contains(dom, reason) {
		t.Errorf("page lacks the pending gang's reason %q", reason)
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}
	if path := os.Getenv(EnvScreenshot); path != "" {
		if err := browser.Screenshot(ctx, url, path, browser.Options{Width: 1200, Height: 960, Budget: 2 * time.Second}); err != nil {
			t.Error(err)
		} else {
			t.Logf("screenshot: %s", path)
		}
	}
}

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// buildCLI builds the tessera CLI from this checkout once per test binary
// (TestMain removes it).
func buildCLI(t *testing.T) string {
	t.Helper()
	cliOnce.Do(func() {
		root, err := framework.RepoRoot()
		if err != nil {
			cliErr = err
			return
		}
		dir, err := os.MkdirTemp("", "tessera-e2e-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "tessera")
		build := exec.Command("go", "build", "-o", cliPath, "./cmd/tessera")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			cliErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if cliErr != nil {
		t.Fatalf("build tessera: %v", cliErr)
	}
	return cliPath
}

func waitFor(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
