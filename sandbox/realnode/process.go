package realnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// process is one program of the node (containerd, the kubelet, a
// tessera-node instance, the mount-namespace anchor). Each runs in its own
// process group, and the kernel kills it if the process that started it dies
// (Pdeathsig), so a test binary that is killed does not leave them running.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func startProcess(name, logPath string, env []string, argv ...string) (*process, error) {
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
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
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

// stop sends sig to the process group and kills it if it has not gone
// within the grace period.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil {
		return
	}
	if done, _ := p.exited(); done {
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

// logTail returns the last lines of the process's log, for error messages.
func (p *process) logTail(lines int) string {
	if p == nil {
		return "(not started)"
	}
	return tail(p.logPath, lines)
}

func tail(path string, lines int) string {
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

// processesUnder returns the PIDs of processes whose executable or command
// line names a path under dir (what a node left running, for the leak check).
func processesUnder(dirs ...string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		args := strings.ReplaceAll(string(cmdline), "\x00", " ")
		for _, d := range dirs {
			if d != "" && (strings.HasPrefix(exe, d) || strings.Contains(args, d)) {
				found = append(found, fmt.Sprintf("pid %d: %s", pid, strings.TrimSpace(args)))
				break
			}
		}
	}
	return found
}

var errExited = errors.New("process exited")
