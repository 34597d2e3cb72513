package nvmlbackend

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// ContainerView is what a CUDA process in a container sees of the machine.
type ContainerView struct {
	// Devices are the CUDA devices the process can use, in enumeration order.
	Devices []VisibleDevice
	// Problems say why something the container was given is not usable.
	Problems []string
}

// VisibleDevice is one CUDA device: a whole GPU or a MIG device.
type VisibleDevice struct {
	// UUID is the GPU's or the MIG device's UUID (GPU-… / MIG-…).
	UUID string
	// GPU is the physical GPU's UUID.
	GPU string
	// Profile is the MIG profile ("1g.10gb"); empty for a whole GPU.
	Profile   string
	GIID      uint32
	CIID      uint32
	MemoryMiB uint64
	SMs       int
}

// ContainerView says what CUDA in a container with this OCI spec (as the
// runtime built it from the container's CDI edits) can use, following the
// driver's rules:
//
//   - the driver's user-space library must be there: libcuda.so.<driver
//     version> mounted, and libcuda.so.1 reachable (mounted itself, or
//     linked by a create-symlinks hook, or found by an ldcache update hook);
//     libnvidia-ml.so.<version> likewise for NVML;
//   - /dev/nvidiactl and /dev/nvidia-uvm must exist as character devices
//     with the driver's numbers;
//   - a GPU needs /dev/nvidia<minor> (195:<minor>). With MIG mode off the
//     process sees the whole GPU. With MIG mode on it sees no whole GPU, only
//     the MIG devices whose GPU-instance and compute-instance access
//     capabilities it holds: /dev/nvidia-caps/nvidia-cap<minor> character
//     devices with the nvidia-caps major and the minors of
//     /proc/driver/nvidia-caps/mig-minors;
//   - a lost GPU is not usable;
//   - CUDA_VISIBLE_DEVICES, when set, narrows the devices to the UUIDs or
//     indices it lists.
func (m *Mock) ContainerView(spec *oci.Spec) ContainerView {
	var v ContainerView
	type devnum struct{ major, minor int64 }
	nodes := map[string]devnum{}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			if d.Type == "c" {
				nodes[d.Path] = devnum{d.Major, d.Minor}
			}
		}
	}
	has := func(p string, major, minor int64) bool {
		n, ok := nodes[p]
		return ok && n.major == major && n.minor == minor
	}
	mounted := map[string]bool{}
	for _, mt := range spec.Mounts {
		mounted[path.Base(mt.Destination)] = true
	}
	linked := func(file, name string) bool {
		if mounted[name] {
			return true
		}
		if spec.Hooks == nil {
			return false
		}
		for _, h := range append(append([]oci.Hook(nil), spec.Hooks.CreateContainer...), spec.Hooks.StartContainer...) {
			args := strings.Join(h.Args, " ")
			if strings.Contains(args, "create-symlinks") && strings.Contains(args, "/"+name) {
				return true
			}
			// ldconfig in the container creates the SONAME link of a
			// mounted library.
			if strings.Contains(args, "update-ldcache") && mounted[file] {
				return true
			}
		}
		return false
	}
	ver := m.driverVersion
	driverOK := true
	for _, lib := range []struct{ file, soname string }{{"libcuda.so." + ver, "libcuda.so.1"}, {"libnvidia-ml.so." + ver, "libnvidia-ml.so.1"}} {
		if !mounted[lib.file] {
			v.Problems = append(v.Problems, fmt.Sprintf("driver library %s is not mounted: CUDA cannot load", lib.file))
			driverOK = false
			continue
		}
		if !linked(lib.file, lib.soname) {
			v.Problems = append(v.Problems, fmt.Sprintf("%s is mounted but %s is neither mounted nor linked by a hook", lib.file, lib.soname))
			driverOK = false
		}
	}
	if !has("/dev/nvidiactl", NVIDIAMajor, CtlMinor) {
		v.Problems = append(v.Problems, "no /dev/nvidiactl (c 195:255)")
		driverOK = false
	}
	if !has("/dev/nvidia-uvm", UVMMajor, 0) {
		v.Problems = append(v.Problems, fmt.Sprintf("no /dev/nvidia-uvm (c %d:0)", UVMMajor))
		driverOK = false
	}
	env := map[string]string{}
	if spec.Process != nil {
		for _, e := range spec.Process.Env {
			k, val, _ := strings.Cut(e, "=")
			env[k] = val
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		node := "/dev/nvidia" + strconv.Itoa(g.Minor)
		if !has(node, NVIDIAMajor, int64(g.Minor)) {
			continue
		}
		if g.lost {
			v.Problems = append(v.Problems, fmt.Sprintf("GPU %d (%s) is lost", g.Minor, g.UUID))
			continue
		}
		if g.migCurrent != 1 {
			v.Devices = append(v.Devices, VisibleDevice{UUID: g.UUID, GPU: g.UUID, MemoryMiB: g.Product.MemoryMiB, SMs: g.Product.SMs})
			continue
		}
		before := len(v.Devices)
		for _, gi := range g.sortedGIsLocked() {
			giMinor, ciMinor := CapMinors(g.Minor, gi.ID)
			if !has("/dev/nvidia-caps/nvidia-cap"+strconv.Itoa(giMinor), CapsMajor, int64(giMinor)) {
				continue
			}
			for _, ci := range gi.sortedCIsLocked() {
				cm := ciMinor(ci.ID)
				if !has("/dev/nvidia-caps/nvidia-cap"+strconv.Itoa(cm), CapsMajor, int64(cm)) {
					continue
				}
				v.Devices = append(v.Devices, VisibleDevice{UUID: ci.mig.UUID, GPU: g.UUID, Profile: gi.Profile.Name, GIID: gi.ID, CIID: ci.ID, MemoryMiB: gi.Profile.MemoryMiB, SMs: ci.profile.sms})
			}
		}
		if len(v.Devices) == before {
			v.Problems = append(v.Problems, fmt.Sprintf("GPU %d (%s) is in MIG mode and the container holds no MIG device's capabilities: CUDA sees no device on it", g.Minor, g.UUID))
		}
	}
	if !driverOK {
		if len(v.Devices) > 0 {
			v.Problems = append(v.Problems, fmt.Sprintf("%d device node(s) present, but without the driver CUDA sees no device", len(v.Devices)))
		}
		v.Devices = nil
		return v
	}
	if list, ok := env["CUDA_VISIBLE_DEVICES"]; ok {
		var kept []VisibleDevice
		for i, d := range v.Devices {
			for _, want := range strings.Split(list, ",") {
				want = strings.TrimSpace(want)
				if want == d.UUID || want == strconv.Itoa(i) {
					kept = append(kept, d)
				}
			}
		}
		v.Devices = kept
	}
	return v
}

// UUIDs of the visible devices.
func (v ContainerView) UUIDs() []string {
	out := make([]string, 0, len(v.Devices))
	for _, d := range v.Devices {
		out = append(out, d.UUID)
	}
	return out
}

// Sees says whether the container sees the device with this UUID.
func (v ContainerView) Sees(uuid string) bool {
	return slices.ContainsFunc(v.Devices, func(d VisibleDevice) bool { return d.UUID == uuid })
}
