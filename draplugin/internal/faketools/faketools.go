// Package faketools puts fakes of nvidia-cuda-mps-control and nvidia-smi on
// PATH for tests. The fakes (fakebin, built once per test process) keep
// state on disk and fail like the tools do (see fakebin's documentation):
// a control daemon started with -d lives in its pipe directory until it is
// told to quit or killed, whatever happens to the process that started it;
// commands to a daemon that is not there fail; a killed daemon leaves a
// stale pipe that makes the next -d on the directory fail. nvidia-smi
// remembers each GPU's compute mode and time slice.
//
// Every invocation is also appended to a log (Calls). The helpers here look
// at the state (Daemon, GPU), kill a daemon (KillDaemon) and model a CUDA
// client in a container connecting to it (Connect).
package faketools

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tessera-gpu/tessera/draplugin/internal/faketools/state"
)

// Tools is an installed set of fakes.
type Tools struct {
	Dir string
	log string
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// binary builds fakebin once per process into a cache directory keyed by
// its sources, so repeated test runs reuse it.
func binary() (string, error) {
	buildOnce.Do(func() {
		_, self, _, _ := runtime.Caller(0)
		dir := filepath.Dir(self)
		h := sha256.New()
		for _, f := range []string{"fakebin/main.go", "state/state.go"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				buildErr = err
				return
			}
			h.Write(b)
		}
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		out := filepath.Join(cache, "tessera-faketools", hex.EncodeToString(h.Sum(nil))[:16], "fakebin")
		if _, err := os.Stat(out); err == nil {
			built = out
			return
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			buildErr = err
			return
		}
		tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, "./fakebin")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build fake tools: %w: %s", err, b)
			return
		}
		if err := os.Rename(tmp, out); err != nil {
			buildErr = err
			return
		}
		built = out
	})
	return built, buildErr
}

// Install puts the fakes into a temporary directory first on PATH for the
// rest of the test (t.Setenv: not for parallel tests).
func Install(t testing.TB) *Tools {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tools := &Tools{Dir: dir, log: filepath.Join(dir, "calls.log")}
	for _, name := range []string{"nvidia-cuda-mps-control", "nvidia-smi"} {
		if err := os.Symlink(bin, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_TOOLS_LOG", tools.log)
	t.Setenv("FAKE_TOOLS_DIR", dir)
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

// CallsMatching returns the recorded invocations that contain every one of
// the substrings.
func (f *Tools) CallsMatching(subs ...string) []string {
	var out []string
	for _, c := range f.Calls() {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(c, s)
		}
		if ok {
			out = append(out, c)
		}
	}
	return out
}

// Reset forgets the recorded calls.
func (f *Tools) Reset() { _ = os.Remove(f.log) }

func (f *Tools) flag(t testing.TB, name string, on bool) {
	t.Helper()
	p := filepath.Join(f.Dir, name)
	if on {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	_ = os.Remove(p)
}

// FailMPS makes every nvidia-cuda-mps-control call fail (true) or work.
func (f *Tools) FailMPS(t testing.TB, fail bool) { f.flag(t, "fail-mps", fail) }

// FailSMI makes every nvidia-smi call fail (true) or work.
func (f *Tools) FailSMI(t testing.TB, fail bool) { f.flag(t, "fail-smi", fail) }

// SetMPSVersion sets what nvidia-cuda-mps-control -v reports (e.g. "13010"
// for CUDA 13.1, the first with static SM partitioning).
func (f *Tools) SetMPSVersion(t testing.TB, v string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.Dir, "mps-version"), []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Daemon returns the state of the daemon of a pipe directory (nil: none
// was ever started there).
func Daemon(pipeDir string) (*state.Daemon, error) {
	unlock, err := state.LockDaemon(pipeDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return state.LoadDaemon(pipeDir)
}

// Alive says whether a daemon listens on the pipe directory.
func Alive(pipeDir string) bool {
	d, err := Daemon(pipeDir)
	return err == nil && d.Reachable(pipeDir)
}

// KillDaemon kills the daemon of a pipe directory as SIGKILL or the OOM
// killer would: it stops answering, and its control pipe and PID file stay
// behind.
func KillDaemon(pipeDir string) error {
	unlock, err := state.LockDaemon(pipeDir)
	if err != nil {
		return err
	}
	defer unlock()
	d, err := state.LoadDaemon(pipeDir)
	if err != nil || d == nil {
		return fmt.Errorf("no daemon in %s: %v", pipeDir, err)
	}
	d.Alive = false
	d.Servers = nil
	return state.SaveDaemon(pipeDir, d)
}

// GPU returns what the fake nvidia-smi set on a GPU: its compute mode
// ("Default" unless changed) and time slice (0..3).
func (f *Tools) GPU(uuid string) (computeMode string, timeSlice int) {
	unlock, err := state.Lock(f.Dir)
	if err != nil {
		return "", -1
	}
	defer unlock()
	gpus, err := state.LoadGPUs(f.Dir)
	if err != nil || gpus[uuid] == nil {
		return "Default", 0
	}
	mode := gpus[uuid].ComputeMode
	if mode == "" {
		mode = "Default"
	}
	return mode, gpus[uuid].TimeSlice
}

// Container is what a CUDA process in a container has: its environment and
// its bind mounts (container path → host path), as the runtime built them
// from the CDI edits.
type Container struct {
	Env    []string
	Mounts map[string]string
	UID    int
}

// Client is what an MPS client gets from the server it connected to.
type Client struct {
	// MPS is false when the process found no MPS pipe directory and runs
	// without MPS (no limits from MPS at all).
	MPS     bool
	PipeDir string // host path
	// Devices are the devices of the daemon, by the client's ordinals.
	Devices []string
	// PinnedMemLimit per device ordinal in MiB (0: none).
	PinnedMemLimitMiB map[int]int64
	// ActiveThreadPercentage in effect (100: none).
	ActiveThreadPercentage float64
	// Partition is the static SM partition the client runs in.
	Partition string
	ServerPID int
}

// ErrQueued is returned when the daemon's server runs for another user:
// MPS serves one UID at a time and queues the others.
var ErrQueued = errors.New("MPS server of another user is active: client queued")

// Connect models a CUDA client starting in the container (libcuda's MPS
// client side, per NVIDIA's MPS documentation): the pipe directory is
// CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps; no such directory means no
// MPS; a pipe without a daemon fails; the daemon starts a server for the
// client's UID with its default limits (one UID at a time); a client's own
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT / CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can
// only lower those; in static partitioning mode CUDA_MPS_SM_PARTITION must
// name one of the daemon's partitions.
func Connect(c Container) (Client, error) {
	env := map[string]string{}
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	dir := env["CUDA_MPS_PIPE_DIRECTORY"]
	if dir == "" {
		dir = "/tmp/nvidia-mps"
	}
	host := ""
	best := -1
	for ctr, h := range c.Mounts {
		if (dir == ctr || strings.HasPrefix(dir, ctr+"/")) && len(ctr) > best {
			host, best = h+strings.TrimPrefix(dir, ctr), len(ctr)
		}
	}
	if host == "" {
		return Client{}, nil
	}
	if _, err := os.Stat(filepath.Join(host, state.ControlPipe)); err != nil {
		return Client{}, nil
	}
	unlock, err := state.LockDaemon(host)
	if err != nil {
		return Client{}, err
	}
	defer unlock()
	d, err := state.LoadDaemon(host)
	if err != nil {
		return Client{}, err
	}
	if !d.Reachable(host) {
		return Client{}, fmt.Errorf("cudaErrorMpsConnectionFailed: no MPS control daemon answers on %s", host)
	}
	cl := Client{MPS: true, PipeDir: host, Devices: d.Visible, PinnedMemLimitMiB: map[int]int64{}}
	if d.Static {
		p := env["CUDA_MPS_SM_PARTITION"]
		found := false
		for _, part := range d.Partitions {
			found = found || part.ID == p
		}
		if !found {
			return Client{}, fmt.Errorf("CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION: the daemon runs in static partitioning mode and CUDA_MPS_SM_PARTITION=%q names none of its partitions", p)
		}
		cl.Partition = p
	}
	var srv *state.Server
	for i := range d.Servers {
		s := &d.Servers[i]
		if s.UID == c.UID {
			srv = s
		} else if s.Clients > 0 {
			return Client{}, ErrQueued
		}
	}
	if srv == nil {
		d.Servers = append(d.Servers, state.Server{PID: d.PID + 1 + len(d.Servers)*100, UID: c.UID,
			PinnedMemLimit: d.PinnedMemLimit, ActiveThreadPercentage: d.ActiveThreadPercentage})
		srv = &d.Servers[len(d.Servers)-1]
	}
	srv.Clients++
	cl.ServerPID = srv.PID
	for i, lim := range srv.PinnedMemLimit {
		cl.PinnedMemLimitMiB[i] = mib(lim)
	}
	if own := env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; own != "" {
		for _, part := range strings.Split(own, ",") {
			idx, lim, _ := strings.Cut(part, "=")
			i, err := strconv.Atoi(idx)
			if err != nil {
				continue
			}
			if v := mib(lim); cl.PinnedMemLimitMiB[i] == 0 || v < cl.PinnedMemLimitMiB[i] {
				cl.PinnedMemLimitMiB[i] = v
			}
		}
	}
	cl.ActiveThreadPercentage = srv.ActiveThreadPercentage
	if cl.ActiveThreadPercentage == 0 {
		cl.ActiveThreadPercentage = 100
	}
	if own, err := strconv.ParseFloat(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], 64); err == nil && own < cl.ActiveThreadPercentage {
		cl.ActiveThreadPercentage = own
	}
	return cl, state.SaveDaemon(host, d)
}

// mib parses an MPS size ("10240M", "10G", "512K", bytes) into MiB.
func mib(s string) int64 {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n * mult >> 20
}

// Daemons lists the pipe directories under root that ever had a fake
// daemon, and whether it is alive.
func Daemons(root string) map[string]bool {
	out := map[string]bool{}
	dirs, _ := state.PipeDirs()
	root = filepath.Clean(root)
	for _, dir := range dirs {
		if strings.HasPrefix(dir, root+string(filepath.Separator)) {
			out[dir] = Alive(dir)
		}
	}
	return out
}

// AliveDaemons lists the pipe directories under root with a live daemon.
func AliveDaemons(root string) []string {
	var out []string
	for dir, alive := range Daemons(root) {
		if alive {
			out = append(out, dir)
		}
	}
	sort.Strings(out)
	return out
}
