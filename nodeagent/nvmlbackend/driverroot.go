package nvmlbackend

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Device numbers of the modelled driver. 195 is the NVIDIA driver's fixed
// character major (nvidia-frontend); nvidia-uvm and nvidia-caps get dynamic
// majors at module load, listed in /proc/devices.
const (
	NVIDIAMajor  = 195
	CtlMinor     = 255
	ModesetMinor = 254
	UVMMajor     = 508
	CapsMajor    = 237
)

// CapMinors is the driver's fixed layout of MIG capability minors
// (/proc/driver/nvidia-caps/mig-minors): config 1, monitor 2, then per GPU
// minor 15 GPU-instance slots of one access capability and 8 compute
// instance capabilities each.
func CapMinors(gpuMinor int, gi uint32) (giMinor int, ciMinor func(ci uint32) int) {
	giMinor = 3 + gpuMinor*15*9 + int(gi)*9
	return giMinor, func(ci uint32) int { return giMinor + 1 + int(ci) }
}

// driverRoot is a directory laid out like a node with the NVIDIA driver
// installed: what nvcdi, tessera's CDI code and the model's ContainerView
// read.
type driverRoot struct {
	dir string
	// owned roots are removed when the machine shuts down.
	owned bool
}

func (r *driverRoot) remove() {
	if r.owned {
		_ = os.RemoveAll(r.dir)
	}
}

// LibDir is where the fake driver root keeps the driver's libraries.
const LibDir = "/usr/lib/x86_64-linux-gnu"

// driverLibraries are the libraries (name without .so.<version>, SONAME)
// of a driver installation that nvcdi mounts into containers.
var driverLibraries = []struct{ name, soname string }{
	{"libcuda.so", "libcuda.so.1"},
	{"libnvidia-ml.so", "libnvidia-ml.so.1"},
	{"libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"},
	{"libnvidia-nvvm.so", "libnvidia-nvvm.so.4"},
	{"libcudadebugger.so", "libcudadebugger.so.1"},
	{"libnvidia-cfg.so", "libnvidia-cfg.so.1"},
	{"libnvidia-opencl.so", "libnvidia-opencl.so.1"},
}

// driverBinaries are the driver's executables that nvcdi mounts.
var driverBinaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}

// DriverRoot returns a directory laid out as this machine's driver
// installation, created on first use and removed when the machine shuts
// down:
//
//	usr/lib/x86_64-linux-gnu/   libcuda.so.<version> (an ELF shared object
//	                            with SONAME libcuda.so.1) and the other
//	                            driver libraries, with their SONAME and .so links
//	usr/bin/                    nvidia-smi, nvidia-cuda-mps-control, … (executable)
//	dev/                        nvidia<minor>, nvidiactl, nvidia-modeset, nvidia-uvm,
//	                            nvidia-uvm-tools as character devices with the
//	                            driver's numbers (regular files without CAP_MKNOD),
//	                            dev/nvidia-caps/ empty (the driver creates
//	                            capability nodes on demand)
//	proc/devices, proc/driver/nvidia/version, proc/driver/nvidia-caps/mig-minors,
//	proc/driver/nvidia/capabilities/{mig/config,mig/monitor,gpu<N>/mig/gi<G>/access,
//	                            gpu<N>/mig/gi<G>/ci<C>/access} (kept current as
//	                            MIG instances come and go)
//	sys/bus/pci/devices/<bus>   links into sys/devices/pci<domain>:<root>/…
//
// Without CAP_MKNOD, device nodes are regular files and the process-wide
// variable __NVCT_TESTING_DEVICES_ARE_FILES=true tells nvcdi to accept them.
func (m *Mock) DriverRoot() (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.root != nil {
		return m.root.dir, nil
	}
	removeStaleRoots()
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%s-%d-", rootPrefix, m.Machine, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("fake driver root: %w", err)
	}
	r := &driverRoot{dir: dir, owned: true}
	if err := m.layOutLocked(dir); err != nil {
		r.remove()
		return "", err
	}
	m.root = r
	return dir, nil
}

// rootPrefix starts the directories DriverRoot creates:
// tessera-driver-<machine>-<pid>-<random>.
const rootPrefix = "tessera-driver-"

// removeStaleRoots removes the driver roots of processes that are gone (a
// machine that was never shut down, a killed process), so that they do
// not pile up in the temporary directory.
func removeStaleRoots() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), rootPrefix+"*"))
	for _, d := range dirs {
		parts := strings.Split(filepath.Base(d), "-")
		if len(parts) < 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[len(parts)-2])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// WriteDriverRoot lays out the machine's driver installation in dir (see
// DriverRoot) and keeps its /proc capabilities current; dir stays when the
// machine shuts down.
func (m *Mock) WriteDriverRoot(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.layOutLocked(dir); err != nil {
		return err
	}
	m.root = &driverRoot{dir: dir}
	return nil
}

func (m *Mock) layOutLocked(dir string) error {
	ver := m.driverVersion
	libDir := filepath.Join(dir, LibDir)
	binDir := filepath.Join(dir, "usr/bin")
	for _, d := range []string{libDir, binDir, filepath.Join(dir, "dev/nvidia-caps"), filepath.Join(dir, "proc/driver/nvidia-caps"),
		filepath.Join(dir, "proc/driver/nvidia/capabilities/mig"), filepath.Join(dir, "sys/bus/pci/devices")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
	}
	for _, l := range driverLibraries {
		file := l.name + "." + ver
		if err := os.WriteFile(filepath.Join(libDir, file), sharedObject(l.soname), 0o755); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
		// ldconfig's links: SONAME → file, and the development .so → SONAME
		// for libcuda and libnvidia-ml.
		links := map[string]string{l.soname: file}
		if l.name == "libcuda.so" || l.name == "libnvidia-ml.so" {
			links[l.name] = l.soname
		}
		for link, target := range links {
			if err := os.Symlink(target, filepath.Join(libDir, link)); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("fake driver root: %w", err)
			}
		}
	}
	for _, b := range driverBinaries {
		script := fmt.Sprintf("#!/bin/sh\n# %s of the modelled NVIDIA driver %s\necho \"%s: modelled driver %s\" >&2\nexit 0\n", b, ver, b, ver)
		if err := os.WriteFile(filepath.Join(binDir, b), []byte(script), 0o755); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
	}
	nodes := map[string][2]uint32{
		"dev/nvidiactl":        {NVIDIAMajor, CtlMinor},
		"dev/nvidia-modeset":   {NVIDIAMajor, ModesetMinor},
		"dev/nvidia-uvm":       {UVMMajor, 0},
		"dev/nvidia-uvm-tools": {UVMMajor, 1},
	}
	for _, g := range m.gpus {
		nodes["dev/nvidia"+strconv.Itoa(g.Minor)] = [2]uint32{NVIDIAMajor, uint32(g.Minor)}
	}
	for path, n := range nodes {
		if err := mknod(filepath.Join(dir, path), n[0], n[1]); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
	}
	files := map[string]string{
		"proc/devices":                                 fmt.Sprintf("Character devices:\n  1 mem\n%3d nvidia-frontend\n%3d nvidia-caps\n%3d nvidia-uvm\n\nBlock devices:\n  8 sd\n", NVIDIAMajor, CapsMajor, UVMMajor),
		"proc/driver/nvidia/version":                   fmt.Sprintf("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (modelled)\nGCC version:  gcc version 12.2.0\n", ver),
		"proc/driver/nvidia/capabilities/mig/config":   capFile(1, 0o400),
		"proc/driver/nvidia/capabilities/mig/monitor":  capFile(2, 0o444),
		"proc/driver/nvidia-caps/mig-minors":           m.migMinors(),
		"proc/driver/nvidia/gpus/.modelled-by-tessera": m.Machine + "\n",
	}
	for path, content := range files {
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
		if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
	}
	for _, g := range m.gpus {
		bus := strings.ToLower(strings.TrimPrefix(g.PCIBusID, "0000"))
		var b int
		_, _ = fmt.Sscanf(bus, "0000:%x:", &b)
		// Each GPU sits behind two PCIe switch levels under its own root port
		// of root complex pci0000:<bus-3>.
		root := fmt.Sprintf("pci0000:%02x", max(b-3, 0))
		devPath := filepath.Join("sys/devices", root, fmt.Sprintf("0000:%02x:01.0", max(b-3, 0)), fmt.Sprintf("0000:%02x:00.0", max(b-2, 0)), bus)
		if err := os.MkdirAll(filepath.Join(dir, devPath), 0o755); err != nil {
			return fmt.Errorf("fake driver root: %w", err)
		}
		link := filepath.Join(dir, "sys/bus/pci/devices", bus)
		if err := os.Symlink(filepath.Join("../../..", strings.TrimPrefix(devPath, "sys/")), link); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("fake driver root: %w", err)
		}
	}
	// Instances that exist already get their capability files.
	m.root = &driverRoot{dir: dir}
	for _, g := range m.gpus {
		for _, gi := range g.gis {
			m.capsChangedLocked(g, gi, nil, true)
			for _, ci := range gi.cis {
				m.capsChangedLocked(g, gi, ci, true)
			}
		}
	}
	return nil
}

func (m *Mock) migMinors() string {
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	for _, g := range m.gpus {
		for gi := uint32(0); gi < 15; gi++ {
			giMinor, ciMinor := CapMinors(g.Minor, gi)
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g.Minor, gi, giMinor)
			for ci := uint32(0); ci < 8; ci++ {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g.Minor, gi, ci, ciMinor(ci))
			}
		}
	}
	return b.String()
}

func capFile(minor int, mode os.FileMode) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode)
}

// capsChangedLocked keeps the driver root's capability files in line with
// the GPU's instances, as the driver does. Caller holds mu.
func (m *Mock) capsChangedLocked(g *GPU, gi *GpuInstance, ci *ComputeInstance, created bool) {
	if m.root == nil {
		return
	}
	giMinor, ciMinor := CapMinors(g.Minor, gi.ID)
	dir := filepath.Join(m.root.dir, "proc/driver/nvidia/capabilities", "gpu"+strconv.Itoa(g.Minor), "mig", "gi"+strconv.FormatUint(uint64(gi.ID), 10))
	path, content := filepath.Join(dir, "access"), capFile(giMinor, 0o444)
	if ci != nil {
		dir = filepath.Join(dir, "ci"+strconv.FormatUint(uint64(ci.ID), 10))
		path, content = filepath.Join(dir, "access"), capFile(ciMinor(ci.ID), 0o444)
	}
	if !created {
		_ = os.RemoveAll(dir)
		return
	}
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(path, []byte(content), 0o444)
	}
}

// mknod makes a character device, or a regular file where the process may
// not (and then tells nvcdi to accept files as device nodes).
func mknod(path string, major, minor uint32) error {
	_ = os.Remove(path)
	err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor)))
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	if err := os.WriteFile(path, []byte(fmt.Sprintf("c %d:%d\n", major, minor)), 0o666); err != nil {
		return err
	}
	devicesAreFiles.Do(func() { _ = os.Setenv("__NVCT_TESTING_DEVICES_ARE_FILES", "true") })
	return nil
}

// sharedObject returns a minimal ELF64 shared object whose dynamic section
// carries DT_SONAME, laid out as a linker lays out a library: a PT_LOAD
// segment mapping the file at address 0 and a PT_DYNAMIC segment, with
// DT_STRTAB as an address. Tools that read a library's SONAME find it there:
// debug/elf's DynString (nvcdi's symlink hooks) through the section
// headers, and ldconfig (nvidia-cdi-hook's update-ldcache, which runs the
// host's ldconfig in the container) through the program headers — without
// them ldconfig skips the file and the ldcache never lists the driver.
func sharedObject(soname string) []byte {
	const (
		ehdrSize = 64
		phdrSize = 56
		shdrSize = 64
		dynSize  = 16
	)
	dynstr := append([]byte{0}, append([]byte(soname), 0)...)
	offDynstr := uint64(ehdrSize + 2*phdrSize)
	offDyn := (offDynstr + uint64(len(dynstr)) + 7) &^ 7
	// DT_SONAME (14) → offset 1 in .dynstr, DT_STRTAB (5) at its address
	// (= its offset: the file is mapped at 0), DT_STRSZ (10), DT_NULL.
	var dyn bytes.Buffer
	for _, e := range [][2]uint64{{14, 1}, {5, offDynstr}, {10, uint64(len(dynstr))}, {0, 0}} {
		_ = binary.Write(&dyn, binary.LittleEndian, e)
	}
	shstr := []byte("\x00.dynstr\x00.dynamic\x00.shstrtab\x00")
	offShstr := offDyn + uint64(dyn.Len())
	offShdr := (offShstr + uint64(len(shstr)) + 7) &^ 7
	fileSize := offShdr + 4*shdrSize

	var b bytes.Buffer
	ident := [16]byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* LE */, 1 /* version */}
	b.Write(ident[:])
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	le(uint16(3))        // ET_DYN
	le(uint16(62))       // EM_X86_64
	le(uint32(1))        // EV_CURRENT
	le(uint64(0))        // entry
	le(uint64(ehdrSize)) // phoff
	le(offShdr)          // shoff
	le(uint32(0))        // flags
	le(uint16(ehdrSize))
	le(uint16(phdrSize))
	le(uint16(2)) // phnum
	le(uint16(shdrSize))
	le(uint16(4)) // shnum
	le(uint16(3)) // shstrndx
	segment := func(typ, flags uint32, off, size, align uint64) {
		le(typ)
		le(flags)
		le(off)  // offset
		le(off)  // vaddr
		le(off)  // paddr
		le(size) // filesz
		le(size) // memsz
		le(align)
	}
	segment(1 /* PT_LOAD */, 4 /* R */, 0, fileSize, 0x1000)
	segment(2 /* PT_DYNAMIC */, 6 /* RW */, offDyn, uint64(dyn.Len()), 8)
	pad := func(to uint64) {
		for uint64(b.Len()) < to {
			b.WriteByte(0)
		}
	}
	pad(offDynstr)
	b.Write(dynstr)
	pad(offDyn)
	b.Write(dyn.Bytes())
	pad(offShstr)
	b.Write(shstr)
	pad(offShdr)
	section := func(name, typ uint32, flags, off, size uint64, link uint32, entsize uint64) {
		le(name)
		le(typ)
		le(flags)
		if flags&2 != 0 { // ALLOC: mapped at its offset
			le(off)
		} else {
			le(uint64(0))
		}
		le(off)
		le(size)
		le(link)
		le(uint32(0)) // info
		le(uint64(1)) // addralign
		le(entsize)
	}
	section(0, 0, 0, 0, 0, 0, 0)
	section(1, 3 /* STRTAB */, 2 /* ALLOC */, offDynstr, uint64(len(dynstr)), 0, 0)
	section(9, 6 /* DYNAMIC */, 3 /* WRITE|ALLOC */, offDyn, uint64(dyn.Len()), 1, dynSize)
	section(18, 3, 0, offShstr, uint64(len(shstr)), 0, 0)
	return b.Bytes()
}
