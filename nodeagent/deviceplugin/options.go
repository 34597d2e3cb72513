package deviceplugin

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Options are what New needs.
type Options struct {
	// Config is the device plugin part of the node config; New defaults
	// and validates it.
	Config Config
	// GPUs are the GPUs the node config puts in device-plugin mode, and
	// only those: a GPU is in exactly one mode (DRA or device plugin), and
	// the caller's selection is what keeps it so.
	GPUs []GPU
	// NVML is the library the GPUs were discovered with. With it, whole-GPU
	// picks follow the NVLink/PCIe topology (go-gpuallocator); without it,
	// or when it cannot report topology, they follow GPU index order.
	NVML nvml.Interface
	// Health, when set, marks devices Unhealthy and Healthy again.
	Health HealthSource
	// MIGMinorsFile is the driver's MIG capability table (default
	// /proc/driver/nvidia-caps/mig-minors), read when an envvar Allocate
	// response lists a MIG device's capability nodes.
	MIGMinorsFile string
}

// gpus checks the selection: a GPU or MIG device listed twice would be
// offered twice.
func (o Options) gpus() ([]GPU, error) {
	seen := map[string]string{}
	for i, g := range o.GPUs {
		if g.UUID == "" {
			return nil, fmt.Errorf("GPUs[%d] (index %d): UUID is empty", i, g.Index)
		}
		if prev, dup := seen[g.UUID]; dup {
			return nil, fmt.Errorf("GPUs[%d]: UUID %q already used by %s", i, g.UUID, prev)
		}
		seen[g.UUID] = fmt.Sprintf("GPUs[%d]", i)
		for j, m := range g.MIGDevices {
			where := fmt.Sprintf("GPUs[%d].MIGDevices[%d]", i, j)
			if m.UUID == "" || m.Profile == "" {
				return nil, fmt.Errorf("%s: UUID and Profile must be set", where)
			}
			if prev, dup := seen[m.UUID]; dup {
				return nil, fmt.Errorf("%s: UUID %q already used by %s", where, m.UUID, prev)
			}
			seen[m.UUID] = where
		}
	}
	return o.GPUs, nil
}
