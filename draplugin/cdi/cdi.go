// Package cdi writes one transient CDI spec per prepared claim through
// tags.cncf.io/container-device-interface. The spec holds the device nodes
// of the claim's GPUs and MIG devices, the control nodes, MPS client
// environment and mounts. The claim's checkpoint record is kept as a spec
// annotation, so that a plugin whose checkpoint was lost can still tell
// which claims it prepared.
package cdi

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/contract"
)

const (
	// Vendor and Class make the CDI kind k8s.gpu.tessera.dev/claim.
	Vendor = "k8s." + contract.DriverName
	Class  = "claim"
	// ClaimAnnotation holds the claim's record (JSON) in each spec.
	ClaimAnnotation = contract.DriverName + "/claim"

	// DefaultDir is where container runtimes look for generated specs.
	DefaultDir = cdiapi.DefaultDynamicDir
)

// Kind is the CDI kind of the plugin's devices.
var Kind = Vendor + "/" + Class

// Device is the container edits for one allocated device.
type Device struct {
	// Name is unique within the claim (the DRA device name).
	Name        string
	DeviceNodes []string
	Env         []string
	Mounts      []Mount
}

// Mount is a bind mount into the container.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

// Writer writes and removes the per-claim specs.
type Writer struct {
	dir   string
	cache *cdiapi.Cache
	// ControlNodes are added to every spec (nvidiactl, nvidia-uvm, …).
	ControlNodes []string
}

// DefaultControlNodes are the driver's control device nodes that every
// CUDA process needs.
var DefaultControlNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// NewWriter writes specs into dir, creating it if needed.
func NewWriter(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory: %w", err)
	}
	// No auto refresh: the plugin only writes, it never resolves devices,
	// so a directory watcher would only cost a goroutine and rescans.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("create CDI cache: %w", err)
	}
	return &Writer{dir: dir, cache: cache, ControlNodes: DefaultControlNodes}, nil
}

// DeviceID is the CDI ID of a claim's device: the claim UID makes it unique
// over time, so a runtime's cached spec never matches a newer claim.
func DeviceID(claimUID types.UID, device string) string {
	return parser.QualifiedName(Vendor, Class, deviceName(claimUID, device))
}

func deviceName(claimUID types.UID, device string) string {
	return string(claimUID) + "-" + device
}

func specName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, string(claimUID)) + ".json"
}

// SpecPath is the file that holds the claim's spec.
func (w *Writer) SpecPath(claimUID types.UID) string {
	return filepath.Join(w.dir, specName(claimUID))
}

// Write validates and writes the claim's spec, replacing an older one.
// record is stored as the ClaimAnnotation.
func (w *Writer) Write(claimUID types.UID, record []byte, devices []Device) ([]string, error) {
	spec := &cdispec.Spec{
		Kind:        Kind,
		Annotations: map[string]string{ClaimAnnotation: string(record)},
	}
	for _, n := range w.ControlNodes {
		spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, &cdispec.DeviceNode{Path: n})
	}
	ids := make([]string, 0, len(devices))
	for _, d := range devices {
		cd := cdispec.Device{Name: deviceName(claimUID, d.Name)}
		for _, n := range d.DeviceNodes {
			cd.ContainerEdits.DeviceNodes = append(cd.ContainerEdits.DeviceNodes, &cdispec.DeviceNode{Path: n})
		}
		cd.ContainerEdits.Env = d.Env
		for _, m := range d.Mounts {
			opts := []string{"rbind", "rw"}
			if m.ReadOnly {
				opts = []string{"rbind", "ro"}
			}
			cd.ContainerEdits.Mounts = append(cd.ContainerEdits.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: opts})
		}
		spec.Devices = append(spec.Devices, cd)
		ids = append(ids, DeviceID(claimUID, d.Name))
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec version for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	// WriteSpec validates the spec (names, edits, annotations) before it
	// writes it through a temporary file and rename.
	if err := w.cache.WriteSpec(spec, specName(claimUID)); err != nil {
		return nil, fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return ids, nil
}

// Remove deletes the claim's spec; a missing spec is not an error.
func (w *Writer) Remove(claimUID types.UID) error {
	if err := w.cache.RemoveSpec(specName(claimUID)); err != nil {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// Claims lists the claims that have a spec in the directory, with the
// record each spec carries. Specs that cannot be read are returned in
// broken by claim UID so the caller can log and remove them.
func (w *Writer) Claims() (records map[types.UID][]byte, broken map[types.UID]error, err error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list CDI specs: %w", err)
	}
	prefix := cdiapi.GenerateTransientSpecName(Vendor, Class, "")
	records, broken = map[types.UID][]byte{}, map[types.UID]error{}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		uid := types.UID(strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".json"))
		spec, err := cdiapi.ReadSpec(filepath.Join(w.dir, name), 0)
		if err != nil {
			broken[uid] = err
			continue
		}
		records[uid] = []byte(spec.Annotations[ClaimAnnotation])
	}
	return records, broken, nil
}

// GPUNode is the device node of a GPU.
func GPUNode(minor int) string { return "/dev/nvidia" + strconv.Itoa(minor) }

// MIGCaps resolves the capability device nodes that grant access to a GPU
// instance and a compute instance.
type MIGCaps struct {
	// MinorsFile is the driver's table (default
	// /proc/driver/nvidia-caps/mig-minors). When it does not exist (no
	// driver, mock NVML) the driver's fixed layout is computed instead.
	MinorsFile string
}

// DefaultMIGMinorsFile is where the NVIDIA driver publishes the table.
const DefaultMIGMinorsFile = "/proc/driver/nvidia-caps/mig-minors"

// Nodes returns the capability device nodes for (gpu minor, GI, CI).
func (m MIGCaps) Nodes(gpuMinor int, gi, ci uint32) ([]string, error) {
	giKey := fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi)
	ciKey := fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci)
	table, err := readMinors(m.MinorsFile)
	if err != nil {
		return nil, err
	}
	var giMinor, ciMinor int
	if table != nil {
		var ok1, ok2 bool
		giMinor, ok1 = table[giKey]
		ciMinor, ok2 = table[ciKey]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%s has no entry for %s or %s", m.MinorsFile, giKey, ciKey)
		}
	} else {
		// The driver numbers capabilities 1 (config), 2 (monitor), then per
		// GPU 15 GPU instances of 1 access + 8 compute instances each.
		giMinor = 3 + gpuMinor*15*9 + int(gi)*9
		ciMinor = giMinor + 1 + int(ci)
	}
	return []string{
		"/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(giMinor),
		"/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(ciMinor),
	}, nil
}

func readMinors(path string) (map[string]int, error) {
	if path == "" {
		path = DefaultMIGMinorsFile
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read MIG capability minors: %w", err)
	}
	defer func() { _ = f.Close() }()
	table := map[string]int{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 2 {
			continue
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s: bad minor in %q", path, s.Text())
		}
		table[fields[0]] = n
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return table, nil
}
