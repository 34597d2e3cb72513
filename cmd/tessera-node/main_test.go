package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/nodeagent/slices"
	"github.com/tessera-gpu/tessera/test/framework"
)

// The tests run the real binary: this test binary re-executes itself with
// runMainEnv set, which makes TestMain call main() with the given arguments,
// so exit codes and output are exactly the binary's.
const runMainEnv = "TESSERA_NODE_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(framework.Run(m))
}

type result struct {
	output string
	code   int
}

func command(args ...string) (*exec.Cmd, *bytes.Buffer) {
	// No HTTPS endpoint on the fixed default port, which tests running at
	// once would share (deployments/security_test.go tests it); a test that
	// reads the endpoints asks for plain HTTP on a free port.
	// (Subcommands such as mps-daemon have flags of their own.)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		args = append([]string{"--secure-port=0"}, args...)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "NODE_NAME=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

func runBinary(t *testing.T, args ...string) result {
	t.Helper()
	cmd, out := command(args...)
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		return result{output: out.String(), code: cmd.ProcessState.ExitCode()}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("tessera-node %v did not exit; output:\n%s", args, out.String())
	}
	return result{}
}

// expectCleanFailure checks a non-zero exit with a message and no panic.
func expectCleanFailure(t *testing.T, r result, want ...string) {
	t.Helper()
	if r.code == 0 {
		t.Fatalf("exit code 0, want failure; output:\n%s", r.output)
	}
	if strings.Contains(r.output, "panic") || strings.Contains(r.output, "goroutine ") {
		t.Fatalf("the binary panicked:\n%s", r.output)
	}
	for _, w := range want {
		if !strings.Contains(r.output, w) {
			t.Fatalf("output lacks %q:\n%s", w, r.output)
		}
	}
}

func TestBadConfigExits(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ content, want string }{
		"unknown field":   {"default:\n  gpus:\n  - mode: whole\n    profle: [1g.10gb]\n", `unknown field "profle"`},
		"unknown mode":    {"default:\n  gpus:\n  - mode: fractional\n", `default.gpus[0].mode: Unsupported value: "fractional"`},
		"bad profile":     {"default:\n  gpus:\n  - mode: dynamicMIG\n    profiles: [big]\n", `default.gpus[0].profiles[0]: Invalid value: "big"`},
		"no selector":     {"nodes:\n- gpus: [{mode: whole}]\n", `nodes[0].nodeSelector: Required value`},
		"not yaml at all": {"{{{", "partition config"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100?gpus=1", "--config="+path, "--http-address=")
			expectCleanFailure(t, r, path, tc.want)
		})
	}
	t.Run("missing file", func(t *testing.T) {
		r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100", "--config=/nonexistent/partition.yaml")
		expectCleanFailure(t, r, "/nonexistent/partition.yaml", "no such file")
	})
	t.Run("no node name", func(t *testing.T) {
		r := runBinary(t, "--backend=mock:dgxh100")
		expectCleanFailure(t, r, "--node-name")
	})
	t.Run("bad backend", func(t *testing.T) {
		r := runBinary(t, "--node-name=n1", "--backend=mock:dgx1")
		expectCleanFailure(t, r, `unknown mock machine "dgx1"`)
	})
	t.Run("bad orphan policy", func(t *testing.T) {
		r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100", "--orphan-mig=all")
		expectCleanFailure(t, r, `--orphan-mig must be one of [destroy keep report], got "all"`)
	})
	t.Run("bad memory limit ratio", func(t *testing.T) {
		r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100", "--memory-limit-ratio=-0.5")
		expectCleanFailure(t, r, `--memory-limit-ratio must be in [0, 1], got -0.5`)
	})
	t.Run("bad mps daemon", func(t *testing.T) {
		r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100", "--mps-daemon=systemd")
		expectCleanFailure(t, r, `--mps-daemon must be pod or process, got "systemd"`)
	})
	t.Run("mps-daemon without a claim", func(t *testing.T) {
		r := runBinary(t, "mps-daemon", "--mps-dir=/run/tessera/mps", "--devices=GPU-1")
		expectCleanFailure(t, r, `daemon ID "" is not a claim UID`)
	})
	t.Run("mps-daemon with a bad device", func(t *testing.T) {
		r := runBinary(t, "mps-daemon", "--id=c1", "--mps-dir=/run/tessera/mps", "--devices=GPU-1;quit")
		expectCleanFailure(t, r, `is not a GPU or MIG device UUID`)
	})
	t.Run("relative driver root", func(t *testing.T) {
		r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100", "--driver-root=run/nvidia/driver")
		expectCleanFailure(t, r, `--driver-root must be an absolute path`)
	})
}

// TestWrongDriverRootExits: a driver root without the driver's libraries
// (here: an empty directory) stops tessera-node at start with one line
// naming the root and the flag; no CDI spec without the driver is ever
// written.
func TestWrongDriverRootExits(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	node, err := client.CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: framework.UniqueName("bin-node")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	dirs, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dirs) })
	empty := filepath.Join(dirs, "driver")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, "--node-name="+node.Name, "--backend=mock:dgxh100?gpus=1", "--kubeconfig="+cp.KubeconfigPath, "--http-address=",
		"--driver-root="+empty, "--kubelet-registry-dir="+filepath.Join(dirs, "reg"), "--kubelet-plugin-dir="+filepath.Join(dirs, "plugin"),
		"--cdi-dir="+filepath.Join(dirs, "cdi"), "--mps-dir="+filepath.Join(dirs, "mps"), "-v=0")
	expectCleanFailure(t, r, "NVIDIA driver libraries not found", "driver root "+empty, "--driver-root")
	if specs, _ := filepath.Glob(filepath.Join(dirs, "cdi", "*.json")); len(specs) != 0 {
		t.Fatalf("specs written without the driver: %v", specs)
	}
}

func TestMissingNVIDIALibraryExits(t *testing.T) {
	r := runBinary(t, "--node-name=n1", "--backend=nvml:/nonexistent/libnvidia-ml.so.1", "--http-address=")
	expectCleanFailure(t, r, "libnvidia-ml.so.1) not found")
	if lines := strings.Split(strings.TrimSpace(r.output), "\n"); len(lines) != 1 {
		t.Fatalf("want one line, got %d:\n%s", len(lines), r.output)
	}
}

func TestUnreachableAPIServerExits(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := framework.WriteKubeconfig(&rest.Config{Host: "https://127.0.0.1:1"}, kubeconfig); err != nil {
		t.Fatal(err)
	}
	r := runBinary(t, "--node-name=n1", "--backend=mock:dgxh100?gpus=1", "--kubeconfig="+kubeconfig, "--startup-timeout=2s", "--http-address=")
	expectCleanFailure(t, r, `get Node "n1" from the API server`, "connection refused")
}

func TestServesAndStops(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	node, err := client.CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: framework.UniqueName("bin-node")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()

	// GPU 2 goes to the device plugin; GPUs 0 and 1 are published for DRA
	// and prepared by the kubelet plugin. Every kubelet-facing directory is a
	// temp dir (short: unix socket paths are limited to 108 bytes).
	dirs, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dirs) })
	registry, dpDir := filepath.Join(dirs, "reg"), filepath.Join(dirs, "dp")
	partitionConfig := filepath.Join(dirs, "partition.yaml")
	dpConfig := filepath.Join(dirs, "deviceplugin.yaml")
	if err := os.Mkdir(dpDir, 0o755); err != nil { // the kubelet's device-plugins dir
		t.Fatal(err)
	}
	if err := os.WriteFile(partitionConfig, []byte("default: {gpus: [{indices: [2], mode: devicePlugin}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dpConfig, []byte("pluginDir: "+dpDir+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, out := command("--node-name="+node.Name, "--backend=mock:dgxb200?gpus=3", "--kubeconfig="+cp.KubeconfigPath, "--http-address="+addr,
		"--config="+partitionConfig, "--device-plugin-config="+dpConfig,
		"--kubelet-registry-dir="+registry, "--kubelet-plugin-dir="+filepath.Join(dirs, "plugin"),
		"--cdi-dir="+filepath.Join(dirs, "cdi"), "--mps-dir="+filepath.Join(dirs, "mps"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	defer func() {
		select {
		case <-done:
		default:
			_ = cmd.Process.Kill()
			<-done
		}
	}()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := get("/readyz")
		if code == http.StatusOK {
			if !strings.Contains(body, "2 whole") {
				t.Fatalf("/readyz: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready (last %d %s); output:\n%s", code, body, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The kubelet DRA plugin registers for gpu.tessera.dev, and the device
	// plugin serves the third GPU as tessera.dev/gpu.
	waitFor(t, "the DRA plugin's registration socket", func() bool {
		entries, _ := os.ReadDir(registry)
		for _, e := range entries {
			if strings.Contains(e.Name(), "gpu.tessera.dev") {
				return true
			}
		}
		return false
	})
	waitFor(t, "the device plugin's socket", func() bool {
		_, err := os.Stat(filepath.Join(dpDir, "tessera-tessera.dev_gpu.sock"))
		return err == nil
	})
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	_, metrics := get("/metrics")
	want := `tessera_node_devices_published{node="` + node.Name + `",type="gpu"} 2`
	if !strings.Contains(metrics, want) {
		t.Fatalf("/metrics lacks %s", want)
	}
	// The kubelet plugins' own registries are served beside the agent's.
	for _, name := range []string{"tessera_draplugin_prepared_devices", "tessera_deviceplugin_"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s...", name)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("exit code %d after SIGTERM; output:\n%s", code, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("did not stop after SIGTERM; output:\n%s", out.String())
	}
}

func TestDiscoverCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "partition.yaml")
	cfg := `
nodes:
- name: mig
  nodeSelector: {matchLabels: {pool: mig}}
  gpus: [{indices: [0], mode: dynamicMIG, profiles: [1g.10gb]}, {indices: [1], mode: shared}]
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// Through the command line once (component-base logging can be applied
	// once per process), then through the function behind it.
	cmd := newRootCommand(nil)
	var buf bytes.Buffer
	cmd.SetOut(&buf)
	cmd.SetArgs([]string{"discover", "--backend=mock:dgxh100?gpus=3", "--config=" + path, "--node-labels=pool=mig"})
	err := cmd.Execute()
	out := buf.String()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"configEntry: mig", "mig: 7", "shared: 1", "whole: 2", "- gpu-0-counters", "- gpu-0-mig-1g-10gb-6", "- gpu-1-shared", "- gpu-2\n", "rule: nodes[0].gpus[1]"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var degraded bytes.Buffer
	if err := discover(context.Background(), &degraded, "mock:dgxh100?gpus=3", path, "pool=mig", slices.Features{ConsumableCapacity: true, DeviceTaints: true}); err != nil {
		t.Fatal(err)
	}
	if out := degraded.String(); !strings.Contains(out, "whole: 2") || !strings.Contains(out, "mig: 0") || !strings.Contains(out, "DRAPartitionableDevices") || !strings.Contains(out, "DRAPartitionableDevices") {
		t.Errorf("degraded output:\n%s", degraded.String())
	}
	if err := discover(context.Background(), io.Discard, "mock:dgxh100?gpus=1", path, "pool=mig", slices.AllFeatures); err == nil || !strings.Contains(err.Error(), "nodes[0].gpus[1].indices[0]: Invalid value: 1") {
		t.Errorf("config that does not fit: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSocketPathTooLongExits: with --pod-uid, the DRA socket
// (<plugin dir>/dra-<pod UID>.sock) of a plugin directory deep enough is
// longer than a unix socket path may be (108 bytes); tessera-node stops at
// start naming the path and the limit instead of running without a
// socket for the kubelet (a bug the real-node harness found: it neither
// served nor exited).
func TestSocketPathTooLongExits(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	node, err := client.CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: framework.UniqueName("bin-node")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })
	dirs, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dirs) })
	const uid = "0e100000-0000-0000-0000-000000000002"
	pluginDir := filepath.Join(dirs, "kubelet", "plugins", strings.Repeat("p", 40), "gpu.tessera.dev")
	socket := filepath.Join(pluginDir, "dra-"+uid+".sock")
	if len(socket) <= 108 {
		t.Fatalf("test setup: %s is only %d bytes", socket, len(socket))
	}
	r := runBinary(t, "--node-name="+node.Name, "--backend=mock:dgxh100?gpus=1", "--kubeconfig="+cp.KubeconfigPath, "--http-address=",
		"--pod-uid="+uid, "--kubelet-registry-dir="+filepath.Join(dirs, "reg"), "--kubelet-plugin-dir="+pluginDir,
		"--cdi-dir="+filepath.Join(dirs, "cdi"), "--mps-dir="+filepath.Join(dirs, "mps"), "-v=0")
	expectCleanFailure(t, r, "socket path "+socket+" is "+strconv.Itoa(len(socket))+" bytes", "108", "--kubelet-plugin-dir")
	// It stopped before publishing anything.
	slices, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node.Name})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != 0 {
		t.Errorf("%d ResourceSlices published by an instance that cannot serve the kubelet", len(slices.Items))
	}
}
