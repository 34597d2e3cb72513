package realnode

import (
	"fmt"
	"testing"

	"github.com/tessera-gpu/tessera/contract"
)

// controlNodes are in every claim's CDI spec (draplugin/cdi), with the
// stand-in numbers of test/realnode.
var controlNodes = map[string]string{
	"/dev/nvidiactl":        "195:255",
	"/dev/nvidia-uvm":       "510:0",
	"/dev/nvidia-uvm-tools": "510:1",
}

func withControlNodes(m map[string]string) map[string]string {
	for k, v := range controlNodes {
		m[k] = v
	}
	return m
}

// TestWholeGPU: a pod with a whole GPU gets exactly that GPU's device node
// and the control nodes, and no NVIDIA environment.
func TestWholeGPU(t *testing.T) {
	e := newEnv(t)
	claim := e.claim("whole", request{class: contract.ClassGPU, selector: fmt.Sprintf(`device.attributes[%q].index == 3`, contract.DriverName)})
	pod, claim := e.schedule(e.pod("whole", claim.Name, reportScript), claim, nil)
	e.waitRunning(pod)
	r := e.readReport(pod)
	want := withControlNodes(map[string]string{"/dev/nvidia3": "195:3"})
	if d := diffMaps(r.devices, want); d != "" {
		t.Errorf("device nodes in the container: %s", d)
	}
	if d := diffMaps(e.containerSpec(pod).nvidiaDevices(), want); d != "" {
		t.Errorf("device nodes in the runtime spec: %s", d)
	}
	if env := r.nvidiaEnv(); len(env) != 0 {
		t.Errorf("NVIDIA environment of a whole GPU: %v, want none", env)
	}
	t.Logf("claim %s: %v", claim.Name, claim.Status.Allocation.Devices.Results)
}
