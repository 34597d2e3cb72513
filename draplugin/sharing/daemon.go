package sharing

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin/executor"
)

// Launcher makes a claim's MPS control daemon exist somewhere that outlives
// the plugin (PodLauncher), or as the plugin's own child (ProcessLauncher).
// Whether a daemon runs is never asked of the launcher: it is asked of the
// daemon, through its control pipe (Controller.Alive).
type Launcher interface {
	// Name is recorded with the claim ("pod", "process").
	Name() string
	// Launch starts the daemon for spec unless the launcher already did;
	// it returns before the daemon answers.
	Launch(ctx context.Context, spec DaemonSpec, dirs Dirs) error
	// Remove undoes Launch; removing what is not there is no error.
	Remove(ctx context.Context, id string) error
	// Launched lists the daemons the launcher started that still exist
	// (pods), for startup reconciliation; a launcher that keeps nothing
	// returns nil.
	Launched(ctx context.Context) ([]string, error)
	// Describe says what the launcher knows about a daemon that does not
	// answer (a pod's phase and container state), for error messages.
	Describe(ctx context.Context, id string) string
}

// ProcessLauncher starts the daemon with nvidia-cuda-mps-control -d from
// the calling process: the daemon is a child of the tessera-node container
// and dies with it on a real node (a crash, an OOM kill or a rolling update
// of tessera-node kills every MPS client of the node). It is for simulated
// nodes, and for hosts where tessera-node runs outside a container.
type ProcessLauncher struct {
	Exec executor.Executor
}

var _ Launcher = ProcessLauncher{}

// Name implements Launcher.
func (ProcessLauncher) Name() string { return "process" }

// Launch implements Launcher.
func (l ProcessLauncher) Launch(ctx context.Context, spec DaemonSpec, dirs Dirs) error {
	return StartDaemon(ctx, l.Exec, spec, dirs)
}

// Remove implements Launcher: nothing beyond the daemon's own quit.
func (ProcessLauncher) Remove(context.Context, string) error { return nil }

// Launched implements Launcher.
func (ProcessLauncher) Launched(context.Context) ([]string, error) { return nil, nil }

// Describe implements Launcher.
func (ProcessLauncher) Describe(context.Context, string) string {
	return "started as a child of tessera-node"
}

// mpsCommand runs one nvidia-cuda-mps-control invocation on a pipe
// directory: commands (one per line) on stdin.
func mpsCommand(dirs Dirs, commands ...string) executor.Command {
	return executor.Command{
		Name:  MPSControl,
		Env:   []string{"CUDA_MPS_PIPE_DIRECTORY=" + dirs.Pipe, "CUDA_MPS_LOG_DIRECTORY=" + dirs.Log},
		Stdin: strings.Join(commands, "\n") + "\n",
	}
}

// StartDaemon starts a claim's control daemon: it removes what a dead
// daemon left in the pipe directory (a stale control pipe makes a new
// daemon fail to bind) and runs nvidia-cuda-mps-control -d with the spec's
// devices and limits in its environment. The caller has found that no
// daemon answers on the directory.
func StartDaemon(ctx context.Context, ex executor.Executor, spec DaemonSpec, dirs Dirs) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := makeDirs(dirs); err != nil {
		return err
	}
	removed, err := cleanPipeDir(dirs.Pipe)
	if err != nil {
		return err
	}
	if removed > 0 {
		klog.FromContext(ctx).Info("Removed a dead MPS control daemon's stale pipe", "claim", spec.Claim, "pipeDir", dirs.Pipe, "files", removed)
	}
	if _, err := ex.Run(ctx, executor.Command{Name: MPSControl, Args: spec.daemonArgs(), Env: spec.daemonEnv(dirs)}); err != nil {
		return fmt.Errorf("start MPS control daemon for claim %s: %w", spec.Claim, err)
	}
	klog.FromContext(ctx).Info("Started MPS control daemon", "claim", spec.Claim, "devices", spec.Devices, "pipeDir", dirs.Pipe)
	return nil
}

func makeDirs(dirs Dirs) error {
	for _, d := range []string{dirs.Pipe, dirs.Log, dirs.Shm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create MPS directory: %w", err)
		}
	}
	// Like /dev/shm: the MPS server and its clients, of the claim's user,
	// create their shared memory files here.
	if err := os.Chmod(dirs.Shm, 0o1777); err != nil {
		return fmt.Errorf("create MPS shared memory directory: %w", err)
	}
	return nil
}

// cleanPipeDir removes everything in a pipe directory no daemon answers on.
func cleanPipeDir(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("clean MPS pipe directory: %w", err)
	}
	n := 0
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return n, fmt.Errorf("clean MPS pipe directory: %w", err)
		}
		n++
	}
	return n, nil
}

// alive asks the daemon on dirs whether it runs (get_server_list through
// its control pipe). No control pipe: certainly not. A command that ran
// and failed: not answering (a dead daemon, or its stale pipe). A command
// that could not run at all (no nvidia-cuda-mps-control) is an error.
func alive(ctx context.Context, ex executor.Executor, dirs Dirs) (bool, error) {
	if _, err := os.Stat(filepath.Join(dirs.Pipe, controlPipe)); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	_, err := ex.Run(ctx, mpsCommand(dirs, "get_server_list"))
	if err == nil {
		return true, nil
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) || errors.Is(err, context.DeadlineExceeded) {
		return false, nil
	}
	return false, fmt.Errorf("ask MPS control daemon on %s: %w", dirs.Pipe, err)
}

// RunDaemon is the main loop of a daemon pod (`tessera-node mps-daemon`):
// it starts the claim's daemon (adopting one that answers, after a
// restart of this process inside the same container), checks every poll
// that it still answers and returns an error when it does not, so that the
// kubelet restarts the container and with it a daemon with the same limits;
// when ctx ends (the pod is deleted) it asks the daemon to quit.
func RunDaemon(ctx context.Context, ex executor.Executor, spec DaemonSpec, dirs Dirs, poll time.Duration) error {
	logger := klog.FromContext(ctx)
	if poll <= 0 {
		poll = 5 * time.Second
	}
	// A start is finished even when the pod goes meanwhile: then the loop
	// below quits the daemon at once instead of leaving half of one.
	start := context.WithoutCancel(ctx)
	up, err := alive(start, ex, dirs)
	if err != nil {
		return err
	}
	if !up {
		if err := StartDaemon(start, ex, spec, dirs); err != nil {
			return err
		}
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// The pod is going: a clean quit ends the servers and clients.
			stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
			defer cancel()
			if up, _ := alive(stop, ex, dirs); up {
				if _, err := ex.Run(stop, mpsCommand(dirs, "quit")); err != nil {
					return fmt.Errorf("quit MPS control daemon of claim %s: %w", spec.Claim, err)
				}
			}
			logger.Info("MPS control daemon stopped", "claim", spec.Claim)
			return nil
		case <-t.C:
			up, err := alive(ctx, ex, dirs)
			if err != nil {
				return err
			}
			if !up && ctx.Err() == nil {
				return fmt.Errorf("the MPS control daemon of claim %s stopped answering on %s", spec.Claim, dirs.Pipe)
			}
		}
	}
}

// Daemon is a claim's running daemon as the controller found or made it.
type Daemon struct {
	Dirs
	// Adopted: it was running already (a retried prepare).
	Adopted bool
	// SMPartition is the static SM partition of its device, with its size.
	SMPartition       string
	SMPartitionChunks int
	// Corrected lists limits the daemon had changed and that were set back.
	Corrected []string
}

// Controller starts, adopts and stops claims' MPS control daemons through
// a Launcher and talks to them through their control pipes.
type Controller struct {
	Exec executor.Executor
	// Root is the MPS directory: claims/<ID> for the claims' daemons, and
	// <UUID> for v2's daemons per device.
	Root     string
	Launcher Launcher
	// StartTimeout bounds how long Start waits for a launched daemon to
	// answer (default 40s: within the kubelet's prepare timeout). Poll is
	// the first wait between asks (default 10ms, doubling to 500ms).
	StartTimeout time.Duration
	Poll         time.Duration

	caps capsCache
}

// Dirs returns where the daemon id lives.
func (c *Controller) Dirs(id string) Dirs { return DirsOf(c.Root, id) }

// Alive asks the daemon id whether it runs.
func (c *Controller) Alive(ctx context.Context, id string) (bool, error) {
	return alive(ctx, c.Exec, c.Dirs(id))
}

func (c *Controller) waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) (bool, error) {
	wait := c.Poll
	if wait <= 0 {
		wait = 10 * time.Millisecond
	}
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok || err != nil {
			return ok, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// Start makes the claim's daemon run with the spec's limits and returns
// it: a daemon that answers already is adopted, otherwise whatever a dead
// one left is cleaned up and the launcher starts a new one. The limits are
// then read back from the daemon (get_default_*), and set again where they
// differ; with static partitioning the device's SM partition is created
// (or the one the daemon has is used).
func (c *Controller) Start(ctx context.Context, spec DaemonSpec) (Daemon, error) {
	if err := spec.Validate(); err != nil {
		return Daemon{}, err
	}
	dirs := c.Dirs(spec.ID)
	d := Daemon{Dirs: dirs}
	if err := makeDirs(dirs); err != nil {
		return d, err
	}
	// A daemon that answers is asked for its limits in the same call.
	up, corrected, err := c.checkLimits(ctx, spec, dirs)
	if err != nil {
		return d, err
	}
	d.Adopted, d.Corrected = up, corrected
	if !up {
		if err := c.Launcher.Launch(ctx, spec, dirs); err != nil {
			return d, fmt.Errorf("launch MPS control daemon for claim %s: %w", spec.Claim, err)
		}
		timeout := c.StartTimeout
		if timeout <= 0 {
			timeout = 40 * time.Second
		}
		up, err = c.waitFor(ctx, timeout, func() (bool, error) { return alive(ctx, c.Exec, dirs) })
		if err != nil {
			return d, err
		}
		if !up {
			return d, fmt.Errorf("the MPS control daemon of claim %s does not answer on %s after %s (%s)", spec.Claim, dirs.Pipe, timeout, c.Launcher.Describe(ctx, spec.ID))
		}
		if _, d.Corrected, err = c.checkLimits(ctx, spec, dirs); err != nil {
			return d, err
		}
	}
	if spec.StaticPartitioning {
		if d.SMPartition, d.SMPartitionChunks, err = c.partition(ctx, spec, dirs); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Adopt takes over the daemon of a claim prepared by an earlier plugin
// instance. One that answers keeps running: its limits are read back and
// set again where they were changed. One that does not answer is launched
// again without waiting for it (the launcher keeps what it has: a daemon
// pod that exists restarts its container by itself; a pod that is gone is
// created again). It reports whether the daemon answered.
func (c *Controller) Adopt(ctx context.Context, spec DaemonSpec) (bool, []string, error) {
	if err := spec.Validate(); err != nil {
		return false, nil, err
	}
	dirs := c.Dirs(spec.ID)
	up, corrected, err := c.checkLimits(ctx, spec, dirs)
	if err != nil || up {
		return up, corrected, err
	}
	if err := makeDirs(dirs); err != nil {
		return false, nil, err
	}
	if err := c.Launcher.Launch(ctx, spec, dirs); err != nil {
		return false, nil, fmt.Errorf("launch MPS control daemon for claim %s again: %w", spec.Claim, err)
	}
	return false, nil, nil
}

// checkLimits asks the daemon on dirs, in one call, for its default limits
// (and its servers, which makes the call a liveness check too) and sets
// those that differ from the spec (a daemon adopted after someone changed
// it through its control pipe). It reports whether the daemon answered and
// what it corrected. No control pipe: not running, nothing asked.
func (c *Controller) checkLimits(ctx context.Context, spec DaemonSpec, dirs Dirs) (bool, []string, error) {
	if _, err := os.Stat(filepath.Join(dirs.Pipe, controlPipe)); errors.Is(err, fs.ErrNotExist) {
		return false, nil, nil
	}
	cmds := []string{}
	if !spec.StaticPartitioning {
		cmds = append(cmds, "get_default_active_thread_percentage")
	}
	for i := range spec.Devices {
		cmds = append(cmds, "get_default_device_pinned_mem_limit "+strconv.Itoa(i))
	}
	// Last: its answer (one server PID per line) has no fixed length.
	out, err := c.Exec.Run(ctx, mpsCommand(dirs, append(cmds, "get_server_list")...))
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) || errors.Is(err, context.DeadlineExceeded) {
			return false, nil, nil
		}
		return false, nil, fmt.Errorf("ask MPS control daemon on %s: %w", dirs.Pipe, err)
	}
	lines := strings.Fields(string(out))
	if len(lines) < len(cmds) {
		return true, nil, fmt.Errorf("read the limits of the MPS control daemon of claim %s: %d answers to %d questions: %q", spec.Claim, len(lines), len(cmds), out)
	}
	corrected, err := c.setBack(ctx, spec, dirs, lines[:len(cmds)])
	return true, corrected, err
}

// setBack compares the daemon's answers with the spec and sets what
// differs.
func (c *Controller) setBack(ctx context.Context, spec DaemonSpec, dirs Dirs, lines []string) ([]string, error) {
	var fix, corrected []string
	if !spec.StaticPartitioning {
		want := float64(100)
		if spec.ActiveThreadPercentage > 0 {
			want = float64(spec.ActiveThreadPercentage)
		}
		got, err := strconv.ParseFloat(lines[0], 64)
		if err != nil || got != want {
			fix = append(fix, fmt.Sprintf("set_default_active_thread_percentage %d", int(want)))
			corrected = append(corrected, fmt.Sprintf("active thread percentage %s → %d", lines[0], int(want)))
		}
		lines = lines[1:]
	}
	for i := range spec.Devices {
		var want int64
		if i < len(spec.PinnedMemoryMiB) {
			want = spec.PinnedMemoryMiB[i]
		}
		if got, ok := parseMiB(lines[i]); !ok || got != want {
			fix = append(fix, fmt.Sprintf("set_default_device_pinned_mem_limit %d %dM", i, want))
			corrected = append(corrected, fmt.Sprintf("device %d pinned memory limit %s → %dM", i, lines[i], want))
		}
	}
	if len(fix) == 0 {
		return nil, nil
	}
	if _, err := c.Exec.Run(ctx, mpsCommand(dirs, fix...)); err != nil {
		return nil, fmt.Errorf("set the limits of the MPS control daemon of claim %s: %w", spec.Claim, err)
	}
	klog.FromContext(ctx).Info("Set back MPS limits the daemon had changed", "claim", spec.Claim, "corrected", corrected)
	return corrected, nil
}

// parseMiB reads an MPS size as the daemon prints it ("10240M", "10G",
// "0").
func parseMiB(s string) (int64, bool) {
	mult := int64(1) // MiB
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1024, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		s = strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "K"):
		n, err := strconv.ParseInt(strings.TrimSuffix(s, "K"), 10, 64)
		return n / 1024, err == nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err == nil
}

var (
	// lspart's device line and partition line (the format NVIDIA's static
	// partitioning prints: "GPU-… free chunks 12, used chunks 4, free SM
	// 96, used SM 32", "partition <id>: 4 chunks, 32 SM").
	lspartDevice    = regexp.MustCompile(`^(\S+)\s+free chunks (\d+), used chunks (\d+)`)
	lspartPartition = regexp.MustCompile(`^partition (\S+): (\d+) chunks`)
	partitionMade   = regexp.MustCompile(`Partition (\S+/\S+) created`)
)

// partition returns the device's static SM partition: the one the daemon
// has (it serves only this claim), or a new one of SMPercent of the
// device's chunks.
func (c *Controller) partition(ctx context.Context, spec DaemonSpec, dirs Dirs) (string, int, error) {
	dev := spec.Devices[0]
	out, err := c.Exec.Run(ctx, mpsCommand(dirs, "lspart"))
	if err != nil {
		return "", 0, fmt.Errorf("list the SM partitions of the MPS control daemon of claim %s: %w", spec.Claim, err)
	}
	total := -1
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if m := lspartPartition.FindStringSubmatch(line); m != nil && strings.HasPrefix(m[1], dev+"/") {
			n, _ := strconv.Atoi(m[2])
			return m[1], n, nil
		}
		if m := lspartDevice.FindStringSubmatch(line); m != nil && strings.HasPrefix(dev, m[1]) {
			free, _ := strconv.Atoi(m[2])
			used, _ := strconv.Atoi(m[3])
			total = free + used
		}
	}
	if total <= 0 {
		return "", 0, fmt.Errorf("the MPS control daemon of claim %s lists no SM chunks for %s: %q", spec.Claim, dev, out)
	}
	chunks := max(1, total*int(spec.SMPercent)/100)
	out, err = c.Exec.Run(ctx, mpsCommand(dirs, fmt.Sprintf("sm_partition add %s %d", dev, chunks)))
	if err != nil {
		return "", 0, fmt.Errorf("create an SM partition of %d of %d chunks for claim %s: %w", chunks, total, spec.Claim, err)
	}
	m := partitionMade.FindStringSubmatch(string(out))
	if m == nil {
		return "", 0, fmt.Errorf("create an SM partition of %d of %d chunks for claim %s: %s", chunks, total, spec.Claim, strings.TrimSpace(string(out)))
	}
	klog.FromContext(ctx).Info("Created static SM partition", "claim", spec.Claim, "device", dev, "partition", m[1], "chunks", chunks, "ofChunks", total)
	return m[1], chunks, nil
}

// Stop ends the claim's daemon: the launcher removes what it launched (a
// daemon pod quits its daemon when it is deleted); a daemon that still
// answers after that is told to quit. A daemon that is not running is
// stopped already: success. The directories go last.
func (c *Controller) Stop(ctx context.Context, id string) error {
	dirs := c.Dirs(id)
	if err := c.Launcher.Remove(ctx, id); err != nil {
		return fmt.Errorf("stop MPS control daemon %s: %w", id, err)
	}
	gone, err := c.waitFor(ctx, c.stopWait(), func() (bool, error) {
		up, err := alive(ctx, c.Exec, dirs)
		return !up, err
	})
	if err != nil {
		return fmt.Errorf("stop MPS control daemon %s: %w", id, err)
	}
	if !gone {
		if err := quit(ctx, c.Exec, dirs); err != nil {
			return fmt.Errorf("stop MPS control daemon %s: %w", id, err)
		}
	}
	if err := os.RemoveAll(dirs.Root); err != nil {
		return fmt.Errorf("remove the directory of MPS control daemon %s: %w", id, err)
	}
	klog.FromContext(ctx).V(2).Info("Stopped MPS control daemon", "id", id)
	return nil
}

// stopWait is how long Stop waits for a removed daemon to go before it
// sends quit itself: a pod's own quit on deletion, or nothing to wait for.
func (c *Controller) stopWait() time.Duration {
	if _, ok := c.Launcher.(ProcessLauncher); ok {
		return 0
	}
	return 30 * time.Second
}

// quit asks a daemon to quit; a daemon that does not answer any more is
// gone, which is what quit wanted.
func quit(ctx context.Context, ex executor.Executor, dirs Dirs) error {
	_, err := ex.Run(ctx, mpsCommand(dirs, "quit"))
	if err == nil {
		return nil
	}
	up, aerr := alive(ctx, ex, dirs)
	if aerr == nil && !up {
		return nil
	}
	return err
}

// Daemons lists the claims' daemons that exist: a directory under
// claims/, or something the launcher keeps (a pod).
func (c *Controller) Daemons(ctx context.Context) ([]string, error) {
	var out []string
	entries, err := os.ReadDir(filepath.Join(c.Root, ClaimsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	launched, err := c.Launcher.Launched(ctx)
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	for _, id := range launched {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Legacy daemons: v2 ran one daemon per GPU or MIG device, started with
// -d from tessera-node, in <Root>/<UUID>/{pipe,log}. Claims recorded by v2
// keep theirs until their last claim goes.

func (c *Controller) legacyDirs(uuid string) Dirs {
	r := filepath.Join(c.Root, uuid)
	return Dirs{Root: r, Pipe: filepath.Join(r, "pipe"), Log: filepath.Join(r, "log")}
}

// LegacyDaemons lists the device UUIDs that have a v2 daemon directory.
func (c *Controller) LegacyDaemons() ([]string, error) {
	entries, err := os.ReadDir(c.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && ValidUUID(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// StopLegacy stops the v2 daemon of a device (dead: success) and removes
// its directory.
func (c *Controller) StopLegacy(ctx context.Context, uuid string) error {
	if !ValidUUID(uuid) {
		return fmt.Errorf("stop MPS control daemon: %q is not a device UUID", uuid)
	}
	dirs := c.legacyDirs(uuid)
	up, err := alive(ctx, c.Exec, dirs)
	if err != nil {
		return err
	}
	if up {
		if err := quit(ctx, c.Exec, dirs); err != nil {
			return fmt.Errorf("stop MPS control daemon for %s: %w", uuid, err)
		}
	}
	if err := os.RemoveAll(dirs.Root); err != nil {
		return fmt.Errorf("remove MPS directory of %s: %w", uuid, err)
	}
	klog.FromContext(ctx).Info("Stopped the per-device MPS control daemon of a claim recorded by an earlier tessera-node", "device", uuid)
	return nil
}

// LegacyPipeDir is where the v2 daemon of a device keeps its pipes.
func (c *Controller) LegacyPipeDir(uuid string) string { return c.legacyDirs(uuid).Pipe }
