package deviceplugin

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// topology holds go-gpuallocator's view of the node's GPUs: every pair's
// PCIe and NVLink connection, read from NVML once at start.
type topology struct {
	byUUID map[string]*gpuallocator.Device
	policy gpuallocator.Policy
	// err says why topology is unknown; picks then fall back to index order.
	err error
}

// newTopology reads the links of all GPUs of the NVML library (not only the
// selected ones: go-gpuallocator keys links by NVML index).
func newTopology(lib nvml.Interface) *topology {
	t := &topology{policy: gpuallocator.NewBestEffortPolicy()}
	devices, err := readDevices(lib)
	if err != nil {
		t.err = err
		return t
	}
	t.byUUID = make(map[string]*gpuallocator.Device, len(devices))
	for _, d := range devices {
		t.byUUID[d.UUID] = d
	}
	return t
}

// readDevices turns a panic into an error: go-nvml's mock devices panic on
// methods they do not define, and the mock backends of tessera-node model no
// topology, which must cost preferred allocation, not the node agent.
func readDevices(lib nvml.Interface) (devices gpuallocator.DeviceList, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading GPU topology: NVML call not available: %v", r)
		}
	}()
	devices, err = gpuallocator.NewDevices(gpuallocator.WithNvmlLib(lib))
	if err != nil {
		return nil, fmt.Errorf("reading GPU topology: %w", err)
	}
	return devices, nil
}

// pick chooses size GPUs (by UUID) from available, including required, with
// go-gpuallocator's best-effort policy: the set with the most NVLinks (then
// the closest PCIe paths), while keeping the rest of the node well
// connected for later requests. ok is false when the topology is unknown or
// a UUID is not in it.
func (t *topology) pick(available, required []string, size int) (picked []string, ok bool) {
	if t == nil || t.err != nil {
		return nil, false
	}
	avail, ok := t.devices(available)
	if !ok {
		return nil, false
	}
	req, ok := t.devices(required)
	if !ok {
		return nil, false
	}
	// go-gpuallocator walks the list in order; sort by index so that ties
	// are broken the same way every time.
	sort.Slice(avail, func(i, j int) bool { return avail[i].Index < avail[j].Index })
	chosen := t.policy.Allocate(avail, req, size)
	if len(chosen) != size {
		return nil, false
	}
	for _, d := range chosen {
		picked = append(picked, d.UUID)
	}
	return picked, true
}

func (t *topology) devices(uuids []string) ([]*gpuallocator.Device, bool) {
	out := make([]*gpuallocator.Device, 0, len(uuids))
	for _, id := range uuids {
		d, ok := t.byUUID[id]
		if !ok {
			return nil, false
		}
		out = append(out, d)
	}
	return out, true
}
