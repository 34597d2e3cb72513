package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Holds are crash points of the fake NVIDIA tools (WriteFakeTools), as the
// mock machine's holds are of its MIG calls (nvmlbackend's hold/held/
// release): a held tool invocation parks at its start, before it takes
// effect, until the hold is released or the process is killed — a tool that
// has not returned yet when tessera-node dies. The chaos run (test/chaos)
// kills tessera-node mid-prepare of an MPS share and of a time-sliced GPU,
// and mid-unprepare of both, this way. A hold is a file in the directory $FAKE_TOOLS_HOLD_DIR names;
// each parked invocation writes a file beside it with what it was asked
// (and removes it when it goes on).
const (
	// HoldMPSDaemonStart parks nvidia-cuda-mps-control -d (an MPS
	// claim's control daemon start) before the daemon exists; parked
	// invocations report their pipe directory.
	HoldMPSDaemonStart = "mps-daemon-start"
	// HoldSMIComputePolicy parks nvidia-smi compute-policy (a time
	// slice being set) before it is set; parked invocations report the
	// tool's arguments.
	HoldSMIComputePolicy = "smi-compute-policy"
	// HoldMPSDaemonQuit parks an nvidia-cuda-mps-control invocation whose
	// commands include quit (an MPS claim's unprepare stopping its daemon)
	// before the daemon goes; parked invocations report their pipe
	// directory.
	HoldMPSDaemonQuit = "mps-daemon-quit"
)

var toolHolds = []string{HoldMPSDaemonStart, HoldSMIComputePolicy, HoldMPSDaemonQuit}

// toolHoldSh is the fake tools' shell side of a hold: tool_hold <name>
// <what> parks while $FAKE_TOOLS_HOLD_DIR/<name> exists and its own parked
// file is there (PassTool removes that one to let it go on).
const toolHoldSh = `tool_hold() {
  [ -n "$FAKE_TOOLS_HOLD_DIR" ] && [ -e "$FAKE_TOOLS_HOLD_DIR/$1" ] || return 0
  parked="$FAKE_TOOLS_HOLD_DIR/$1.parked.$$"
  printf '%s\n' "$2" > "$parked"
  while [ -e "$FAKE_TOOLS_HOLD_DIR/$1" ] && [ -e "$parked" ]; do sleep 0.05; done
  rm -f "$parked"
}`

// HoldTool arms the hold name in the hold directory dir: from now on the
// tool invocations it names park at their start.
func HoldTool(dir, name string) error {
	if !slices.Contains(toolHolds, name) {
		return fmt.Errorf("hold: %q is not a tool hold (one of %s)", name, strings.Join(toolHolds, ", "))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("hold %s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
		return fmt.Errorf("hold %s: %w", name, err)
	}
	return nil
}

// HeldTool returns what each invocation parked on the hold name reported
// (sorted). An invocation killed while parked stays listed until
// ReleaseTool.
func HeldTool(dir, name string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, name+".parked.*"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue // it went on meanwhile
			}
			return nil, fmt.Errorf("held %s: %w", name, err)
		}
		out = append(out, strings.TrimSpace(string(data)))
	}
	sort.Strings(out)
	return out, nil
}

// PassTool lets the invocations parked on the hold name now go on; the hold
// stays armed for later ones.
func PassTool(dir, name string) error {
	files, err := filepath.Glob(filepath.Join(dir, name+".parked.*"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("pass %s: %w", name, err)
		}
	}
	return nil
}

// ReleaseTool disarms the hold name (parked invocations go on) and forgets
// invocations that were killed while parked.
func ReleaseTool(dir, name string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("release %s: %w", name, err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, name+".parked.*"))
	for _, f := range files {
		_ = os.Remove(f)
	}
	return nil
}
