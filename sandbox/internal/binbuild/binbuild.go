// Package binbuild is what the sandbox's binary builders share (k8sbin for
// Kubernetes, nodebin for a real node, opbin for the workload operators):
// the user's cache directory, the Go toolchain's version (part of every
// cache stamp), a lock so that concurrent callers build once, and progress
// lines — one per binary with its build time, counting up on a terminal.
package binbuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
)

// CacheRoot is ~/.cache/tessera (or $XDG_CACHE_HOME/tessera).
func CacheRoot() (string, error) {
	if dir := os.Getenv("XDG_CACHE_HOME"); dir != "" {
		return filepath.Join(dir, "tessera"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory (set XDG_CACHE_HOME or HOME): %w", err)
	}
	return filepath.Join(home, ".cache", "tessera"), nil
}

// GoVersion runs `go version`; its output (newline included) is part of
// every stamp. what names the binaries in the error ("the Kubernetes
// binaries").
func GoVersion(ctx context.Context, goCmd, what string) (string, error) {
	out, err := exec.CommandContext(ctx, goCmd, "version").Output()
	if err != nil {
		return "", fmt.Errorf("the Go toolchain is needed to build %s from the Go module proxy (`%s version`): %w", what, goCmd, err)
	}
	return string(out), nil
}

// StampFile holds a binary directory's stamp.
const StampFile = ".stamp"

// HasStamp reports whether dir was built for stamp.
func HasStamp(dir, stamp string) bool {
	data, err := os.ReadFile(filepath.Join(dir, StampFile))
	return err == nil && strings.TrimSpace(string(data)) == stamp
}

// Executable reports whether path is an executable file.
func Executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// Lock takes an exclusive flock on path, saying on out that it waits for
// another process building what when it has to.
func Lock(ctx context.Context, path string, out io.Writer, what string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	told := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !told && out != nil {
			fmt.Fprintf(out, "waiting for another process that is building %s (%s)\n", what, path)
			told = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Progress prints build progress: on a terminal one line per binary whose
// clock counts up; elsewhere (a log, CI) a line when a build starts, every
// minute while it runs, and when it ends.
type Progress struct {
	out io.Writer
	tty bool
}

// NewProgress writes to out (nil: nowhere).
func NewProgress(out io.Writer) *Progress {
	if out == nil {
		out = io.Discard
	}
	p := &Progress{out: out}
	if f, ok := out.(interface{ Fd() uintptr }); ok {
		p.tty = term.IsTerminal(int(f.Fd()))
	}
	return p
}

// Printf prints a line (replacing a running one on a terminal).
func (p *Progress) Printf(format string, args ...any) {
	if p.tty {
		fmt.Fprint(p.out, "\r\x1b[K")
	}
	fmt.Fprintf(p.out, format, args...)
}

// Running shows label with the time since start until the returned func is
// called.
func (p *Progress) Running(label string, start time.Time) func() {
	done := make(chan struct{})
	finished := make(chan struct{})
	every := time.Minute
	if p.tty {
		every = time.Second
		fmt.Fprintf(p.out, "%s building... 0s", label)
	} else {
		fmt.Fprintf(p.out, "%s building...\n", label)
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if p.tty {
					fmt.Fprintf(p.out, "\r\x1b[K%s building... %s", label, Elapsed(start))
				} else {
					fmt.Fprintf(p.out, "%s still building (%s)\n", label, Elapsed(start))
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// Run runs one build command with a progress line labelled
// "  [step] name", keeping the command's own output (module downloads,
// compiler messages) off the screen: it is in the error when the build
// fails.
func (p *Progress) Run(cmd *exec.Cmd, step, name string) error {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	label := fmt.Sprintf("  [%s] %-24s", step, name)
	stop := p.Running(label, start)
	err := cmd.Run()
	stop()
	if err != nil {
		p.Printf("%s failed after %s\n", label, Elapsed(start))
		return fmt.Errorf("build %s: %w\n%s", name, err, Tail(out.String(), 30))
	}
	p.Printf("%s built in %s\n", label, Elapsed(start))
	return nil
}

// Elapsed is the time since t, to the second.
func Elapsed(since time.Time) string {
	return time.Since(since).Round(time.Second).String()
}

// Tail returns the last lines of s.
func Tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Env is the environment of a build: the caller's, with GOWORK off (a
// go.work of the user's must not pull the pinned module in) and extra.
func Env(extra ...string) []string {
	return append(append(os.Environ(), "GOWORK=off"), extra...)
}
