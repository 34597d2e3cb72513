// Package executor runs the external NVIDIA tools the plugin needs
// (nvidia-smi, nvidia-cuda-mps-control). Everything goes through the
// Executor interface so tests can put recording fakes on PATH, and so the
// exact command line, environment and stdin are in one place.
package executor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Command is one invocation of an external tool.
type Command struct {
	// Name is looked up on PATH (unless it contains a slash).
	Name string
	Args []string
	// Env is added to the plugin's own environment.
	Env []string
	// Stdin is written to the process's standard input.
	Stdin string
}

func (c Command) String() string {
	s := strings.Join(append([]string{c.Name}, c.Args...), " ")
	if len(c.Env) > 0 {
		s = strings.Join(c.Env, " ") + " " + s
	}
	if c.Stdin != "" {
		s += fmt.Sprintf(" <<< %q", c.Stdin)
	}
	return s
}

// Executor runs commands.
type Executor interface {
	// Run runs the command to completion and returns its standard output.
	// A non-zero exit is an error that includes the command and stderr.
	Run(ctx context.Context, cmd Command) ([]byte, error)
}

// OS runs commands as child processes.
type OS struct {
	// Timeout bounds one command (default 30s): a hung nvidia-smi must not
	// hang a kubelet call forever.
	Timeout time.Duration
	// Chroot, when set, runs the tools chrooted into this directory (a
	// driver root mounted into the container, as NVIDIA's MPS daemon pod
	// runs them): they are found in its /usr/bin, /usr/sbin, /bin or /sbin
	// and see its libraries. Paths in arguments and environment are then
	// paths inside it.
	Chroot string
}

var _ Executor = OS{}

// Run implements Executor.
func (e OS) Run(ctx context.Context, c Command) ([]byte, error) {
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var cmd *exec.Cmd
	if e.Chroot != "" {
		path, err := lookInRoot(e.Chroot, c.Name)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", c.Name, err)
		}
		cmd = exec.CommandContext(ctx, path, c.Args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: e.Chroot}
		cmd.Dir = "/"
		cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, c.Env...)
	} else {
		path, err := exec.LookPath(c.Name)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", c.Name, err)
		}
		cmd = exec.CommandContext(ctx, path, c.Args...)
		cmd.Env = append(os.Environ(), c.Env...)
	}
	if c.Stdin != "" {
		cmd.Stdin = strings.NewReader(c.Stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A daemonizing child (nvidia-cuda-mps-control -d) may keep inherited
	// pipes open; do not wait for them longer than needed.
	cmd.WaitDelay = time.Second
	klog.FromContext(ctx).V(4).Info("Running external command", "command", c.String())
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("run %s: %w: %s", c, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// lookInRoot finds a tool in a root's binary directories and returns its
// path inside the root.
func lookInRoot(root, name string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"} {
		if st, err := os.Stat(filepath.Join(root, dir, name)); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return filepath.Join(dir, name), nil
		}
	}
	return "", fmt.Errorf("%s not found in the binary directories of %s", name, root)
}
