package deviceplugin

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/nodeagent/discovery"
)

// sysfsPCIDevices is where the kernel lists PCI devices; a variable so that
// tests can point it elsewhere.
var sysfsPCIDevices = "/sys/bus/pci/devices"

// FromDiscovery converts discovered GPUs (already narrowed by the caller to
// those in device-plugin mode) into the plugin's GPUs. A MIG instance NVML
// has no UUID for cannot be named to the runtime, so it is left out with a
// log line.
func FromDiscovery(ctx context.Context, gpus []discovery.GPU) []GPU {
	logger := klog.FromContext(ctx)
	out := make([]GPU, 0, len(gpus))
	for _, g := range gpus {
		pg := GPU{UUID: g.UUID, Index: g.Index, Minor: g.Minor, MIGEnabled: g.MigEnabled, NUMANode: numaNode(g.PCIBusID)}
		for _, m := range g.MigInstances {
			if m.UUID == "" {
				logger.Info("Not offering a MIG device without UUID through the device plugin", "gpu", g.UUID, "profile", m.Profile, "gi", m.GIID, "ci", m.CIID)
				continue
			}
			pg.MIGDevices = append(pg.MIGDevices, MIGDevice{UUID: m.UUID, Profile: m.Profile, Start: m.Placement.Start, GIID: m.GIID, CIID: m.CIID})
		}
		out = append(out, pg)
	}
	return out
}

// numaNode reads the GPU's NUMA node from sysfs; nil when the bus ID is
// unknown, sysfs has no entry (mock GPUs) or the kernel reports none (-1).
func numaNode(pciBusID string) *int {
	if pciBusID == "" {
		return nil
	}
	// NVML spells the domain with 8 digits (00000000:3b:00.0), sysfs with 4.
	id := strings.ToLower(pciBusID)
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) == 8 {
		id = domain[4:] + ":" + rest
	}
	b, err := os.ReadFile(filepath.Join(sysfsPCIDevices, id, "numa_node"))
	if err != nil {
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return nil
	}
	return &n
}
