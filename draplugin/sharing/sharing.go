// Package sharing controls how processes share a GPU: MPS control daemons,
// one per claim (Controller, started where it outlives the plugin by a
// Launcher: a pod of its own, PodLauncher), the time-slice interval and the
// compute mode of a GPU (nvidia-smi), what an MPS client container is given
// (ClientEdits), and what the installed MPS can do (Capabilities). The
// tools run through an executor.Executor; docs/draplugin.md says why the
// daemons live where they do.
package sharing

import (
	"context"
	"fmt"
	"strconv"

	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/executor"
)

const (
	// MPSControl is the MPS control daemon binary.
	MPSControl = "nvidia-cuda-mps-control"
	// NvidiaSMI is the management CLI.
	NvidiaSMI = "nvidia-smi"

	// ContainerPipeDir is where a client container sees its daemon's pipe
	// directory. It is MPS's default pipe directory, so a process that
	// unsets CUDA_MPS_PIPE_DIRECTORY still reaches the daemon.
	ContainerPipeDir = "/tmp/nvidia-mps"
	// ContainerShmDir is where daemon and clients share memory.
	ContainerShmDir = "/dev/shm"
	// controlPipe is the control daemon's socket in its pipe directory.
	controlPipe = "control"
)

// TimeSlice is the compute-policy time slice of a GPU.
type TimeSlice int

// The intervals of nvidia-smi compute-policy --set-timeslice.
const (
	TimeSliceDefault TimeSlice = 0
	TimeSliceShort   TimeSlice = 1
	TimeSliceMedium  TimeSlice = 2
	TimeSliceLong    TimeSlice = 3
)

func (t TimeSlice) String() string {
	switch t {
	case TimeSliceDefault:
		return "Default"
	case TimeSliceShort:
		return "Short"
	case TimeSliceMedium:
		return "Medium"
	case TimeSliceLong:
		return "Long"
	}
	return "TimeSlice(" + strconv.Itoa(int(t)) + ")"
}

// ComputeMode is a GPU's compute mode (nvidia-smi -c).
type ComputeMode string

const (
	// ComputeDefault lets any number of processes hold contexts.
	ComputeDefault ComputeMode = "DEFAULT"
	// ComputeExclusiveProcess lets one process hold a context: with MPS,
	// the claim's MPS server, so that no process can use the GPU around
	// the daemon's limits.
	ComputeExclusiveProcess ComputeMode = "EXCLUSIVE_PROCESS"
)

// GPUSettings sets time slices and compute modes with nvidia-smi.
type GPUSettings struct {
	Exec executor.Executor
}

// SetTimeSlice sets the GPU's time-slice interval.
func (g GPUSettings) SetTimeSlice(ctx context.Context, gpuUUID string, t TimeSlice) error {
	if t < TimeSliceDefault || t > TimeSliceLong {
		return fmt.Errorf("time-slice interval %d out of range 0..3", int(t))
	}
	if !uuidPattern.MatchString(gpuUUID) || gpuUUID[:4] != "GPU-" {
		return fmt.Errorf("set time slice: %q is not a GPU UUID", gpuUUID)
	}
	if _, err := g.Exec.Run(ctx, executor.Command{
		Name: NvidiaSMI,
		Args: []string{"compute-policy", "-i", gpuUUID, "--set-timeslice", strconv.Itoa(int(t))},
	}); err != nil {
		return fmt.Errorf("set time slice of %s to %s: %w", gpuUUID, t, err)
	}
	return nil
}

// SetComputeMode sets the GPU's compute mode.
func (g GPUSettings) SetComputeMode(ctx context.Context, gpuUUID string, m ComputeMode) error {
	if m != ComputeDefault && m != ComputeExclusiveProcess {
		return fmt.Errorf("compute mode %q is not one of %s, %s", m, ComputeDefault, ComputeExclusiveProcess)
	}
	if !uuidPattern.MatchString(gpuUUID) || gpuUUID[:4] != "GPU-" {
		return fmt.Errorf("set compute mode: %q is not a GPU UUID", gpuUUID)
	}
	if _, err := g.Exec.Run(ctx, executor.Command{Name: NvidiaSMI, Args: []string{"-i", gpuUUID, "-c", string(m)}}); err != nil {
		return fmt.Errorf("set compute mode of %s to %s: %w", gpuUUID, m, err)
	}
	return nil
}

// ClientEdits are what every container of a claim with an MPS daemon gets
// (CDI spec-level edits of the claim): the daemon's pipe directory mounted
// at MPS's default location and pointed at, the daemon's shared memory at
// /dev/shm, and, with static partitioning, the partition to run in (a
// client without it fails in static partitioning mode: unsetting it cannot
// lift the partition). No limit is in the environment: the daemon holds
// them.
func ClientEdits(d Daemon) (env []string, mounts []cdi.Mount) {
	env = []string{"CUDA_MPS_PIPE_DIRECTORY=" + ContainerPipeDir}
	if d.SMPartition != "" {
		env = append(env, "CUDA_MPS_SM_PARTITION="+d.SMPartition)
	}
	mounts = []cdi.Mount{
		{HostPath: d.Pipe, ContainerPath: ContainerPipeDir},
		{HostPath: d.Shm, ContainerPath: ContainerShmDir},
	}
	return env, mounts
}
