// Package faketools puts recording fakes of nvidia-smi and
// nvidia-cuda-mps-control on PATH for tests. Each invocation appends one
// line to a log: the tool, its arguments, the environment that matters
// and its stdin. The MPS fake creates the daemon's control pipe on -d and
// removes it on quit, like the real daemon.
package faketools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Tools is an installed set of fakes.
type Tools struct {
	Dir string
	log string
}

const mpsScript = `#!/bin/sh
stdin=""
if [ "$1" != "-d" ]; then stdin=$(cat); fi
if [ -e "$FAKE_FAIL_MPS" ]; then echo "fake failure" >&2; exit 1; fi
printf '%s\n' "nvidia-cuda-mps-control $* | visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY | stdin=$stdin" >> "$FAKE_TOOLS_LOG"
if [ "$1" = "-d" ]; then : > "$CUDA_MPS_PIPE_DIRECTORY/control"; fi
if [ "$stdin" = "quit" ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi
`

const smiScript = `#!/bin/sh
printf '%s\n' "nvidia-smi $*" >> "$FAKE_TOOLS_LOG"
`

// Install writes the fakes into a temporary directory and puts it first
// on PATH for the rest of the test (t.Setenv: not for parallel tests).
func Install(t testing.TB) *Tools {
	t.Helper()
	dir := t.TempDir()
	tools := &Tools{Dir: dir, log: filepath.Join(dir, "calls.log")}
	for name, script := range map[string]string{"nvidia-cuda-mps-control": mpsScript, "nvidia-smi": smiScript} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_TOOLS_LOG", tools.log)
	t.Setenv("FAKE_FAIL_MPS", filepath.Join(dir, "fail-mps"))
	return tools
}

// Calls returns the recorded invocations in order.
func (f *Tools) Calls() []string {
	b, err := os.ReadFile(f.log)
	if err != nil {
		return nil
	}
	s := strings.TrimRight(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// Reset forgets the recorded calls.
func (f *Tools) Reset() { _ = os.Remove(f.log) }

// FailMPS makes the MPS fake fail (true) or work (false).
func (f *Tools) FailMPS(t testing.TB, fail bool) {
	p := filepath.Join(f.Dir, "fail-mps")
	if fail {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	_ = os.Remove(p)
}
