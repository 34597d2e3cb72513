package realnode

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

func attr(name resourceapi.QualifiedName) string {
	return fmt.Sprintf("device.attributes[%q].%s", contract.DriverName, name)
}

// checkDevices compares the NVIDIA device nodes the container lists and the
// ones containerd put in its runtime spec with want.
func (e *env) checkDevices(pod *corev1.Pod, r report, want map[string]string) {
	e.t.Helper()
	if d := diffMaps(r.devices, want); d != "" {
		e.t.Errorf("device nodes in the container: %s", d)
	}
	if d := diffMaps(e.containerSpec(pod).nvidiaDevices(), want); d != "" {
		e.t.Errorf("device nodes in the runtime spec: %s", d)
	}
}

// deleteAndCheckUnprepared deletes the pod and waits until the kubelet has
// unprepared its claim: tessera-node's checkpoint no longer holds it, its
// CDI spec is gone and no device of kind is prepared (the test's other
// claims are of other kinds).
func (e *env) deleteAndCheckUnprepared(pod *corev1.Pod, claim *resourceapi.ResourceClaim, kind string) {
	e.t.Helper()
	e.deletePod(pod)
	e.waitFor("claim "+claim.Name+" unprepared", time.Minute, func(context.Context) (bool, error) {
		_, held := e.checkpoint()[claim.UID]
		return !held && !e.hasSpec(claim) && e.preparedDevices(e.node.Plugin, kind) == 0, nil
	})
}

// TestWholeGPU: a pod with a whole GPU gets exactly that GPU's device node
// and the control nodes, the driver (checkDriver) and the base spec's
// environment alone; deleting the pod unprepares the claim.
func TestWholeGPU(t *testing.T) {
	e := newEnv(t)
	claim := e.claim("whole", request{class: contract.ClassGPU, selector: attr(contract.AttrIndex) + " == 3"})
	pod, claim := e.schedule(e.pod("whole", claim.Name, reportScript), claim, nil)
	e.waitRunning(pod)
	r := e.readReport(pod)
	e.checkDevices(pod, r, withControlNodes(map[string]string{"/dev/nvidia3": devnum(nvmlbackend.NVIDIAMajor, 3)}))
	e.checkDriver(pod, r)
	if d := diffMaps(r.nvidiaEnv(), e.commonEnv()); d != "" {
		t.Errorf("NVIDIA environment of a whole GPU (want the base spec's alone): %s", d)
	}
	if got := e.preparedDevices(e.node.Plugin, "gpu"); got != 1 {
		t.Errorf("prepared whole GPUs: %d, want 1", got)
	}
	e.deleteAndCheckUnprepared(pod, claim, "gpu")
}

// TestMIGDevice: a pod with a MIG device gets the parent GPU's node and the
// capability nodes of exactly the GPU and compute instance tessera-node
// created for it (at the allocated placement), and nothing else, plus the
// driver; deleting the pod destroys the instance.
func TestMIGDevice(t *testing.T) {
	e := newEnv(t)
	claim := e.claim("mig", request{class: contract.ClassMIG, selector: attr(contract.AttrProfile) + ` == "1g.10gb"`})
	pod, claim := e.schedule(e.pod("mig", claim.Name, reportScript), claim, e.allocationAt(claim, 3))
	e.waitRunning(pod)
	r := e.readReport(pod)

	device := claim.Status.Allocation.Devices.Results[0].Device
	rec := e.checkpoint()[claim.UID]
	if rec == nil || rec.State != checkpoint.PrepareCompleted || len(rec.Devices) != 1 || rec.Devices[0].MIG == nil {
		t.Fatalf("checkpoint record of %s: %+v", claim.Name, rec)
	}
	mig := rec.Devices[0].MIG
	if mig.Start != 3 || mig.Profile != "1g.10gb" || !mig.Created || rec.Devices[0].Device != device {
		t.Errorf("MIG instance %+v for device %s, want 1g.10gb created at placement 3", mig, device)
	}
	// The driver's capability minors (/proc/driver/nvidia-caps/mig-minors)
	// with the nvidia-caps major of /proc/devices.
	gi, ci := nvmlbackend.CapMinors(mig.ParentMinor, mig.GIID)
	gpuNode := "/dev/nvidia" + strconv.Itoa(mig.ParentMinor)
	want := withControlNodes(map[string]string{
		gpuNode: devnum(nvmlbackend.NVIDIAMajor, mig.ParentMinor),
		"/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(gi):           devnum(nvmlbackend.CapsMajor, gi),
		"/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(ci(mig.CIID)): devnum(nvmlbackend.CapsMajor, ci(mig.CIID)),
	})
	if !strings.HasPrefix(device, "gpu-"+strconv.Itoa(mig.ParentMinor)+"-mig-1g-10gb-3") {
		t.Errorf("allocated device %s is not 1g.10gb at placement 3 of GPU %d", device, mig.ParentMinor)
	}
	e.checkDevices(pod, r, want)
	e.checkDriver(pod, r)
	if d := diffMaps(r.nvidiaEnv(), e.commonEnv()); d != "" {
		t.Errorf("NVIDIA environment of a MIG device without MPS (want the base spec's alone): %s", d)
	}
	if got := e.preparedDevices(e.node.Plugin, "mig"); got != 1 {
		t.Errorf("prepared MIG devices: %d, want 1", got)
	}
	e.deleteAndCheckUnprepared(pod, claim, "mig")
}

// TestMPSShare: a pod with a share of a GPU gets that GPU's node, the driver, an MPS
// client environment that only points at the daemon (the limits of what its claim
// consumed are the daemon's, where the tenant cannot lift them), and the pipe
// directory of its claim's own MPS control daemon mounted at /tmp/nvidia-mps, where it
// sees the daemon's control pipe; deleting the pod stops the daemon.
func TestMPSShare(t *testing.T) {
	e := newEnv(t)
	claim := e.claim("share", request{class: contract.ClassShared, selector: attr(contract.AttrIndex) + " == 2", memory: "10Gi", compute: "25"})
	pod, claim := e.schedule(e.pod("share", claim.Name, reportScript), claim, nil)
	e.waitRunning(pod)
	r := e.readReport(pod)

	e.checkDevices(pod, r, withControlNodes(map[string]string{"/dev/nvidia2": devnum(nvmlbackend.NVIDIAMajor, 2)}))
	e.checkDriver(pod, r)
	wantEnv := e.commonEnv()
	wantEnv["CUDA_MPS_PIPE_DIRECTORY"] = "/tmp/nvidia-mps"
	if d := diffMaps(r.nvidiaEnv(), wantEnv); d != "" {
		t.Errorf("MPS environment in the container: %s", d)
	}
	uuid := *e.sliceDevice("gpu-2-shared").Attributes[contract.AttrUUID].StringValue
	pipeDir := filepath.Join(e.node.MPSDir(), "claims", string(claim.UID), "pipe")
	spec := e.containerSpec(pod)
	var mounted bool
	for _, m := range spec.Mounts {
		if m.Destination == "/tmp/nvidia-mps" {
			mounted = m.Source == pipeDir
			if !mounted {
				t.Errorf("/tmp/nvidia-mps is mounted from %s, want the daemon's pipe directory %s", m.Source, pipeDir)
			}
		}
	}
	if !mounted {
		t.Errorf("runtime spec has no mount at /tmp/nvidia-mps: %+v", spec.Mounts)
	}
	if _, ok := r.mounts["/tmp/nvidia-mps"]; !ok {
		t.Errorf("the container has no mount at /tmp/nvidia-mps")
	}
	if !hasFIFO(r.mps) {
		t.Errorf("the container does not see the MPS daemon's control pipe: %q", r.mps)
	}
	calls := strings.Join(e.node.ToolCalls(), "\n")
	if !strings.Contains(calls, "nvidia-cuda-mps-control -d | visible="+uuid) {
		t.Errorf("no MPS control daemon was started for %s; tool calls:\n%s", uuid, calls)
	}
	if !strings.Contains(calls, "limits=mem:0=10240M,threads:25") {
		t.Errorf("the MPS control daemon did not start with the claim's limits (10Gi, 25%%); tool calls:\n%s", calls)
	}
	e.deleteAndCheckUnprepared(pod, claim, "shared")
	calls = strings.Join(e.node.ToolCalls(), "\n")
	if !strings.Contains(calls, "stdin=quit") {
		t.Errorf("the MPS daemon was not stopped after its last client; tool calls:\n%s", calls)
	}
}

// hasFIFO reports whether an `ls -l` listing holds a named pipe "control".
func hasFIFO(ls []string) bool {
	for _, l := range ls {
		if strings.HasPrefix(l, "p") && strings.HasSuffix(l, " control") {
			return true
		}
	}
	return false
}
