package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/deployments/deviceclasses"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
	"github.com/tessera-gpu/tessera/sandbox/cluster"
	"github.com/tessera-gpu/tessera/test/framework"
)

// namespace holds every workload of the run.
const namespace = "chaos"

// env is the running chaos cluster.
type env struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	seed uint64
	cfg  config

	cp   *framework.ControlPlane
	kube kubernetes.Interface // direct to the API server: the load generator, the checker
	ts   *client.Client

	proxy           *faultProxy
	proxyKubeconfig string
	partitionConfig string
	bin             struct{ node, scheduler string }

	nodes    []*chaosNode
	replicas []*replica

	start   time.Time
	logMu   sync.Mutex
	logFile *os.File
}

func (e *env) logf(format string, args ...any) {
	line := fmt.Sprintf("%7.1fs ", time.Since(e.start).Seconds()) + fmt.Sprintf(format, args...)
	e.logMu.Lock()
	defer e.logMu.Unlock()
	if e.logFile != nil {
		fmt.Fprintln(e.logFile, line)
	}
	e.t.Log(line)
}

// buildBinaries builds tessera-node and tessera-scheduler from this checkout.
func buildBinaries(t *testing.T, dir string) (node, scheduler string) {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "bin")
	cmd := exec.Command("go", "build", "-o", out+"/", "./cmd/tessera-node", "./cmd/tessera-scheduler")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build tessera-node and tessera-scheduler: %v\n%s", err, b)
	}
	return filepath.Join(out, "tessera-node"), filepath.Join(out, "tessera-scheduler")
}

// setUp starts the control plane, the proxy, the nodes and the schedulers.
// Everything is stopped by tearDown (registered with t.Cleanup).
func setUp(t *testing.T, ctx context.Context, cfg config) *env {
	dir, err := os.MkdirTemp("", "tch-")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, dir: dir, seed: cfg.seed, cfg: cfg, start: time.Now()}
	e.logFile, _ = os.Create(filepath.Join(dir, "chaos.log"))
	t.Cleanup(e.tearDown)
	e.bin.node, e.bin.scheduler = buildBinaries(t, dir)
	e.logf("built tessera-node and tessera-scheduler in %s", time.Since(e.start).Round(time.Second))

	e.cp, err = framework.Start(ctx, framework.Options{Dir: filepath.Join(dir, "controlplane")})
	if err != nil {
		t.Fatal(err)
	}
	if e.kube, err = kubernetes.NewForConfig(e.cp.Config); err != nil {
		t.Fatal(err)
	}
	if e.ts, err = client.NewForConfig(e.cp.Config); err != nil {
		t.Fatal(err)
	}
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	crdFiles, _ := filepath.Glob(filepath.Join(root, "deployments", "crds", "*.yaml"))
	if err := e.cp.InstallCRDFiles(ctx, crdFiles...); err != nil {
		t.Fatal(err)
	}
	if err := e.installDeviceClasses(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cp.WaitDefaultServiceAccount(ctx, e.kube, namespace); err != nil {
		t.Fatal(err)
	}

	e.proxy, err = startProxy(e.cp.Config, e.cp.Dir, cfg.seed+1)
	if err != nil {
		t.Fatal(err)
	}
	e.proxyKubeconfig = filepath.Join(dir, "proxy.kubeconfig")
	if err := cluster.WriteKubeconfig(e.proxy.config(e.cp.Config), e.proxyKubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := e.writePartitionConfig(); err != nil {
		t.Fatal(err)
	}

	modes := []string{modeWhole, modeWhole, modeWhole, modeMIG, modeMIG, modeMIG, modeShared, modeShared}
	for i, m := range modes {
		n := &chaosNode{name: fmt.Sprintf("chaos-node-%d", i), mode: m, env: e}
		if err := n.newDir(); err != nil {
			t.Fatal(err)
		}
		n.startKubelet(e.kube)
		e.nodes = append(e.nodes, n)
	}
	// Started one after the other: eight at once on a loaded 2-core
	// machine only make each slower.
	for _, n := range e.nodes {
		if err := n.startPlugin(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.logf("%d nodes ready (whole, dynamic MIG, shared) in %s", len(e.nodes), time.Since(e.start).Round(time.Second))
	for slot := range 2 {
		r, err := e.startReplica(slot)
		if err != nil {
			t.Fatal(err)
		}
		e.replicas = append(e.replicas, r)
	}
	return e
}

func (e *env) installDeviceClasses() error {
	entries, err := deviceclasses.FS.ReadDir(".")
	if err != nil {
		return err
	}
	for _, ent := range entries {
		if filepath.Ext(ent.Name()) != ".yaml" {
			continue
		}
		data, err := deviceclasses.FS.ReadFile(ent.Name())
		if err != nil {
			return err
		}
		dc := &resourceapi.DeviceClass{}
		if err := yaml.Unmarshal(data, dc); err != nil {
			return fmt.Errorf("%s: %w", ent.Name(), err)
		}
		if _, err := e.kube.ResourceV1().DeviceClasses().Create(e.ctx, dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
		}
	}
	return nil
}

// writePartitionConfig: nodes labelled mig have every GPU in dynamic MIG
// mode, nodes labelled shared every GPU shared (consumable capacity);
// the others offer whole GPUs.
func (e *env) writePartitionConfig() error {
	entry := func(mode string, m partition.Mode) partition.NodeEntry {
		return partition.NodeEntry{
			Name:         "chaos-" + mode,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{modeLabel: mode}},
			NodeConfig:   partition.NodeConfig{GPUs: []partition.GPURule{{Mode: m}}},
		}
	}
	cfg := partition.Config{Nodes: []partition.NodeEntry{entry(modeMIG, contract.ModeDynamicMIG), entry(modeShared, contract.ModeShared)}}
	data, err := sigsyaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if _, err := partition.Parse(data); err != nil {
		return fmt.Errorf("partition config: %w", err)
	}
	e.partitionConfig = filepath.Join(e.dir, "partition.yaml")
	return os.WriteFile(e.partitionConfig, data, 0o644)
}

// tearDown stops everything the run started: schedulers, tessera-node
// processes, kubelets, the proxy and the control plane; the run's directory
// goes unless the test failed (kept for its logs) or CHAOS_KEEP is set.
func (e *env) tearDown() {
	for _, r := range e.replicas {
		if r != nil {
			r.kill()
		}
	}
	for _, n := range e.nodes {
		n.mu.Lock()
		n.killPlugin()
		n.stopKubelet()
		n.mu.Unlock()
	}
	if e.proxy != nil {
		e.proxy.stop()
	}
	e.cp.Stop()
	if e.logFile != nil {
		_ = e.logFile.Close()
	}
	if e.t.Failed() || os.Getenv("CHAOS_KEEP") != "" {
		e.t.Logf("chaos run directory kept: %s", e.dir)
		return
	}
	_ = os.RemoveAll(e.dir)
}
