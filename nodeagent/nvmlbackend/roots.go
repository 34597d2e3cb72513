package nvmlbackend

import (
	"fmt"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Roots are where tessera-node finds a node's driver installation: its
// files (libraries, binaries), its device nodes, procfs and sysfs.
type Roots struct {
	// Driver is the driver root: "/" for a driver installed on the host,
	// "/run/nvidia/driver" (as mounted into tessera-node) for the GPU
	// operator's driver container.
	Driver string
	// Dev holds dev/nvidia* (the driver root, or "/").
	Dev string
	// Proc and Sys are procfs (for /proc/driver/nvidia*, /proc/devices) and
	// sysfs (for PCIe roots).
	Proc, Sys string
}

// HostRoots are a node's own: "/", "/", "/proc", "/sys".
var HostRoots = Roots{Driver: "/", Dev: "/", Proc: "/proc", Sys: "/sys"}

// RootsOf returns the roots that belong with an NVML backend: a mock
// machine's own driver installation (DriverRoot, created on first use), or
// the host's for the real library.
func RootsOf(lib nvml.Interface) (Roots, error) {
	m, ok := lib.(*Mock)
	if !ok {
		return HostRoots, nil
	}
	dir, err := m.DriverRoot()
	if err != nil {
		return Roots{}, fmt.Errorf("driver root of mock %s: %w", m.Machine, err)
	}
	return Roots{Driver: dir, Dev: dir, Proc: filepath.Join(dir, "proc"), Sys: filepath.Join(dir, "sys")}, nil
}
