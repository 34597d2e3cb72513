package sandbox

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/tessera-gpu/tessera/draplugin/executor"
)

// simExecutor stands in for nvidia-smi and nvidia-cuda-mps-control on
// simulated nodes. It behaves as far as the plugin can observe: starting an
// MPS daemon creates its control pipe, "quit" removes it, and time-slice
// changes succeed. Every command is recorded.
type simExecutor struct {
	mu       sync.Mutex
	commands []string
}

var _ executor.Executor = (*simExecutor)(nil)

func (e *simExecutor) Run(_ context.Context, c executor.Command) ([]byte, error) {
	e.mu.Lock()
	e.commands = append(e.commands, c.String())
	e.mu.Unlock()
	switch c.Name {
	case "nvidia-smi":
		return nil, nil
	case "nvidia-cuda-mps-control":
		pipeDir := envValue(c.Env, "CUDA_MPS_PIPE_DIRECTORY")
		if pipeDir == "" {
			return nil, fmt.Errorf("%s: CUDA_MPS_PIPE_DIRECTORY not set", c)
		}
		control := filepath.Join(pipeDir, "control")
		switch {
		case len(c.Args) == 1 && c.Args[0] == "-d":
			if err := os.MkdirAll(pipeDir, 0o755); err != nil {
				return nil, err
			}
			// The daemon's environment holds its limits (draplugin reads them back).
			return nil, os.WriteFile(control, []byte(strings.Join(c.Env, "\n")), 0o644)
		case strings.TrimSpace(c.Stdin) == "quit":
			err := os.Remove(control)
			if os.IsNotExist(err) {
				return nil, fmt.Errorf("%s: no MPS daemon running", c)
			}
			return nil, err
		default: // get_server_list, get_default_*, set_default_*
			daemonEnv, _ := os.ReadFile(control)
			env := strings.Split(string(daemonEnv), "\n")
			var out strings.Builder
			for _, cmd := range strings.Split(strings.TrimSpace(c.Stdin), "\n") {
				switch f := strings.Fields(cmd); {
				case len(f) == 1 && f[0] == "get_default_active_thread_percentage":
					out.WriteString(cmp.Or(envValue(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "100") + "\n")
				case len(f) == 2 && f[0] == "get_default_device_pinned_mem_limit":
					lim := "0"
					for _, kv := range strings.Split(envValue(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), ",") {
						if v, ok := strings.CutPrefix(kv, f[1]+"="); ok {
							lim = v
						}
					}
					out.WriteString(lim + "\n")
				}
			}
			return []byte(out.String()), nil
		}
	}
	return nil, fmt.Errorf("%s: not available on a simulated node", c.Name)
}

// Commands returns what ran so far.
func (e *simExecutor) Commands() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.commands...)
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
