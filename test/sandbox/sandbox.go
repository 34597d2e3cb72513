// Package sandbox runs a local tessera cluster: the real control plane from
// test/framework plus simulated GPU nodes. `tessera sandbox up` and the demo
// (`make demo`) drive it.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/test/framework"
)

// Options configure a sandbox.
type Options struct {
	// StateDir holds the sandbox's pid file, kubeconfig and control-plane state.
	StateDir string
	// Out receives the narration.
	Out io.Writer
}

// DefaultStateDir is where `tessera sandbox up` keeps its state, so that
// `tessera sandbox down` finds it from any working directory.
func DefaultStateDir() string {
	if dir := os.Getenv("TESSERA_SANDBOX_DIR"); dir != "" {
		return dir
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "tessera-sandbox")
	}
	return filepath.Join(home, ".tessera", "sandbox")
}

const pidFile = "sandbox.pid"

// Up starts the sandbox and blocks until ctx is cancelled, then stops
// everything it started and removes its state.
func Up(ctx context.Context, opts Options) error {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return fmt.Errorf("sandbox state dir: %w", err)
	}
	if pid, alive := runningPID(opts.StateDir); alive {
		return fmt.Errorf("a sandbox is already running (pid %d, state in %s); stop it with `tessera sandbox down`", pid, opts.StateDir)
	}
	if err := os.WriteFile(filepath.Join(opts.StateDir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	defer os.Remove(filepath.Join(opts.StateDir, pidFile))

	cpDir := filepath.Join(opts.StateDir, "controlplane")
	_ = os.RemoveAll(cpDir) // state of an earlier sandbox that was killed
	started := time.Now()
	cp, err := framework.Start(ctx, framework.Options{
		Dir: cpDir,
		Log: func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) },
	})
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		fmt.Fprintln(out, "stopping the sandbox...")
		cp.Stop()
		_ = os.RemoveAll(cpDir)
		_ = os.Remove(filepath.Join(opts.StateDir, "kubeconfig"))
		fmt.Fprintln(out, "sandbox stopped; nothing left running.")
	}()
	kubeconfig := filepath.Join(opts.StateDir, "kubeconfig")
	if err := framework.WriteKubeconfig(cp.Config, kubeconfig); err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("server version: %w", err)
	}
	fmt.Fprintf(out, "\ntessera sandbox is up in %s: Kubernetes %s at %s\n\n", time.Since(started).Round(100*time.Millisecond), v.GitVersion, cp.Config.Host)
	fmt.Fprintf(out, "  export KUBECONFIG=%s\n", kubeconfig)
	fmt.Fprintf(out, "  kubectl get --raw /version      # any kubectl v1.34+ works\n\n")
	fmt.Fprintf(out, "Press Ctrl-C here, or run `tessera sandbox down` elsewhere, to stop it.\n")
	<-ctx.Done()
	return nil
}

// Down stops a sandbox started by Up in another process and waits until it is
// gone.
func Down(ctx context.Context, stateDir string, out io.Writer) error {
	pid, alive := runningPID(stateDir)
	if !alive {
		fmt.Fprintf(out, "no sandbox is running (state dir %s)\n", stateDir)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal sandbox (pid %d): %w", pid, err)
	}
	for {
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			fmt.Fprintf(out, "sandbox (pid %d) stopped\n", pid)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox (pid %d) still running: %w", pid, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func runningPID(stateDir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(stateDir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	err = syscall.Kill(pid, 0)
	return pid, err == nil || errors.Is(err, syscall.EPERM)
}
