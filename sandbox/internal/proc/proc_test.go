package proc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStopEndsTheWholeProcessGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	// The shell starts a child that ignores nothing and would outlive the
	// shell if only the shell were signalled.
	p, err := Start("group", filepath.Join(dir, "log"), nil, "sh", "-c", "sleep 300 & echo $! > "+pidFile+"; echo started; wait")
	if err != nil {
		t.Fatal(err)
	}
	var child int
	deadline := time.Now().Add(10 * time.Second)
	for child == 0 && time.Now().Before(deadline) {
		if data, err := os.ReadFile(pidFile); err == nil && strings.TrimSpace(string(data)) != "" {
			if child, err = strconv.Atoi(strings.TrimSpace(string(data))); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatalf("child never started: %s", p.LogTail(5))
	}
	if done, _ := p.Exited(); done {
		t.Fatal("process reported ended while running")
	}
	p.Stop(syscall.SIGTERM, 5*time.Second)
	if done, _ := p.Exited(); !done {
		t.Fatal("Stop returned before the process ended")
	}
	deadline = time.Now().Add(5 * time.Second)
	for syscall.Kill(child, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the stopped process still runs", child)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := strings.Join(p.Argv(), " "); !strings.HasPrefix(got, "sh -c sleep 300") {
		t.Errorf("Argv() = %q, want the command line it was started with", got)
	}
	if got := p.LogTail(1); got != "started" {
		t.Errorf("LogTail(1) = %q, want %q", got, "started")
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	p, err := Start("stubborn", filepath.Join(t.TempDir(), "log"), nil, "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done")
	if err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(p.LogTail(1), "ready") {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	p.Stop(syscall.SIGTERM, 200*time.Millisecond)
	if done, err := p.Exited(); !done || err == nil {
		t.Fatalf("Exited() = %v, %v; want ended by a signal", done, err)
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Error("a process ignoring SIGTERM ended before the grace period")
	}
}

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Start("none", filepath.Join(dir, "log"), nil); err == nil {
		t.Error("Start with no command succeeded")
	}
	_, err := Start("missing", filepath.Join(dir, "log"), nil, filepath.Join(dir, "no-such-binary"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Start of a missing binary: %v, want an error wrapping os.ErrNotExist", err)
	}
	var p *Process
	if done, _ := p.Exited(); !done {
		t.Error("a nil process is not ended")
	}
	p.Stop(syscall.SIGKILL, time.Second) // must not panic
}
