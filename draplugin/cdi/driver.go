package cdi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultHookPath is where the NVIDIA container toolkit installs
// nvidia-cdi-hook on a host (the GPU operator: /usr/local/nvidia/toolkit/nvidia-cdi-hook).
const DefaultHookPath = "/usr/bin/nvidia-cdi-hook"

// DriverOptions say where the NVIDIA driver's files are.
type DriverOptions struct {
	// NVML is the initialised NVML library (real or a model).
	NVML nvml.Interface
	// DriverRoot is where tessera-node sees the driver installation: "/"
	// for a driver installed on the host, or the mount point of the GPU
	// operator's driver root (/run/nvidia/driver on the host).
	DriverRoot string
	// HostDriverRoot is the same directory as the container runtime on the
	// host sees it (default DriverRoot): every host path in a spec is
	// written relative to it.
	HostDriverRoot string
	// DevRoot holds dev/nvidia* as tessera-node sees it (default: the driver
	// root if it has dev/nvidiactl, else "/"); HostDevRoot is the host's
	// view (default: HostDriverRoot or "/" correspondingly).
	DevRoot, HostDevRoot string
	// ProcRoot is procfs (default /proc): /proc/devices gives the dynamic
	// majors of nvidia-uvm and nvidia-caps, /proc/driver/nvidia-caps/mig-minors
	// the MIG capability minors.
	ProcRoot string
	// HookPath is nvidia-cdi-hook on the host (default DefaultHookPath); the
	// runtime runs it to create library symlinks and update the ldcache.
	HookPath string
}

// Driver generates the CDI container edits of the NVIDIA driver with the
// NVIDIA container toolkit's nvcdi (the same library NVIDIA's DRA driver
// uses): libraries, binaries, IPC sockets, firmware, hooks and device
// nodes, each device node with its type, major and minor so that the
// runtime needs no host node to stat.
type Driver struct {
	opts    DriverOptions
	lib     nvcdi.Interface
	numbers *deviceNumbers
	caps    *MIGCaps
	// version is the driver version nvcdi found the libraries of.
	version string

	mu   sync.Mutex
	gpus map[string]cdispec.ContainerEdits
	// common is computed once: it is written into the base spec.
	common *cdispec.ContainerEdits
}

// ErrNoDriver is returned (wrapped) when the driver's files are not where
// DriverRoot says: no spec is ever written without the driver.
var ErrNoDriver = errors.New("NVIDIA driver libraries not found")

// NewDriver checks the driver installation and prepares the generator. It
// fails, naming the root, when nvcdi finds no driver libraries there (a
// wrong --driver-root), so that no claim ever gets a spec without them.
func NewDriver(opts DriverOptions) (*Driver, error) {
	if opts.NVML == nil {
		return nil, errors.New("CDI: NVML is required")
	}
	if opts.DriverRoot == "" {
		opts.DriverRoot = "/"
	}
	if opts.HostDriverRoot == "" {
		opts.HostDriverRoot = opts.DriverRoot
	}
	if opts.DevRoot == "" {
		opts.DevRoot, opts.HostDevRoot = "/", "/"
		if _, err := os.Stat(filepath.Join(opts.DriverRoot, "dev/nvidiactl")); err == nil {
			opts.DevRoot, opts.HostDevRoot = opts.DriverRoot, opts.HostDriverRoot
		}
	}
	if opts.HostDevRoot == "" {
		opts.HostDevRoot = opts.DevRoot
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.HookPath == "" {
		opts.HookPath = DefaultHookPath
	}
	numbers, err := readDeviceNumbers(opts.ProcRoot)
	if err != nil {
		return nil, fmt.Errorf("CDI: %w", err)
	}
	lib, err := nvcdi.New(
		nvcdi.WithNvmlLib(opts.NVML),
		nvcdi.WithDriverRoot(opts.DriverRoot),
		nvcdi.WithDevRoot(opts.DevRoot),
		nvcdi.WithNVIDIACDIHookPath(opts.HookPath),
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithVendor(Vendor),
		nvcdi.WithClass(Class),
		// nvsandboxutils is an optional helper library; NVML answers the same.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
		nvcdi.WithLogger(nvcdiLogger{}),
	)
	if err != nil {
		return nil, fmt.Errorf("CDI: %w", err)
	}
	d := &Driver{opts: opts, lib: lib, numbers: numbers, caps: &MIGCaps{MinorsFile: filepath.Join(opts.ProcRoot, "driver/nvidia-caps/mig-minors")}, gpus: map[string]cdispec.ContainerEdits{}}
	common, err := d.Common()
	if err != nil {
		return nil, err
	}
	for _, m := range common.Mounts {
		if base := filepath.Base(m.ContainerPath); strings.HasPrefix(base, "libcuda.so.") {
			d.version = strings.TrimPrefix(base, "libcuda.so.")
		}
	}
	if d.version == "" {
		return nil, fmt.Errorf("CDI: %w under driver root %s (no libcuda.so.<version>): set --driver-root to where the driver is installed (the GPU operator's driver container: /run/nvidia/driver)", ErrNoDriver, opts.DriverRoot)
	}
	return d, nil
}

// Options are the resolved options.
func (d *Driver) Options() DriverOptions { return d.opts }

// Version is the driver version whose libraries the edits mount.
func (d *Driver) Version() string { return d.version }

// Common are the edits every container with a GPU needs: the driver's
// libraries and binaries, the hooks that create their SONAME links and
// update the ldcache, IPC sockets, firmware, and the control device nodes
// (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools, /dev/nvidia-modeset).
func (d *Driver) Common() (cdispec.ContainerEdits, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.common != nil {
		return *d.common, nil
	}
	e, err := d.lib.GetCommonEdits()
	if err != nil {
		return cdispec.ContainerEdits{}, fmt.Errorf("CDI: driver edits under driver root %s: %w (set --driver-root to where the driver is installed; the GPU operator's driver container: /run/nvidia/driver): %w", d.opts.DriverRoot, ErrNoDriver, err)
	}
	edits, err := d.finish(*e.ContainerEdits)
	if err != nil {
		return cdispec.ContainerEdits{}, err
	}
	d.common = &edits
	return edits, nil
}

// GPU are the edits of one whole GPU: its device node (and DRM nodes with
// their by-path links where the GPU has them).
func (d *Driver) GPU(uuid string) (cdispec.ContainerEdits, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.gpus[uuid]; ok {
		return e, nil
	}
	specs, err := d.lib.GetDeviceSpecsByID(uuid)
	if err != nil {
		return cdispec.ContainerEdits{}, fmt.Errorf("CDI edits of GPU %s: %w", uuid, err)
	}
	if len(specs) == 0 {
		return cdispec.ContainerEdits{}, fmt.Errorf("CDI edits of GPU %s: nvcdi returned none", uuid)
	}
	edits, err := d.finish(specs[0].ContainerEdits)
	if err != nil {
		return cdispec.ContainerEdits{}, err
	}
	if len(edits.DeviceNodes) == 0 {
		return cdispec.ContainerEdits{}, fmt.Errorf("CDI edits of GPU %s: no device node under dev root %s", uuid, d.opts.DevRoot)
	}
	d.gpus[uuid] = edits
	return edits, nil
}

// MIG are the edits of one MIG device: its GPU's device node and the access
// capabilities of its GPU instance and compute instance. nvcdi would give
// the capability nodes as paths only, which the runtime stats on the host,
// where the driver may not have created them; here they carry the
// nvidia-caps major and the minors of the driver's mig-minors table.
func (d *Driver) MIG(parentUUID string, parentMinor int, gi, ci uint32) (cdispec.ContainerEdits, error) {
	gpu, err := d.GPU(parentUUID)
	if err != nil {
		return cdispec.ContainerEdits{}, err
	}
	var out cdispec.ContainerEdits
	for _, n := range gpu.DeviceNodes {
		if n.Path == GPUNode(parentMinor) {
			c := *n
			out.DeviceNodes = append(out.DeviceNodes, &c)
		}
	}
	if len(out.DeviceNodes) == 0 {
		return cdispec.ContainerEdits{}, fmt.Errorf("CDI edits of MIG device gi%d/ci%d of GPU %s: no %s", gi, ci, parentUUID, GPUNode(parentMinor))
	}
	minors, err := d.caps.Minors(parentMinor, gi, ci)
	if err != nil {
		return cdispec.ContainerEdits{}, err
	}
	if d.numbers.caps == 0 {
		return cdispec.ContainerEdits{}, fmt.Errorf("%s/devices lists no nvidia-caps major: the driver has no MIG capabilities", d.opts.ProcRoot)
	}
	for _, m := range minors {
		out.DeviceNodes = append(out.DeviceNodes, charDevice(capPath(m), d.numbers.caps, int64(m)))
	}
	return out, nil
}

// finish fills in device node numbers and turns the paths nvcdi found
// under DriverRoot and DevRoot into the host's.
func (d *Driver) finish(e cdispec.ContainerEdits) (cdispec.ContainerEdits, error) {
	for _, n := range e.DeviceNodes {
		if err := d.numbers.fill(n, d.opts.DevRoot); err != nil {
			return e, err
		}
	}
	spec := &cdispec.Spec{ContainerEdits: e}
	for _, t := range []struct{ from, to string }{{d.opts.DevRoot, d.opts.HostDevRoot}, {d.opts.DriverRoot, d.opts.HostDriverRoot}} {
		if t.from == t.to || t.from == "/" {
			continue
		}
		tr := transformroot.New(transformroot.WithRoot(t.from), transformroot.WithTargetRoot(t.to), transformroot.WithRelativeTo("host"))
		if err := tr.Transform(spec); err != nil {
			return e, fmt.Errorf("CDI: host paths: %w", err)
		}
	}
	return spec.ContainerEdits, nil
}

// nvcdiLogger sends nvcdi's messages to klog (V(4) for its chatter).
type nvcdiLogger struct{}

func (nvcdiLogger) Debugf(f string, a ...any)   { klog.V(5).Infof("nvcdi: "+f, a...) }
func (nvcdiLogger) Tracef(f string, a ...any)   { klog.V(6).Infof("nvcdi: "+f, a...) }
func (nvcdiLogger) Info(a ...any)               { klog.V(4).Info(append([]any{"nvcdi: "}, a...)...) }
func (nvcdiLogger) Infof(f string, a ...any)    { klog.V(4).Infof("nvcdi: "+f, a...) }
func (nvcdiLogger) Warning(a ...any)            { klog.V(2).Info(append([]any{"nvcdi warning: "}, a...)...) }
func (nvcdiLogger) Warningf(f string, a ...any) { klog.V(2).Infof("nvcdi warning: "+f, a...) }
func (nvcdiLogger) Errorf(f string, a ...any)   { klog.Errorf("nvcdi: "+f, a...) }
