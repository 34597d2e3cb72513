// Package proc runs the programs the sandbox starts (control-plane binaries,
// containerd, the kubelet, tessera-node instances) as child processes that
// cannot outlive the process that started them.
//
// Each runs in its own process group, so that stopping it also stops what it
// started, and with Pdeathsig, so that the kernel kills it if the starting
// process dies: a panicking or killed test binary leaves nothing running.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ErrExited is returned while waiting for a process that has already ended.
var ErrExited = errors.New("process exited")

// Process is one started program; its output goes to a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Start runs argv with env (nil: the current environment), appending its
// stdout and stderr to logPath.
func Start(name, logPath string, env []string, argv ...string) (*Process, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("start %s: no command", name)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create log for %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s (%s): %w", name, argv[0], err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's ID (also its process group's).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Argv is the command line the process was started with (to start it again).
func (p *Process) Argv() []string { return append([]string(nil), p.cmd.Args...) }

// Env is the environment it was started with (nil: the starter's).
func (p *Process) Env() []string { return append([]string(nil), p.cmd.Env...) }

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended, and how. A nil process has.
func (p *Process) Exited() (bool, error) {
	if p == nil {
		return true, nil
	}
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends sig to the process group and kills the group if the process has
// not ended within grace. It returns once the process has ended.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) {
	if p == nil {
		return
	}
	if done, _ := p.Exited(); done {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// LogTail returns the last lines of the process's log, for error messages.
func (p *Process) LogTail(lines int) string {
	if p == nil {
		return "(not started)"
	}
	return Tail(p.LogPath, lines)
}

// Tail returns the last lines of the file at path.
func Tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
