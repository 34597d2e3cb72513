package draplugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/nodeagent/agent"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/nodeagent/slices"
	"github.com/tessera-gpu/tessera/test/framework"
)

const onGPU0 = `device.attributes["gpu.tessera.dev"].index == 0`

// TestWholeGPUOnDynamicMIG: a dynamic-MIG GPU's MIG mode follows its
// claims. Given the whole GPU after MIG devices were used, the plugin turns
// MIG mode off, and the container sees the whole GPU; given a MIG device
// afterwards it turns MIG mode on, and the container sees exactly that
// instance.
func TestWholeGPUOnDynamicMIG(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	gpu := e.lib.GPUs()[0]

	prepareOne := func(c *resourceapi.ResourceClaim) []string {
		t.Helper()
		r := k.prepare(t, e.ctx, c)[string(c.UID)]
		if r.Error != "" || len(r.Devices) != 1 {
			t.Fatalf("prepare %s: %+v", c.Name, r)
		}
		return r.Devices[0].CdiDeviceIds
	}
	done := func(c *resourceapi.ResourceClaim) {
		t.Helper()
		if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
			t.Fatal(r.Error)
		}
		e.release(c)
	}

	first := e.claim("mig-first", []request{{name: "mig", class: "mig", selector: onGPU0 + ` && device.attributes["gpu.tessera.dev"].profile == "1g.10gb"`}})
	prepareOne(first)
	if !gpu.MIGMode().Current {
		t.Fatal("a MIG device was prepared on a GPU in MIG mode off")
	}
	done(first)

	whole := e.claim("whole", []request{{name: "gpu", class: "gpu", selector: onGPU0}})
	ids := prepareOne(whole)
	if st := gpu.MIGMode(); st.Current || st.Pending {
		t.Fatalf("MIG mode %+v with the whole GPU prepared", st)
	}
	if v := e.containerView(ids...); !reflect.DeepEqual(v.UUIDs(), []string{gpu.UUID}) || len(v.Problems) != 0 {
		t.Fatalf("a container given the whole GPU sees %+v", v)
	}
	done(whole)

	second := e.claim("mig-second", []request{{name: "mig", class: "mig", selector: onGPU0 + ` && device.attributes["gpu.tessera.dev"].profile == "3g.40gb"`}})
	ids = prepareOne(second)
	in := gpu.Instances()
	if !gpu.MIGMode().Current || len(in) != 1 {
		t.Fatalf("MIG mode %+v, instances %v", gpu.MIGMode(), in)
	}
	if v := e.containerView(ids...); !reflect.DeepEqual(v.UUIDs(), []string{in[0].UUID}) {
		t.Fatalf("a container given the 3g.40gb device sees %+v, want only %s", v, in[0].UUID)
	}
	done(second)
}

// nodeEvents waits for events of a reason on the node and returns their messages.
func (e *env) nodeEvents(reason string) []string {
	e.t.Helper()
	var out []string
	_ = wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := e.client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + e.nodeName + ",reason=" + reason})
		if err != nil {
			return false, err
		}
		out = nil
		for _, ev := range list.Items {
			out = append(out, ev.Message)
		}
		return len(out) > 0, nil
	})
	return out
}

// TestMIGModeChangeNeedsReset: on a GPU that a process holds, turning MIG
// mode on would need a GPU reset. The prepare fails saying so, no pending
// change is left, and the node agent stops publishing that GPU's MIG
// devices (its whole device stays).
func TestMIGModeChangeNeedsReset(t *testing.T) {
	e := newEnv(t)
	e.start()
	gpu := e.lib.GPUs()[1]
	_ = e.lib.HoldGPU(gpu.UUID, 1) // nvidia-persistenced
	c := e.claim("mig", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 1`}})
	k := e.kubelet()
	r := k.prepare(t, e.ctx, c)[string(c.UID)]
	if !strings.Contains(r.Error, "needs a GPU reset") {
		t.Fatalf("prepare: %+v, want the reset explained", r)
	}
	if st := gpu.MIGMode(); st.Current || st.Pending {
		t.Fatalf("MIG mode %+v left behind", st)
	}
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		migs, whole := 0, 0
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				if s.Spec.Pool.Name != e.nodeName || (contract.StringAttr(&d, contract.AttrUUID) != gpu.UUID && contract.StringAttr(&d, contract.AttrParentUUID) != gpu.UUID) {
					continue
				}
				switch contract.TypeOf(&d) {
				case contract.TypeMIG:
					migs++
				case contract.TypeGPU:
					whole++
				}
			}
		}
		return migs == 0 && whole == 1, nil
	})
	if err != nil {
		t.Fatal("GPU 1's MIG devices are still published")
	}
	if ev := e.nodeEvents("MIGModeNeedsReset"); len(ev) == 0 || !strings.Contains(ev[0], gpu.UUID) {
		t.Fatalf("events %q", ev)
	}
}

// TestStaticMIGAcrossRestarts: a node whose GPU 0 has a static layout and
// whose GPU 1 has an administrator's instance; tessera-node (agent and
// plugin) restarts three times: the instances and the published MIG UUIDs
// stay the same, and a claim on a static device neither creates nor
// destroys an instance.
func TestStaticMIGAcrossRestarts(t *testing.T) {
	e := newEnv(t) // directories, classes and fakes; its own node is unused
	e.nodeName = framework.UniqueName("node")
	if _, err := e.client.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.CoreV1().Nodes().Delete(context.Background(), e.nodeName, metav1.DeleteOptions{}) })
	lib, err := nvmlbackend.NewMock("dgxh100", 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	e.lib = lib
	admin := lib.GPUs()[1]
	_ = admin.EnableMIG()
	if _, err := admin.CreateInstance("4g.40gb", 0); err != nil {
		t.Fatal(err)
	}
	cfg, err := partition.Parse([]byte(`
default:
  gpus:
  - indices: [0]
    mode: staticMIG
    layout: [{profile: 3g.40gb, start: 0}, {profile: 2g.20gb}, {profile: 1g.10gb}]
  - indices: [1]
    mode: staticMIG
`))
	if err != nil {
		t.Fatal(err)
	}
	features := slices.AllFeatures
	run := func() (stop func()) {
		t.Helper()
		a, err := agent.New(agent.Options{KubeClient: e.client, NodeName: e.nodeName, NVML: lib, Config: cfg, Features: &features,
			Components: []agent.Component{Component(e.options())}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		e.agent = a
		waitPublished(t, e)
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("tessera-node: %v", err)
			}
		}
	}
	state := func() (instances string, published map[string]string) {
		t.Helper()
		instances = fmt.Sprint(lib.GPUs()[0].Instances(), lib.GPUs()[1].Instances())
		published = map[string]string{}
		list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			if s.Spec.Pool.Name != e.nodeName {
				continue
			}
			for _, d := range s.Spec.Devices {
				published[d.Name] = contract.StringAttr(&d, contract.AttrUUID)
			}
		}
		return instances, published
	}

	stop := run()
	wantInstances, wantPublished := state()
	if len(lib.GPUs()[0].Instances()) != 3 || len(wantPublished) != 4 {
		t.Fatalf("first start: instances %s, published %v", wantInstances, wantPublished)
	}
	for i := 0; i < 3; i++ {
		stop()
		stop = run()
		if inst, pub := state(); inst != wantInstances || !reflect.DeepEqual(pub, wantPublished) {
			t.Fatalf("restart %d: instances %s, published %v; want %s, %v", i+1, inst, pub, wantInstances, wantPublished)
		}
	}
	k := e.kubelet()
	c := e.claim("static", []request{{name: "mig", class: "mig", selector: onGPU0 + ` && device.attributes["gpu.tessera.dev"].profile == "3g.40gb"`}})
	r := k.prepare(t, e.ctx, c)[string(c.UID)]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	if inst, _ := state(); inst != wantInstances {
		t.Fatalf("prepare of a static device changed the instances: %s", inst)
	}
	if v := e.containerView(r.Devices[0].CdiDeviceIds...); !reflect.DeepEqual(v.UUIDs(), []string{wantPublished[r.Devices[0].DeviceName]}) {
		t.Fatalf("a container given %s sees %+v", r.Devices[0].DeviceName, v)
	}
	if r := k.unprepare(t, e.ctx, c)[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if inst, _ := state(); inst != wantInstances {
		t.Fatalf("unprepare of a static device changed the instances: %s", inst)
	}
	stop()
}

// orphanSetup prepares a MIG claim on GPU 1 and then loses the claim's
// checkpoint record (the checkpoint is rewritten without it), so that only
// its CDI spec says tessera created the instance.
func orphanSetup(t *testing.T, e *env, name string) nvmlbackend.Instance {
	t.Helper()
	p := e.start()
	c := e.claim(name, []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 1`}})
	if res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	p.Stop()
	empty := checkpoint.NewData()
	if err := checkpoint.Write(filepath.Join(e.pluginDir, "checkpoint.json"), e.bootID, &empty); err != nil {
		t.Fatal(err)
	}
	in := e.lib.GPUs()[1].Instances()
	if len(in) != 1 {
		t.Fatalf("setup: %v", in)
	}
	return in[0]
}

// TestOrphanMIG: an instance tessera created that no claim holds is
// destroyed (default) or kept (--orphan-mig=keep), with an event; an
// administrator's instance is never destroyed, and reported under
// --orphan-mig=report.
func TestOrphanMIG(t *testing.T) {
	e := newEnv(t)
	orphanSetup(t, e, "kept")
	p := e.start(func(o *Options) { o.OrphanMIG = OrphanKeep })
	p.Stop()
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("keep: instances %v", got)
	}
	if ev := e.nodeEvents("OrphanMIGKept"); len(ev) == 0 || !strings.Contains(ev[0], "created by tessera") {
		t.Fatalf("keep: events %q", ev)
	}
	// The kept instance's record went with its spec: it is now unknown.
	for _, g := range e.lib.GPUs() {
		_ = e.lib.ResetGPU(g.UUID)
	}
	orphanSetup(t, e, "destroyed")
	e.createStaticMIG(0, "1g.10gb", 6) // an administrator's
	e.start(func(o *Options) { o.OrphanMIG = OrphanReport }).Stop()
	if len(e.lib.GPUs()[1].Instances()) != 1 || len(e.lib.GPUs()[0].Instances()) != 1 {
		t.Fatalf("report destroyed something: %v", e.migInstances())
	}
	if ev := e.nodeEvents("ForeignMIGFound"); len(ev) == 0 || !strings.Contains(ev[0], "not created by tessera") {
		t.Fatalf("report: events %q", ev)
	}
	for _, g := range e.lib.GPUs()[1:2] {
		_ = e.lib.ResetGPU(g.UUID)
	}
	orphanSetup(t, e, "destroyed-2")
	e.start().Stop()
	if got := e.migInstances(); !reflect.DeepEqual(got, []string{"gpu0:1g.10gb@6"}) {
		t.Fatalf("destroy: instances %v, want only the administrator's", got)
	}
	if ev := e.nodeEvents("OrphanMIGDestroyed"); len(ev) == 0 {
		t.Fatal("destroy: no event")
	}
}

// TestCheckpointVersions: a wave-1 (v1) and a v2 checkpoint are read and
// rewritten as v3 with their claims prepared; a checkpoint of a newer
// format that this version cannot read stops the start with a clear error
// and is left, with the claims' specs, exactly as it was.
func TestCheckpointVersions(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	c := e.claim("whole", []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
	if res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	p.Stop()
	path := filepath.Join(e.pluginDir, "checkpoint.json")
	v3, _ := os.ReadFile(path)
	// A whole GPU's record is the same in v1, v2 and v3; only the envelope
	// differs.
	as := func(version string) []byte {
		b := bytes.Replace(v3, []byte(`"readableAs":"`+checkpoint.VersionV2+`",`), nil, 1)
		return bytes.Replace(b, []byte(checkpoint.VersionV3), []byte(version), 1)
	}
	for _, old := range []string{checkpoint.VersionV1, checkpoint.VersionV2} {
		if err := os.WriteFile(path, as(old), 0o600); err != nil {
			t.Fatal(err)
		}
		p = e.start()
		if got := p.PreparedClaims(); len(got) != 1 || got[0] != c.UID {
			t.Fatalf("claims after reading %s: %v", old, got)
		}
		p.Stop()
		if cp, err := checkpoint.Read(path); err != nil || cp.ReadVersion != checkpoint.VersionV3 {
			t.Fatalf("%s rewritten as %v (%v)", old, cp, err)
		}
	}

	newer := as("tessera.gpu/checkpoint-v4")
	if err := os.WriteFile(path, newer, 0o600); err != nil {
		t.Fatal(err)
	}
	specs := e.specFiles()
	_, err := Start(e.ctx, e.options())
	if !errors.Is(err, checkpoint.ErrNewerVersion) || !strings.Contains(err.Error(), "checkpoint-v4") {
		t.Fatalf("Start on a newer checkpoint: %v", err)
	}
	if kept, _ := os.ReadFile(path); !bytes.Equal(kept, newer) || !reflect.DeepEqual(e.specFiles(), specs) {
		t.Fatal("the refused start changed the checkpoint or the specs")
	}
	// The newer version comes back and finds its claim.
	if err := os.WriteFile(path, v3, 0o600); err != nil {
		t.Fatal(err)
	}
	p = e.start()
	if _, err := p.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareTakesTheGPULock: a MIG prepare waits for the GPU's lock, which
// the node agent holds while it changes the GPU's MIG state (partition.Apply).
func TestPrepareTakesTheGPULock(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	c := e.claim("locked", []request{{name: "mig", class: "mig", selector: onGPU0}})
	unlock := e.agent.GPULocks().Lock(e.lib.GPUs()[0].UUID)
	done := make(chan error, 1)
	go func() {
		res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c})
		if err == nil {
			err = res[c.UID].Err
		}
		done <- err
	}()
	select {
	case err := <-done:
		unlock()
		t.Fatalf("prepare finished while the agent held the GPU's lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if got := e.migInstances(); len(got) != 0 {
		t.Fatalf("an instance was created under the agent's lock: %v", got)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("instances %v", got)
	}
}
