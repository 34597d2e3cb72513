// Package sharing controls how processes share a GPU: the MPS control
// daemon (one per GPU or MIG device, started for its first client claim
// and stopped after its last) and the time-slice interval of a GPU. The
// tools run through an executor.Executor.
package sharing

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/executor"
)

const (
	// MPSControl is the MPS control daemon binary.
	MPSControl = "nvidia-cuda-mps-control"
	// NvidiaSMI is the management CLI.
	NvidiaSMI = "nvidia-smi"

	// ContainerPipeDir is where a client container sees the daemon's pipe
	// directory; CUDA_MPS_PIPE_DIRECTORY points there.
	ContainerPipeDir = "/tmp/nvidia-mps"
	// controlPipe is the named pipe the daemon creates in its pipe
	// directory; its presence tells a running daemon from a stopped one.
	controlPipe = "control"
)

// Controller starts and stops MPS daemons and sets time slices.
type Controller struct {
	Exec executor.Executor
	// MPSRoot is the host directory under which every daemon gets
	// <uuid>/pipe and <uuid>/log.
	MPSRoot string
}

// Daemon returns where the daemon for the device lives.
func (c *Controller) Daemon(uuid string) checkpoint.MPSDaemon {
	return checkpoint.MPSDaemon{
		PipeDir: filepath.Join(c.MPSRoot, uuid, "pipe"),
		LogDir:  filepath.Join(c.MPSRoot, uuid, "log"),
	}
}

// StartMPS starts the control daemon for the device with the given UUID
// (a GPU-… or MIG-… UUID) unless it runs already. The daemon runs with -d
// (it daemonizes), so it outlives the plugin process: a restarted plugin
// finds it through its control pipe under MPSRoot.
func (c *Controller) StartMPS(ctx context.Context, uuid string) (checkpoint.MPSDaemon, error) {
	d := c.Daemon(uuid)
	for _, dir := range []string{d.PipeDir, d.LogDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return d, fmt.Errorf("create MPS directory for %s: %w", uuid, err)
		}
	}
	if c.Running(uuid) {
		klog.FromContext(ctx).V(2).Info("MPS control daemon already running", "device", uuid)
		return d, nil
	}
	_, err := c.Exec.Run(ctx, executor.Command{
		Name: MPSControl,
		Args: []string{"-d"},
		Env: []string{
			"CUDA_VISIBLE_DEVICES=" + uuid,
			"CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir,
			"CUDA_MPS_LOG_DIRECTORY=" + d.LogDir,
		},
	})
	if err != nil {
		return d, fmt.Errorf("start MPS control daemon for %s: %w", uuid, err)
	}
	klog.FromContext(ctx).Info("Started MPS control daemon", "device", uuid, "pipeDir", d.PipeDir)
	return d, nil
}

// Running reports whether the daemon's control pipe exists.
func (c *Controller) Running(uuid string) bool {
	_, err := os.Stat(filepath.Join(c.Daemon(uuid).PipeDir, controlPipe))
	return err == nil
}

// Daemons lists the devices whose daemon is running.
func (c *Controller) Daemons() ([]string, error) {
	entries, err := os.ReadDir(c.MPSRoot)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && c.Running(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// StopMPS asks the daemon to quit. A daemon that is not running is not an
// error: stopping is idempotent.
func (c *Controller) StopMPS(ctx context.Context, uuid string) error {
	if !c.Running(uuid) {
		klog.FromContext(ctx).V(2).Info("MPS control daemon not running", "device", uuid)
		return nil
	}
	d := c.Daemon(uuid)
	_, err := c.Exec.Run(ctx, executor.Command{
		Name: MPSControl,
		Env: []string{
			"CUDA_MPS_PIPE_DIRECTORY=" + d.PipeDir,
			"CUDA_MPS_LOG_DIRECTORY=" + d.LogDir,
		},
		Stdin: "quit\n",
	})
	if err != nil {
		return fmt.Errorf("stop MPS control daemon for %s: %w", uuid, err)
	}
	klog.FromContext(ctx).Info("Stopped MPS control daemon", "device", uuid)
	return nil
}

// SetTimeSlice sets the GPU's time-slice interval (0 Default … 3 Long).
func (c *Controller) SetTimeSlice(ctx context.Context, gpuUUID string, interval int) error {
	if interval < 0 || interval > 3 {
		return fmt.Errorf("time-slice interval %d out of range 0..3", interval)
	}
	_, err := c.Exec.Run(ctx, executor.Command{
		Name: NvidiaSMI,
		Args: []string{"compute-policy", "-i", gpuUUID, "--set-timeslice", strconv.Itoa(interval)},
	})
	if err != nil {
		return fmt.Errorf("set time slice of %s to %d: %w", gpuUUID, interval, err)
	}
	return nil
}

// ClientEnv is the environment of an MPS client with the claim's limits.
// The memory limit is given for device ordinal 0 in MiB (MPS counts in
// MiB, rounded down, at least 1): a container sees the claim's GPU as its
// first device.
func ClientEnv(s *checkpoint.Sharing) []string {
	env := []string{"CUDA_MPS_PIPE_DIRECTORY=" + ContainerPipeDir}
	if s.ActiveThreadPercentage > 0 {
		env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(int(s.ActiveThreadPercentage)))
	}
	if s.PinnedMemoryLimitBytes > 0 {
		mib := max(s.PinnedMemoryLimitBytes>>20, 1)
		env = append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="+strconv.FormatInt(mib, 10)+"M")
	}
	return env
}
