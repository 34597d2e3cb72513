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

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// nvidiaMajor is the NVIDIA driver's fixed character major
// (/dev/nvidia<minor>, nvidiactl 255, nvidia-modeset 254).
const nvidiaMajor = 195

// deviceNumbers are the character majors of the driver's devices, from
// /proc/devices: nvidia-uvm and nvidia-caps are assigned when the modules
// load.
type deviceNumbers struct {
	uvm, caps int64
}

func readDeviceNumbers(procRoot string) (*deviceNumbers, error) {
	path := filepath.Join(procRoot, "devices")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read device majors: %w (is the NVIDIA driver loaded?)", err)
	}
	defer func() { _ = f.Close() }()
	n := &deviceNumbers{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "Block devices") {
			break
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			continue
		}
		major, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		switch fields[1] {
		case "nvidia-uvm":
			n.uvm = major
		case "nvidia-caps":
			n.caps = major
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return n, nil
}

// number is the driver's (major, minor) of a device node path, or ok=false
// for a node it does not know (DRM nodes: stat'ed instead).
func (n *deviceNumbers) number(path string) (major, minor int64, ok bool) {
	switch path {
	case "/dev/nvidiactl":
		return nvidiaMajor, 255, true
	case "/dev/nvidia-modeset":
		return nvidiaMajor, 254, true
	case "/dev/nvidia-uvm":
		return n.uvm, 0, n.uvm != 0
	case "/dev/nvidia-uvm-tools":
		return n.uvm, 1, n.uvm != 0
	}
	if rest, found := strings.CutPrefix(path, "/dev/nvidia-caps/nvidia-cap"); found {
		if m, err := strconv.ParseInt(rest, 10, 64); err == nil && n.caps != 0 {
			return n.caps, m, true
		}
	}
	if rest, found := strings.CutPrefix(path, "/dev/nvidia"); found {
		if m, err := strconv.ParseInt(rest, 10, 64); err == nil {
			return nvidiaMajor, m, true
		}
	}
	return 0, 0, false
}

// fill sets the node's type, major and minor: from the node itself under
// devRoot when it is a character device, else from the driver's numbers.
// A node that is neither is an error: the runtime could not create it.
func (n *deviceNumbers) fill(node *cdispec.DeviceNode, devRoot string) error {
	if node.Type != "" && node.Major != 0 {
		return nil
	}
	host := node.HostPath
	if host == "" {
		host = node.Path
	}
	var st unix.Stat_t
	statErr := unix.Stat(host, &st)
	if statErr != nil && !strings.HasPrefix(host, devRoot) {
		statErr = unix.Stat(filepath.Join(devRoot, host), &st)
	}
	if statErr == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
		node.Type, node.Major, node.Minor = "c", int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		return nil
	}
	if major, minor, ok := n.number(node.Path); ok {
		node.Type, node.Major, node.Minor = "c", major, minor
		return nil
	}
	if statErr == nil {
		statErr = errors.New("not a character device")
	}
	return fmt.Errorf("CDI: device node %s: %w", node.Path, statErr)
}

func charDevice(path string, major, minor int64) *cdispec.DeviceNode {
	mode := fs.FileMode(0o666)
	return &cdispec.DeviceNode{Path: path, Type: "c", Major: major, Minor: minor, FileMode: &mode}
}

func capPath(minor int) string { return "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(minor) }
