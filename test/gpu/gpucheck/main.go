// Command gpucheck is the read-only real-GPU check of tessera (run by
// test/gpu/check.sh on a node with NVIDIA GPUs): it discovers the GPUs
// through the real NVML, compares every GPU with tessera's model of its
// product (profiles, placements, memory, SMs, engines, instance counts),
// prints the ResourceSlices tessera would publish for whole, dynamic-MIG
// and static-MIG GPUs, and generates the CDI specs from the real driver
// root with the NVIDIA container toolkit's nvcdi, validated by the CDI
// library.
//
// It only reads: NVML queries, files of the driver root, and specs written
// to a temporary directory (never /var/run/cdi). It never changes MIG mode,
// compute mode, clocks or MIG instances and never resets a GPU. The exit
// status is 1 when a GPU differs from its model or a spec does not
// validate.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/nodeagent/discovery"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
	"github.com/tessera-gpu/tessera/test/gpu/modelcheck"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout))
}

func run(ctx context.Context, args []string, out io.Writer) int {
	fs := flag.NewFlagSet("gpucheck", flag.ContinueOnError)
	fs.SetOutput(out)
	backend := fs.String("backend", nvmlbackend.Real, "NVML backend (a mock: to test the check itself)")
	driverRoot := fs.String("driver-root", "", "where the NVIDIA driver is installed (default: / for the real library, a mock's own)")
	hook := fs.String("nvidia-cdi-hook-path", cdi.DefaultHookPath, "host path of nvidia-cdi-hook")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	failed := false
	fail := func(format string, a ...any) {
		failed = true
		fmt.Fprintf(out, "FAIL: "+format+"\n", a...)
	}

	lib, err := nvmlbackend.Open(*backend)
	if err != nil {
		fmt.Fprintf(out, "FAIL: %v\n", err)
		return 1
	}
	defer lib.Shutdown()
	roots, err := nvmlbackend.RootsOf(lib)
	if err != nil {
		fmt.Fprintf(out, "FAIL: %v\n", err)
		return 1
	}
	if *driverRoot != "" {
		roots.Driver, roots.Dev = *driverRoot, "/"
		if _, err := os.Stat(filepath.Join(*driverRoot, "dev/nvidiactl")); err == nil {
			roots.Dev = *driverRoot
		}
	}

	fmt.Fprintln(out, "== Model comparison (NVIDIA's tables as tessera models them)")
	reports, err := modelcheck.Check(lib)
	if err != nil {
		fail("%v", err)
	}
	for _, r := range reports {
		fmt.Fprint(out, r)
		if !r.OK() {
			failed = true
		}
	}

	fmt.Fprintln(out, "\n== Discovery")
	node, err := discovery.DiscoverWith(ctx, lib, discovery.Options{SysRoot: roots.Sys})
	if err != nil {
		fail("discovery: %v", err)
		return 1
	}
	fmt.Fprintf(out, "driver %s, CUDA %s, %d GPUs, %d unavailable\n", node.DriverVersion, node.CUDADriverVersion, len(node.GPUs), len(node.Unavailable))
	for _, u := range node.Unavailable {
		fail("GPU %d does not answer: %v", u.Index, u.Err)
	}
	for _, g := range node.GPUs {
		fmt.Fprintf(out, "GPU %d %s %s bus %s pcieRoot %q memory %d MiB SMs %d MIG capable %v enabled %v\n  profiles %s\n",
			g.Index, g.ProductName, g.UUID, g.PCIBusID, g.PCIeRoot, g.MemoryBytes>>20, g.Multiprocessors, g.MigCapable, g.MigEnabled, strings.Join(g.ProfileNames(), " "))
		for _, in := range g.MigInstances {
			fmt.Fprintf(out, "  instance %s at %d (GPU instance %d, compute instance %d) %s\n", in.Profile, in.Placement.Start, in.GIID, in.CIID, in.UUID)
		}
	}

	fmt.Fprintln(out, "\n== ResourceSlices tessera would publish (nothing is published)")
	for _, mode := range []partition.Mode{partition.ModeWhole, partition.ModeDynamicMIG, partition.ModeStaticMIG} {
		cfg, err := partition.Parse([]byte(fmt.Sprintf("default: {gpus: [{mode: %s}]}", mode)))
		if err != nil {
			fail("%v", err)
			continue
		}
		plan, err := partition.Resolve(cfg, nil, node)
		if err != nil {
			fmt.Fprintf(out, "%s: not possible here: %v\n", mode, err)
			continue
		}
		res := slices.Build(slices.Input{Node: node, Plan: plan, Features: slices.AllFeatures})
		fmt.Fprintf(out, "%s: %d slices, %d whole, %d MIG, %d shared devices\n", mode, len(res.Pool.Slices), res.Counts.Whole, res.Counts.MIG, res.Counts.Shared)
	}

	fmt.Fprintln(out, "\n== CDI from the driver root", roots.Driver)
	driver, err := cdi.NewDriver(cdi.DriverOptions{NVML: lib, DriverRoot: roots.Driver, DevRoot: roots.Dev, ProcRoot: roots.Proc, HookPath: *hook})
	if err != nil {
		fail("%v", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "gpucheck-cdi-")
	if err != nil {
		fail("%v", err)
		return 1
	}
	defer os.RemoveAll(dir)
	w, err := cdi.NewWriter(dir)
	if err != nil {
		fail("%v", err)
		return 1
	}
	common, err := driver.Common()
	if err != nil {
		fail("%v", err)
		return 1
	}
	baseID, err := w.WriteBase(common)
	if err != nil {
		fail("%v", err)
	}
	fmt.Fprintf(out, "driver %s: %d mounts, %d hooks, %d device nodes in the common edits\n", driver.Version(), len(common.Mounts), len(common.Hooks), len(common.DeviceNodes))
	var devices []cdi.Device
	for _, g := range node.GPUs {
		if g.MigEnabled {
			for _, in := range g.MigInstances {
				e, err := driver.MIG(g.UUID, g.Minor, uint32(in.GIID), uint32(in.CIID))
				if err != nil {
					fail("MIG device %s@%d of GPU %d: %v", in.Profile, in.Placement.Start, g.Index, err)
					continue
				}
				devices = append(devices, cdi.Device{Name: devicename.MIG(g.Minor, in.Profile, in.Placement.Start), Edits: e})
			}
			continue
		}
		e, err := driver.GPU(g.UUID)
		if err != nil {
			fail("GPU %d: %v", g.Index, err)
			continue
		}
		devices = append(devices, cdi.Device{Name: devicename.GPU(g.Minor), Edits: e})
	}
	ids, err := w.Write(types.UID("gpucheck"), []byte("{}"), devices)
	if err != nil {
		fail("%v", err)
		return 1
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		fail("%v", err)
		return 1
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			fail("spec %s: %v", path, e)
		}
	}
	for i, id := range ids {
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := cache.InjectDevices(spec, baseID, id); err != nil {
			fail("inject %s: %v", id, err)
			continue
		}
		var nodes []string
		for _, d := range spec.Linux.Devices {
			nodes = append(nodes, fmt.Sprintf("%s(%s %d:%d)", d.Path, d.Type, d.Major, d.Minor))
		}
		fmt.Fprintf(out, "%s: validates; a container gets %d mounts, %d hooks, devices %s\n", devices[i].Name, len(spec.Mounts), len(spec.Hooks.CreateContainer), strings.Join(nodes, " "))
		if m, ok := lib.(*nvmlbackend.Mock); ok {
			fmt.Fprintf(out, "  the model says it sees %v %v\n", m.ContainerView(spec).UUIDs(), m.ContainerView(spec).Problems)
		}
	}
	if failed {
		fmt.Fprintln(out, "\nRESULT: FAIL")
		return 1
	}
	fmt.Fprintln(out, "\nRESULT: OK")
	return 0
}
