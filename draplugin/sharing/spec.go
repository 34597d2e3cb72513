package sharing

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// DaemonSpec is what one claim's MPS control daemon is started with. Every
// value ends up in a tool's environment, argv or stdin, or in a pod spec:
// Validate checks each before anything runs.
type DaemonSpec struct {
	// ID is the claim UID: it names the daemon's directory and pod.
	ID string
	// Claim is "namespace/name", for the pod's annotation and messages.
	Claim string
	// Devices are GPU or MIG device UUIDs in the order CUDA enumerates
	// them in the claim's containers; the daemon's servers expose them as
	// ordinals 0..n-1 in this order (CUDA_VISIBLE_DEVICES).
	Devices []string
	// PinnedMemoryMiB is the default pinned device memory limit per
	// ordinal (0: none), CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
	PinnedMemoryMiB []int64
	// ActiveThreadPercentage is the default for the daemon's servers (0:
	// none), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
	ActiveThreadPercentage int32
	// StaticPartitioning starts the daemon with -S; SMPercent is the share
	// of each device's SM chunks its partition gets.
	StaticPartitioning bool
	SMPercent          int32
}

var (
	// uuidPattern is how NVML spells GPU and MIG device UUIDs.
	uuidPattern = regexp.MustCompile(`^(GPU|MIG)-[0-9A-Za-z-]{1,80}$`)
	// idPattern is a claim UID (RFC 4122 text form, or any DNS-label-like
	// ID tests use): it becomes a directory and a pod name.
	idPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?$`)
)

// ValidUUID says whether s is a GPU or MIG device UUID as NVML reports it.
func ValidUUID(s string) bool { return uuidPattern.MatchString(s) }

// Validate checks every value of the spec.
func (s DaemonSpec) Validate() error {
	var errs []error
	if !idPattern.MatchString(s.ID) {
		errs = append(errs, fmt.Errorf("daemon ID %q is not a claim UID", s.ID))
	}
	if len(s.Devices) == 0 {
		errs = append(errs, errors.New("no devices"))
	}
	seen := map[string]bool{}
	for _, d := range s.Devices {
		if !ValidUUID(d) {
			errs = append(errs, fmt.Errorf("device %q is not a GPU or MIG device UUID", d))
		}
		if seen[d] {
			errs = append(errs, fmt.Errorf("device %s given twice", d))
		}
		seen[d] = true
	}
	if len(s.PinnedMemoryMiB) > len(s.Devices) {
		errs = append(errs, fmt.Errorf("%d memory limits for %d devices", len(s.PinnedMemoryMiB), len(s.Devices)))
	}
	for i, m := range s.PinnedMemoryMiB {
		if m < 0 || m > 1<<40 {
			errs = append(errs, fmt.Errorf("pinned memory limit of device %d out of range: %d MiB", i, m))
		}
	}
	if s.ActiveThreadPercentage < 0 || s.ActiveThreadPercentage > 100 {
		errs = append(errs, fmt.Errorf("active thread percentage %d out of range 0..100", s.ActiveThreadPercentage))
	}
	if s.StaticPartitioning && (s.SMPercent < 1 || s.SMPercent > 100) {
		errs = append(errs, fmt.Errorf("static SM partitioning needs an SM share of 1..100%%, got %d", s.SMPercent))
	}
	if s.StaticPartitioning && len(s.Devices) != 1 {
		// CUDA_MPS_SM_PARTITION names one partition.
		errs = append(errs, fmt.Errorf("static SM partitioning serves one device per daemon, not %d", len(s.Devices)))
	}
	if strings.ContainsAny(s.Claim, "\n\r") {
		errs = append(errs, errors.New("claim name contains a line break"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("MPS daemon spec: %w", errors.Join(errs...))
	}
	return nil
}

// pinnedMemoryEnv is CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: one ordinal=limit
// entry per device that has a limit, in MiB ("0=10240M,1=4096M").
func (s DaemonSpec) pinnedMemoryEnv() string {
	var parts []string
	for i, m := range s.PinnedMemoryMiB {
		if m > 0 {
			parts = append(parts, strconv.Itoa(i)+"="+strconv.FormatInt(m, 10)+"M")
		}
	}
	return strings.Join(parts, ",")
}

// daemonEnv is the environment the control daemon starts with: its
// devices, directories and default limits. MPS applies limits set in the
// control daemon's environment to every server it starts, and a client's
// own variables can only lower them (NVIDIA's MPS documentation,
// "Environment Variables"): the limits hold whatever a tenant sets or
// unsets. Being in the environment, they also hold for a daemon its pod
// restarted, from its first server on.
func (s DaemonSpec) daemonEnv(d Dirs) []string {
	env := []string{
		"CUDA_VISIBLE_DEVICES=" + strings.Join(s.Devices, ","),
		"CUDA_MPS_PIPE_DIRECTORY=" + d.Pipe,
		"CUDA_MPS_LOG_DIRECTORY=" + d.Log,
	}
	if v := s.pinnedMemoryEnv(); v != "" {
		env = append(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="+v)
	}
	if s.ActiveThreadPercentage > 0 && !s.StaticPartitioning {
		// Ignored in static partitioning mode, where the partition limits
		// the SMs.
		env = append(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(int(s.ActiveThreadPercentage)))
	}
	return env
}

func (s DaemonSpec) daemonArgs() []string {
	if s.StaticPartitioning {
		return []string{"-d", "-S"}
	}
	return []string{"-d"}
}

// Dirs are the host directories of one claim's daemon, under
// <MPS directory>/claims/<ID>: the control pipe and server sockets, the
// logs, and the shared memory the daemon and its clients both mount at
// /dev/shm.
type Dirs struct {
	Root, Pipe, Log, Shm string
}

// ClaimsDir is the subdirectory of the MPS directory that holds the claims'
// daemons. (The v2 per-device daemons lived directly under the MPS
// directory, named by device UUID.)
const ClaimsDir = "claims"

// DirsOf returns the directories of the daemon id under root.
func DirsOf(root, id string) Dirs {
	r := filepath.Join(root, ClaimsDir, id)
	return Dirs{Root: r, Pipe: filepath.Join(r, "pipe"), Log: filepath.Join(r, "log"), Shm: filepath.Join(r, "shm")}
}

// DaemonFlags are the command-line form of a DaemonSpec: the arguments of
// `tessera-node mps-daemon`, which a daemon pod runs. Flags builds them,
// AddFlags parses them back.
type DaemonFlags struct {
	Spec   DaemonSpec
	MPSDir string
	// Chroot runs the MPS tools chrooted into this directory (the driver
	// root mounted into the pod), as NVIDIA's MPS daemon pod does.
	Chroot string
}

// Args renders the flags.
func (f DaemonFlags) Args() []string {
	args := []string{"--id=" + f.Spec.ID, "--claim=" + f.Spec.Claim, "--mps-dir=" + f.MPSDir, "--devices=" + strings.Join(f.Spec.Devices, ",")}
	if len(f.Spec.PinnedMemoryMiB) > 0 {
		var m []string
		for _, v := range f.Spec.PinnedMemoryMiB {
			m = append(m, strconv.FormatInt(v, 10))
		}
		args = append(args, "--pinned-memory-mib="+strings.Join(m, ","))
	}
	if f.Spec.ActiveThreadPercentage > 0 {
		args = append(args, "--active-thread-percentage="+strconv.Itoa(int(f.Spec.ActiveThreadPercentage)))
	}
	if f.Spec.StaticPartitioning {
		args = append(args, "--static-partitioning", "--sm-percent="+strconv.Itoa(int(f.Spec.SMPercent)))
	}
	if f.Chroot != "" {
		args = append(args, "--chroot="+f.Chroot)
	}
	return args
}

// AddFlags registers the flags on fs, filling f when parsed.
func (f *DaemonFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Spec.ID, "id", "", "Daemon ID: the claim UID.")
	fs.StringVar(&f.Spec.Claim, "claim", "", "The claim, namespace/name (for logs).")
	fs.StringVar(&f.MPSDir, "mps-dir", "", "The MPS directory; the daemon uses claims/<id>/{pipe,log,shm} under it.")
	fs.StringSliceVar(&f.Spec.Devices, "devices", nil, "GPU or MIG device UUIDs, in the order CUDA enumerates them in the claim's containers.")
	fs.Int64SliceVar(&f.Spec.PinnedMemoryMiB, "pinned-memory-mib", nil, "Default pinned device memory limit per device, MiB (0: none).")
	fs.Int32Var(&f.Spec.ActiveThreadPercentage, "active-thread-percentage", 0, "Default active thread percentage (0: none).")
	fs.BoolVar(&f.Spec.StaticPartitioning, "static-partitioning", false, "Start the daemon with static SM partitioning (-S).")
	fs.Int32Var(&f.Spec.SMPercent, "sm-percent", 0, "With --static-partitioning: the share of the device's SM chunks its partition gets.")
	fs.StringVar(&f.Chroot, "chroot", "", "Run the MPS tools chrooted into this directory (the driver root).")
}

// Validate checks the parsed flags.
func (f DaemonFlags) Validate() error {
	if !filepath.IsAbs(f.MPSDir) {
		return fmt.Errorf("--mps-dir %q is not an absolute path", f.MPSDir)
	}
	if f.Chroot != "" && !filepath.IsAbs(f.Chroot) {
		return fmt.Errorf("--chroot %q is not an absolute path", f.Chroot)
	}
	return f.Spec.Validate()
}
