// Package nvmlbackend opens the NVML implementation that the node agent, the
// DRA plugin and the device plugin share: the real libnvidia-ml, or a model
// of a DGX machine faithful to NVML (Mock: NVIDIA's MIG profile tables per
// product, MIG mode with pending changes, lost GPUs, XID events, a driver
// installation on disk, and what a container sees given its CDI edits).
package nvmlbackend

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Real is the backend spec that loads the real NVIDIA library.
const Real = "nvml"

// MockPrefix starts every mock backend spec ("mock:dgxh100?gpus=4").
const MockPrefix = "mock:"

// Spec is a parsed backend selector.
type Spec struct {
	// Mock is empty for the real library, else the machine name (dgxh100, ...).
	Mock string
	// GPUs is the number of GPUs of a mock machine (default 8).
	GPUs int
	// LibraryPath optionally overrides libnvidia-ml.so.1 for the real backend
	// ("nvml:/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").
	LibraryPath string
	// DriverRoot (mock option root=DIR) is where the mock machine lays out
	// its driver installation (Mock.WriteDriverRoot; it stays when the
	// machine shuts down). Empty: a temporary directory of its own.
	DriverRoot string
	// Control (mock option control=SOCKET, tests only) is a unix socket on
	// which the mock machine takes faults from outside the process: XID and
	// ECC events, a GPU lost and back (ServeControl).
	Control string
	// Serial (mock option serial=NAME) names the machine: its GPUs' UUIDs
	// follow from it, so that a tessera-node restarted on the same machine
	// (a new process, a new mock) sees the same GPUs, as on real hardware.
	// Empty: random UUIDs, a new machine each time.
	Serial string
	// State (mock option state=FILE) keeps the machine's driver state, its
	// MIG modes and instances, in FILE (Mock.UseStateFile): a tessera-node
	// restarted on the machine finds the instances its predecessor left,
	// as the real driver keeps them. Empty: the state dies with the process.
	State string
}

// ParseSpec parses "nvml", "nvml:<library path>", "mock:<machine>" or
// "mock:<machine>?gpus=N&root=DIR&control=SOCKET&serial=NAME&state=FILE" (options in any order,
// each optional; paths absolute).
func ParseSpec(spec string) (Spec, error) {
	switch {
	case spec == Real:
		return Spec{}, nil
	case strings.HasPrefix(spec, Real+":"):
		return Spec{LibraryPath: strings.TrimPrefix(spec, Real+":")}, nil
	case strings.HasPrefix(spec, MockPrefix):
		rest := strings.TrimPrefix(spec, MockPrefix)
		machine, query, _ := strings.Cut(rest, "?")
		if _, ok := mockMachines[machine]; !ok {
			return Spec{}, fmt.Errorf("backend %q: unknown mock machine %q (want one of %s)", spec, machine, strings.Join(MockMachines(), ", "))
		}
		s := Spec{Mock: machine, GPUs: 8}
		values, err := url.ParseQuery(query)
		if err != nil {
			return Spec{}, fmt.Errorf("backend %q: bad options: %w", spec, err)
		}
		for key, v := range values {
			switch key {
			case "gpus":
				n, err := strconv.Atoi(v[len(v)-1])
				if err != nil || n < 1 || n > 64 {
					return Spec{}, fmt.Errorf("backend %q: gpus must be a number from 1 to 64, got %q", spec, v[len(v)-1])
				}
				s.GPUs = n
			case "serial":
				if v[len(v)-1] == "" {
					return Spec{}, fmt.Errorf("backend %q: serial must not be empty", spec)
				}
				s.Serial = v[len(v)-1]
			case "root", "control", "state":
				p := v[len(v)-1]
				if !filepath.IsAbs(p) {
					return Spec{}, fmt.Errorf("backend %q: %s must be an absolute path, got %q", spec, key, p)
				}
				switch key {
				case "root":
					s.DriverRoot = p
				case "control":
					s.Control = p
				default:
					s.State = p
				}
			default:
				return Spec{}, fmt.Errorf("backend %q: unknown option %q (known: gpus, root, control, serial, state)", spec, key)
			}
		}
		return s, nil
	default:
		return Spec{}, fmt.Errorf("backend %q: want %q, %q or %q<machine>[?gpus=N] with machine one of %s", spec, Real, Real+":<library path>", MockPrefix, strings.Join(MockMachines(), ", "))
	}
}

// ErrLibraryNotFound is returned (wrapped) when the real backend cannot load
// libnvidia-ml, e.g. on a machine without the NVIDIA driver.
var ErrLibraryNotFound = errors.New("NVIDIA management library (libnvidia-ml.so.1) not found: is the NVIDIA driver installed on this node?")

// Open returns an initialised NVML interface for the spec. The caller owns it
// and calls Shutdown when done. A mock spec returns a *Mock.
func Open(spec string) (nvml.Interface, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	if s.Mock != "" {
		m, err := NewMock(s.Mock, s.GPUs)
		if err != nil {
			return nil, err
		}
		if s.Serial != "" {
			m.setSerial(s.Serial)
		}
		if s.State != "" {
			if s.Serial == "" {
				return nil, fmt.Errorf("backend %q: state needs serial (the state file names the machine's GPUs by UUID)", spec)
			}
			if err := m.UseStateFile(s.State); err != nil {
				return nil, fmt.Errorf("backend %q: %w", spec, err)
			}
		}
		if s.DriverRoot != "" {
			if err := m.WriteDriverRoot(s.DriverRoot); err != nil {
				return nil, fmt.Errorf("backend %q: %w", spec, err)
			}
		}
		if s.Control != "" {
			if err := m.ServeControl(s.Control); err != nil {
				return nil, fmt.Errorf("backend %q: %w", spec, err)
			}
		}
		return m, nil
	}
	var opts []nvml.LibraryOption
	if s.LibraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(s.LibraryPath))
	}
	lib := nvml.New(opts...)
	// Init loads the library with dlopen; a missing library is reported as a
	// return code, never a panic, so that the binary can exit with one line.
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("backend %q: %w", spec, ErrLibraryNotFound)
		}
		return nil, fmt.Errorf("backend %q: initialise NVML: %v", spec, ret)
	}
	return lib, nil
}
