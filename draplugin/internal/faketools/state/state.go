// Package state is the on-disk state of the fake NVIDIA tools, in the
// tools directory ($FAKE_TOOLS_DIR): each fake control daemon's state,
// keyed by its pipe directory (in which it creates the files the real
// daemon creates), and the GPUs' compute mode and time slice of the fake
// nvidia-smi. Both the fake binary and the test helpers read and write it
// under a file lock, so a "daemon" outlives the plugin process that
// started it, as a real one does, and tests can look at it or kill it.
// Keeping it out of the pipe directory means that whoever cleans a stale
// pipe directory (everything in it) does not erase the fake's memory.
package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Files the fake daemon creates in its pipe directory. ControlPipe and
// PIDFile are the names the real daemon uses (the MPS documentation:
// "The control daemon creates a nvidia-cuda-mps-control.pid file ... in
// the CUDA_MPS_PIPE_DIRECTORY"); the state file is the fake's own.
const (
	ControlPipe = "control"
	PIDFile     = "nvidia-cuda-mps-control.pid"
	daemonsDir  = "daemons"
	lockFile    = ".fake.lock"
	smiFile     = "fake-nvidia-smi.json"
)

// ToolsDir is where the state lives.
func ToolsDir() string { return os.Getenv("FAKE_TOOLS_DIR") }

func daemonKey(pipeDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(pipeDir)))
	return hex.EncodeToString(sum[:12])
}

// LockDaemon takes the lock of the daemon state of a pipe directory.
func LockDaemon(pipeDir string) (func(), error) {
	dir := filepath.Join(ToolsDir(), daemonsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return lockPath(filepath.Join(dir, daemonKey(pipeDir)+".lock"))
}

// Daemon is one fake MPS control daemon.
type Daemon struct {
	// PipeDir is the daemon's pipe directory.
	PipeDir string `json:"pipeDir"`
	// Alive is false once the daemon quit or was killed; a killed daemon
	// leaves its control pipe and PID file behind (a stale pipe).
	Alive bool `json:"alive"`
	PID   int  `json:"pid"`
	// Starts counts the daemons started on this pipe directory.
	Starts int `json:"starts"`
	// Visible is CUDA_VISIBLE_DEVICES of the daemon: the devices its
	// servers expose, as ordinals 0..n-1 in this order.
	Visible []string `json:"visible"`
	LogDir  string   `json:"logDir"`
	// PinnedMemLimit is the default pinned device memory limit per device
	// ordinal, as the daemon holds it ("10240M"), from
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in the daemon's environment or
	// set_default_device_pinned_mem_limit.
	PinnedMemLimit map[int]string `json:"pinnedMemLimit,omitempty"`
	// ActiveThreadPercentage is the default active thread percentage (0:
	// not set, i.e. 100).
	ActiveThreadPercentage float64 `json:"activeThreadPercentage,omitempty"`
	// Static is static SM partitioning mode (-S); Chunks is the number of
	// SM chunks of each visible device and ChunkSMs the SMs per chunk.
	Static     bool        `json:"static,omitempty"`
	Chunks     int         `json:"chunks,omitempty"`
	ChunkSMs   int         `json:"chunkSMs,omitempty"`
	Partitions []Partition `json:"partitions,omitempty"`
	// Servers are the MPS servers, one per user ID at a time.
	Servers []Server `json:"servers,omitempty"`
	// Version is what -v reported when the daemon started.
	Version string `json:"version"`
}

// Partition is a static SM partition.
type Partition struct {
	ID     string `json:"id"` // "<device UUID>/<opaque>"
	Device string `json:"device"`
	Chunks int    `json:"chunks"`
}

// Server is an MPS server of the daemon.
type Server struct {
	PID     int `json:"pid"`
	UID     int `json:"uid"`
	Clients int `json:"clients"`
	// PinnedMemLimit and ActiveThreadPercentage are the limits the server
	// was started with (the daemon's defaults at that moment).
	PinnedMemLimit         map[int]string `json:"pinnedMemLimit,omitempty"`
	ActiveThreadPercentage float64        `json:"activeThreadPercentage,omitempty"`
}

// Reachable says whether a client can connect: the control pipe is there
// and a daemon listens on it.
func (d *Daemon) Reachable(pipeDir string) bool {
	if d == nil || !d.Alive {
		return false
	}
	_, err := os.Stat(filepath.Join(pipeDir, ControlPipe))
	return err == nil
}

// GPU is what the fake nvidia-smi remembers of one GPU.
type GPU struct {
	ComputeMode string `json:"computeMode,omitempty"` // "Default" when empty
	TimeSlice   int    `json:"timeSlice"`
}

// Lock takes the exclusive lock of dir and returns its release. A missing
// dir is fs.ErrNotExist.
func Lock(dir string) (func(), error) { return lockPath(filepath.Join(dir, lockFile)) }

func lockPath(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil
}

// LoadDaemon reads the daemon state of a pipe directory; nil when no
// daemon was ever started there. Caller holds LockDaemon(pipeDir).
func LoadDaemon(pipeDir string) (*Daemon, error) {
	var d Daemon
	ok, err := load(filepath.Join(ToolsDir(), daemonsDir, daemonKey(pipeDir)+".json"), &d)
	if !ok {
		return nil, err
	}
	return &d, err
}

// SaveDaemon writes the daemon state. Caller holds LockDaemon(pipeDir).
func SaveDaemon(pipeDir string, d *Daemon) error {
	d.PipeDir = filepath.Clean(pipeDir)
	return save(filepath.Join(ToolsDir(), daemonsDir, daemonKey(pipeDir)+".json"), d)
}

// PipeDirs lists the pipe directories that ever had a daemon.
func PipeDirs() ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(ToolsDir(), daemonsDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range paths {
		var d Daemon
		if ok, err := load(p, &d); ok && err == nil {
			out = append(out, d.PipeDir)
		}
	}
	return out, nil
}

// LoadGPUs reads the fake nvidia-smi's state. Caller holds Lock(dir).
func LoadGPUs(dir string) (map[string]*GPU, error) {
	gpus := map[string]*GPU{}
	if _, err := load(filepath.Join(dir, smiFile), &gpus); err != nil {
		return nil, err
	}
	return gpus, nil
}

// SaveGPUs writes the fake nvidia-smi's state. Caller holds Lock(dir).
func SaveGPUs(dir string, gpus map[string]*GPU) error {
	return save(filepath.Join(dir, smiFile), gpus)
}

func load(path string, into any) (bool, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return true, fmt.Errorf("fake tool state %s: %w", path, err)
	}
	return true, nil
}

func save(path string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
