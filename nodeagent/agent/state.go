package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/health"
)

// stateVersion is the format of the agent's state file.
const stateVersion = "tessera.gpu/node-state-v1"

// nodeState is what the agent keeps across restarts (Options.StatePath):
// the last description of every GPU it saw, so that a GPU that is lost
// when the agent starts is still published (tainted NoExecute) instead of
// silently vanishing, and the GPUs' XID and ECC conditions, so that a
// restart does not clear the taint of a GPU that is still broken.
type nodeState struct {
	Version    string          `json:"version"`
	GPUs       []discovery.GPU `json:"gpus"`
	Conditions []health.Event  `json:"conditions,omitempty"`
}

func readState(path string) (*nodeState, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &nodeState{Version: stateVersion}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read node state: %w", err)
	}
	var st nodeState
	if err := json.Unmarshal(raw, &st); err != nil || st.Version != stateVersion {
		// Only a cache of what NVML said: a state that cannot be read is
		// started afresh (logged by the caller), never a reason to stop.
		return &nodeState{Version: stateVersion}, fmt.Errorf("node state %s is unreadable (version %q): %v", path, st.Version, err)
	}
	return &st, nil
}

func writeState(path string, st *nodeState) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode node state: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(raw); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write node state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write node state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write node state: %w", err)
	}
	return nil
}

// mergeLost adds the GPUs that discovery found unavailable back into the
// node with their last known description, marked Lost, in index order. It
// returns one message per unavailable GPU, saying whether it is published
// (tainted) or withdrawn (never seen before).
func mergeLost(node *discovery.Node, known []discovery.GPU) []string {
	var notes []string
	for _, u := range node.Unavailable {
		var prev *discovery.GPU
		for i := range known {
			k := &known[i]
			if (u.UUID != "" && k.UUID == u.UUID) || (u.UUID == "" && k.Index == u.Index) {
				prev = k
			}
		}
		if prev == nil {
			notes = append(notes, fmt.Sprintf("GPU %d does not answer (%v) and was never seen before: it is not published", u.Index, u.Err))
			continue
		}
		g := *prev
		g.Lost, g.Device = true, nil
		node.GPUs = append(node.GPUs, g)
		notes = append(notes, fmt.Sprintf("GPU %d (%s, %s) does not answer (%v): published as last seen, tainted %s", g.Index, g.ProductName, g.UUID, u.Err, "gpu-lost"))
	}
	sort.SliceStable(node.GPUs, func(i, j int) bool { return node.GPUs[i].Index < node.GPUs[j].Index })
	return notes
}

// rememberGPUs updates the known GPUs with the ones that answered.
func rememberGPUs(known []discovery.GPU, node *discovery.Node) []discovery.GPU {
	byUUID := map[string]discovery.GPU{}
	for _, g := range known {
		byUUID[g.UUID] = g
	}
	for _, g := range node.GPUs {
		if !g.Lost {
			g.Device = nil
			byUUID[g.UUID] = g
		}
	}
	out := make([]discovery.GPU, 0, len(byUUID))
	for _, g := range byUUID {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// persistentConditions are the conditions worth keeping over a restart:
// XID and ECC errors. Lost is derived from NVML again.
func persistentConditions(events []health.Event) []health.Event {
	var out []health.Event
	for _, ev := range events {
		if !ev.Healthy && (ev.Kind == health.KindXID || ev.Kind == health.KindECC) {
			out = append(out, ev)
		}
	}
	return out
}
