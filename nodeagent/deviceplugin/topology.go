package deviceplugin

import (
	"fmt"
	"slices"
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
	var chosen []*gpuallocator.Device
	if len(avail) <= maxExactGPUs {
		chosen = t.policy.Allocate(avail, req, size)
	} else {
		chosen = greedyPick(avail, req, size)
	}
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

// maxExactGPUs bounds the available GPUs for which go-gpuallocator's
// best-effort policy runs: it scores every partition of the available GPUs
// into sets of the requested size, which takes at most tens of
// milliseconds for 12 GPUs but seconds for 16 (BenchmarkPreferredWholeGPUs),
// and the kubelet waits for the answer while admitting a pod.
const maxExactGPUs = 12

// greedyPick grows a set from each seed (the must-include GPUs, else every
// single GPU) by adding the GPU with the highest link score to the set so
// far, and keeps the best-scoring set. It uses go-gpuallocator's links and
// pair scores but, unlike its best-effort policy, does not look at how well
// the GPUs left over pair up.
func greedyPick(avail, req []*gpuallocator.Device, size int) []*gpuallocator.Device {
	if len(avail) < size {
		return nil
	}
	var seeds [][]*gpuallocator.Device
	if len(req) > 0 {
		seeds = append(seeds, req)
	} else {
		for _, d := range avail {
			seeds = append(seeds, []*gpuallocator.Device{d})
		}
	}
	var best []*gpuallocator.Device
	bestScore := -1
	for _, seed := range seeds {
		set := append([]*gpuallocator.Device(nil), seed...)
		for len(set) < size {
			var next *gpuallocator.Device
			nextScore := -1
			for _, d := range avail {
				if slices.Contains(set, d) {
					continue
				}
				score := 0
				for _, s := range set {
					score += pairScore(d, s)
				}
				if score > nextScore {
					next, nextScore = d, score
				}
			}
			set = append(set, next)
		}
		if score := setScore(set); score > bestScore {
			best, bestScore = set, score
		}
	}
	return best
}

func setScore(set []*gpuallocator.Device) int {
	score := 0
	for i := range set {
		for j := i + 1; j < len(set); j++ {
			score += pairScore(set[i], set[j])
		}
	}
	return score
}

// pairScore is go-gpuallocator v0.6.0's pair score (calculateGPUPairScore,
// unexported): per link, 10 to 60 for PCIe paths from cross-CPU to same
// board and 100 per NVLink. Its link types are an ordered enum in an
// internal package: 1-6 the PCIe levels, 7 and up one to eighteen NVLinks.
func pairScore(a, b *gpuallocator.Device) int {
	score := 0
	for _, l := range a.Links[b.Index] {
		switch t := int(l.Type); {
		case t >= 1 && t <= 6:
			score += 10 * t
		case t >= 7:
			score += 100 * (t - 6)
		}
	}
	return score
}
