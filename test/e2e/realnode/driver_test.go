package realnode

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// The driver files and hooks of tessera-node's base CDI spec (nvcdi's
// common edits of the mock machine's driver installation), as a container
// really gets them: runc bind-mounts the files and runs the hooks of the
// NVIDIA container toolkit's nvidia-cdi-hook, built at the toolkit version
// of go.mod.

// libDir is where the driver's libraries are, on the host and in containers.
const libDir = nvmlbackend.LibDir

// controlNodes are the device nodes of the base spec's "common" device,
// which every GPU container gets, with the modelled driver's numbers.
var controlNodes = map[string]string{
	"/dev/nvidiactl":        devnum(nvmlbackend.NVIDIAMajor, nvmlbackend.CtlMinor),
	"/dev/nvidia-modeset":   devnum(nvmlbackend.NVIDIAMajor, nvmlbackend.ModesetMinor),
	"/dev/nvidia-uvm":       devnum(nvmlbackend.UVMMajor, 0),
	"/dev/nvidia-uvm-tools": devnum(nvmlbackend.UVMMajor, 1),
}

func devnum(major, minor int) string { return strconv.Itoa(major) + ":" + strconv.Itoa(minor) }

func withControlNodes(m map[string]string) map[string]string {
	for k, v := range controlNodes {
		m[k] = v
	}
	return m
}

// baseSpec reads tessera-node's base CDI spec.
func (e *env) baseSpec() *cdispec.Spec {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.node.CDIDir(), "k8s.gpu.tessera.dev-driver.json"))
	if err != nil {
		e.t.Fatalf("base CDI spec: %v", err)
	}
	var spec cdispec.Spec
	if err := yaml.Unmarshal(data, &spec); err != nil {
		e.t.Fatalf("base CDI spec: %v", err)
	}
	return &spec
}

// commonEnv is the environment the base spec gives every GPU container.
func (e *env) commonEnv() map[string]string {
	out := map[string]string{}
	for _, kv := range e.baseSpec().ContainerEdits.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// checkDriver checks what the container got of the driver: every library
// and binary of the base spec with the driver root's exact content; for
// every library the SONAME link (libcuda.so.1 → libcuda.so.<version>) and
// the development links that the create-symlinks hook made
// (libcuda.so → libcuda.so.1); an ldcache that update-ldcache built with the
// host's ldconfig in the container, listing every library by its SONAME;
// nvidia-smi that runs; the control device nodes as character devices runc
// made from the spec's numbers, where the host has none.
func (e *env) checkDriver(pod *corev1.Pod, r report) {
	e.t.Helper()
	spec := e.baseSpec()

	// The hooks are nvidia-cdi-hook's, at the path the node built it, and
	// all of them ran: a hook that fails stops the container from starting.
	var hooks []string
	links := map[string]string{} // create-symlinks: link → target
	for _, h := range spec.ContainerEdits.Hooks {
		if h.Path != e.node.HookPath() || h.HookName != "createContainer" || len(h.Args) < 2 {
			e.t.Errorf("hook %s %v: want a createContainer hook running %s", h.Path, h.Args, e.node.HookPath())
			continue
		}
		hooks = append(hooks, h.Args[1])
		if h.Args[1] == "create-symlinks" {
			for i, a := range h.Args {
				if a == "--link" && i+1 < len(h.Args) {
					target, link, _ := strings.Cut(h.Args[i+1], "::")
					links[link] = target
				}
			}
		}
	}
	for _, want := range []string{"create-symlinks", "update-ldcache", "enable-cuda-compat", "disable-device-node-modification"} {
		if !slices.Contains(hooks, want) {
			e.t.Errorf("base spec has no %s hook: %v", want, hooks)
		}
	}

	// Files: exactly the driver root's.
	var libs []string // container paths of the libraries
	for _, m := range spec.ContainerEdits.Mounts {
		if !strings.HasPrefix(m.ContainerPath, libDir+"/") && !strings.HasPrefix(m.ContainerPath, "/usr/bin/") {
			continue
		}
		if root := filepath.Join(e.node.Dir(), "driver-root") + "/"; !strings.HasPrefix(m.HostPath, root) {
			e.t.Errorf("mount %s comes from %s, not from a tessera-node's driver root under %s", m.ContainerPath, m.HostPath, root)
		}
		if got, want := r.files[m.ContainerPath], fileSum(e, m.HostPath); got != want {
			e.t.Errorf("%s in the container: sha256 %q, want the driver's %s (%s)", m.ContainerPath, got, want, m.HostPath)
		}
		if strings.Contains(filepath.Base(m.ContainerPath), ".so.") {
			libs = append(libs, m.ContainerPath)
			soname := soname(e, m.HostPath)
			link := filepath.Join(filepath.Dir(m.ContainerPath), soname)
			if got := r.links[link]; got != filepath.Base(m.ContainerPath) {
				e.t.Errorf("SONAME link %s in the container points to %q, want %s", link, got, filepath.Base(m.ContainerPath))
			}
		}
	}
	ver := e.driverVersion()
	for _, want := range []string{libDir + "/libcuda.so." + ver, libDir + "/libnvidia-ml.so." + ver, "/usr/bin/nvidia-smi"} {
		if _, ok := r.files[want]; !ok {
			e.t.Errorf("the container has no %s; driver files: %v", want, keys(r.files))
		}
	}
	if len(links) == 0 {
		e.t.Error("the create-symlinks hook names no links")
	}
	for link, target := range links {
		if got := r.links[link]; got != target {
			e.t.Errorf("create-symlinks: %s -> %q in the container, want %s", link, got, target)
		}
	}
	for _, dev := range []string{libDir + "/libcuda.so", libDir + "/libnvidia-ml.so"} {
		if r.links[dev] == "" {
			e.t.Errorf("the container has no development link %s", dev)
		}
	}

	// The ldcache lists every library by its SONAME, as ldconfig found it.
	cache, err := parseLDCache(r.ldcache)
	if err != nil {
		e.t.Errorf("/etc/ld.so.cache in the container (update-ldcache): %v; ld.so.conf: %v", err, r.ldconf)
	}
	for _, lib := range libs {
		host := hostPathOf(spec, lib)
		want := filepath.Join(filepath.Dir(lib), soname(e, host))
		if got := cache[soname(e, host)]; !slices.Contains(got, want) {
			e.t.Errorf("ldcache: %s => %v, want %s (cache: %v)", soname(e, host), got, want, cache)
		}
	}

	var cached []string
	for _, lib := range libs {
		so := soname(e, hostPathOf(spec, lib))
		cached = append(cached, so+" => "+strings.Join(cache[so], ","))
	}
	e.t.Logf("%s got %d driver files, %d links, hooks %v; its ldcache: %s", pod.Name, len(r.files), len(r.links), hooks, strings.Join(cached, "; "))

	// The driver's nvidia-smi runs in the container.
	if !slices.Contains(r.smi, "exit 0") || !strings.Contains(strings.Join(r.smi, "\n"), "modelled driver "+ver) {
		e.t.Errorf("nvidia-smi in the container: %q", r.smi)
	}

	// Device nodes: character devices made by runc from the spec's numbers;
	// the host needs none (this machine has no NVIDIA driver).
	for path := range controlNodes {
		if got := r.devTypes[path]; got != "character special file" {
			e.t.Errorf("%s in the container is %q, want a character device", path, got)
		}
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); errors.Is(err, os.ErrNotExist) {
		for path := range controlNodes {
			if _, err := os.Lstat(path); err == nil {
				e.t.Errorf("the host has %s without an NVIDIA driver: the test would not show that runc made the node", path)
			}
		}
	}
}

// driverVersion is the mock machine's driver version, from its libcuda.
func (e *env) driverVersion() string {
	e.t.Helper()
	for _, m := range e.baseSpec().ContainerEdits.Mounts {
		if v, ok := strings.CutPrefix(filepath.Base(m.ContainerPath), "libcuda.so."); ok {
			return v
		}
	}
	e.t.Fatal("the base spec mounts no libcuda.so.<version>")
	return ""
}

func hostPathOf(spec *cdispec.Spec, containerPath string) string {
	for _, m := range spec.ContainerEdits.Mounts {
		if m.ContainerPath == containerPath {
			return m.HostPath
		}
	}
	return ""
}

func fileSum(e *env, path string) string {
	e.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// soname reads a library's DT_SONAME.
func soname(e *env, path string) string {
	e.t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		e.t.Fatalf("library %s: %v", path, err)
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) != 1 {
		e.t.Fatalf("SONAME of %s: %v %v", path, names, err)
	}
	return names[0]
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// parseLDCache decodes glibc's ld.so.cache (the "glibc-ld.so.cache1.1"
// format that ldconfig has written alone since glibc 2.32) into SONAME →
// paths.
func parseLDCache(b64 string) (map[string][]string, error) {
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("not base64: %w", err)
	}
	const magic = "glibc-ld.so.cache1.1"
	if len(data) == 0 {
		return nil, errors.New("empty or missing")
	}
	if !bytes.HasPrefix(data, []byte(magic)) || len(data) < 48 {
		return nil, fmt.Errorf("not a %s file (%d bytes)", magic, len(data))
	}
	n := binary.LittleEndian.Uint32(data[20:])
	str := func(off uint32) string {
		if int(off) >= len(data) {
			return ""
		}
		end := bytes.IndexByte(data[off:], 0)
		if end < 0 {
			return ""
		}
		return string(data[off : int(off)+end])
	}
	out := map[string][]string{}
	for i := range n {
		entry := 48 + int(i)*24
		if entry+24 > len(data) {
			return nil, fmt.Errorf("truncated at entry %d of %d", i, n)
		}
		key, value := binary.LittleEndian.Uint32(data[entry+4:]), binary.LittleEndian.Uint32(data[entry+8:])
		out[str(key)] = append(out[str(key)], str(value))
	}
	return out, nil
}
