package realnode

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// Plugin is one running tessera-node process of the node: the node agent
// publishing the mock GPUs and the kubelet DRA plugin, as its DaemonSet pod
// would run it (in the node's mount namespace, with the kubelet's plugin
// directories).
type Plugin struct {
	Name   string
	PodUID string
	proc   *process
	http   string
	// driverRoot is where its mock machine lays out the driver installation,
	// control the mock machine's control socket.
	driverRoot, control string
}

// PluginOptions configure one tessera-node instance.
type PluginOptions struct {
	// Name tells instances apart in logs (default "tessera-node").
	Name string
	// PodUID is passed as --pod-uid: two instances with different UIDs
	// serve side by side, as during a rolling update with maxSurge.
	PodUID string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// RegistryDir is where the kubelet looks for plugin registration sockets.
func (n *Node) RegistryDir() string { return filepath.Join(n.KubeletRootDir(), "plugins_registry") }

// PluginDir is tessera-node's directory under the kubelet's root (its DRA
// socket and checkpoint).
func (n *Node) PluginDir() string {
	return filepath.Join(n.KubeletRootDir(), "plugins", contract.DriverName)
}

// CDIDir is where tessera-node writes CDI specs and containerd reads them.
func (n *Node) CDIDir() string { return n.path("cdi") }

// MPSDir is tessera-node's --mps-dir.
func (n *Node) MPSDir() string { return n.path("mps") }

// HookPath is the nvidia-cdi-hook the CDI specs name and runc runs (built
// by sandbox/nodebin at the NVIDIA container toolkit version of go.mod).
func (n *Node) HookPath() string { return n.bin("nvidia-cdi-hook") }

// backend is the instance's --backend: the node's mock machine, with its
// driver installation laid out in the node's directory and its control
// socket there.
func (n *Node) backend(p *Plugin) string {
	return "mock:" + n.opts.Machine + "?gpus=" + strconv.Itoa(n.opts.GPUs) + "&root=" + p.driverRoot + "&control=" + p.control
}

// StartPlugin starts a tessera-node instance and waits until it has
// published the node's GPUs and put its registration socket where the kubelet
// looks.
func (n *Node) StartPlugin(ctx context.Context, opts PluginOptions) (*Plugin, error) {
	if opts.Name == "" {
		opts.Name = "tessera-node"
	}
	port, err := freePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	p := &Plugin{Name: opts.Name, PodUID: opts.PodUID, http: "127.0.0.1:" + strconv.Itoa(port),
		driverRoot: n.path("driver-root", opts.Name), control: n.path("nvml-" + opts.Name + ".sock")}
	// Every instance models its own machine (the mock lives in its
	// process), so each has its own driver installation: the CDI base spec
	// names the newest one's files, and a running container keeps the files
	// it got from an older one.
	args := []string{n.opts.TesseraNode,
		"--node-name=" + n.opts.NodeName,
		"--kubeconfig=" + n.opts.Kubeconfig,
		"--backend=" + n.backend(p),
		"--nvidia-cdi-hook-path=" + n.HookPath(),
		"--kubelet-registry-dir=" + n.RegistryDir(),
		"--kubelet-plugin-dir=" + n.PluginDir(),
		"--cdi-dir=" + n.CDIDir(),
		"--mps-dir=" + n.MPSDir(),
		"--http-address=" + p.http,
		"--v=4",
	}
	if n.opts.PartitionConfig != "" {
		args = append(args, "--config="+n.path("partition.yaml"))
	}
	if opts.PodUID != "" {
		args = append(args, "--pod-uid="+opts.PodUID)
	}
	args = append(args, n.opts.PluginArgs...)
	args = append(args, opts.ExtraArgs...)
	env := append(nodeEnv(n.path("fakebin"), n.binDir), "FAKE_TOOLS_LOG="+n.ToolCallsLog())
	p.proc, err = startProcess(opts.Name, n.path("logs", opts.Name+".log"), env, n.inNamespace(args...)...)
	if err != nil {
		return nil, err
	}
	n.started = append(n.started, p)
	if err := p.waitReady(ctx, n); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

func (p *Plugin) waitReady(ctx context.Context, n *Node) error {
	deadline := time.Now().Add(60 * time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		if done, err := p.proc.exited(); done {
			return fmt.Errorf("%s: %w (%v): %s", p.Name, errExited, err, p.proc.logTail(30))
		}
		if p.published(client) && p.registered(n.RegistryDir()) && n.kubeletRegistered(ctx, p.socket(n.RegistryDir())) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not publish and register within 60s: %s", p.Name, p.proc.logTail(30))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *Plugin) published(client *http.Client) bool {
	resp, err := client.Get("http://" + p.http + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// socket is the registration socket the kubeletplugin helper creates,
// gpu.tessera.dev-reg.sock, or gpu.tessera.dev-<pod UID>-reg.sock.
func (p *Plugin) socket(registry string) string {
	name := contract.DriverName + "-reg.sock"
	if p.PodUID != "" {
		name = kubeletplugin.RollingUpdateRegistrarSocketFile(registry, contract.DriverName, types.UID(p.PodUID))
	}
	return filepath.Join(registry, name)
}

func (p *Plugin) registered(registry string) bool {
	fi, err := os.Stat(p.socket(registry))
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// kubeletRegistered reports whether the kubelet's plugin manager has
// registered the plugin behind socket (its metric
// plugin_manager_total_plugins{state="actual_state_of_world"}): the kubelet
// registers a new socket within about a second, and a pod that comes before
// that waits for the kubelet's retry (10s and more).
func (n *Node) kubeletRegistered(ctx context.Context, socket string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(n.nodeIP, strconv.Itoa(n.kubeletPort))+"/metrics", nil)
	if err != nil {
		return false
	}
	// The kubelet serves a self-signed certificate; this is its own test node.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false
	}
	want := `plugin_manager_total_plugins{socket_path="` + socket + `",state="actual_state_of_world"} 1`
	return strings.Contains(string(body), want)
}

// Stop ends the instance as the kubelet ends a pod (SIGTERM, then SIGKILL
// after 30s) and waits for it.
func (p *Plugin) Stop() {
	if p != nil {
		p.proc.stop(syscall.SIGTERM, 30*time.Second)
	}
}

// Kill ends the instance at once (SIGKILL): a crash.
func (p *Plugin) Kill() {
	if p != nil {
		p.proc.stop(syscall.SIGKILL, 10*time.Second)
	}
}

// Running reports whether the instance still runs.
func (p *Plugin) Running() bool {
	done, _ := p.proc.exited()
	return !done
}

// DriverRoot is the directory where the instance's mock machine laid out
// its driver installation (libraries, binaries, device nodes, procfs): the
// host paths of the CDI specs it writes are in it.
func (p *Plugin) DriverRoot() string { return p.driverRoot }

// NVML sends a fault to the instance's mock machine (nvmlbackend's control
// socket): "xid <gpu> <n>", "ecc <gpu> single|double", "lost <gpu>",
// "back <gpu>", with <gpu> an index or a UUID.
func (p *Plugin) NVML(ctx context.Context, command string) error {
	return nvmlbackend.SendControl(ctx, p.control, command)
}

// Log returns the end of the instance's log.
func (p *Plugin) Log(lines int) string { return p.proc.logTail(lines) }

// ToolCallsLog is the file the fake NVIDIA tools append their calls to.
func (n *Node) ToolCallsLog() string { return n.path("fakebin", "calls.log") }

// ToolCalls returns the recorded calls of the fake NVIDIA tools.
func (n *Node) ToolCalls() []string {
	data, err := os.ReadFile(n.ToolCallsLog())
	if err != nil {
		return nil
	}
	s := strings.TrimRight(string(data), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// The node has no NVIDIA driver, so tessera-node runs with stand-ins of
// nvidia-smi and nvidia-cuda-mps-control first on its PATH. The MPS control
// daemon's stand-in keeps the state the plugin can observe — the control pipe
// exists while the daemon runs — and fails as the tool does when there is no
// daemon to talk to.
const fakeMPSControl = `#!/bin/sh
stdin=""
if [ "$1" != "-d" ]; then stdin=$(cat); fi
printf '%s\n' "nvidia-cuda-mps-control $* | visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY | stdin=$stdin" >> "$FAKE_TOOLS_LOG"
pipe="$CUDA_MPS_PIPE_DIRECTORY/control"
if [ "$1" = "-d" ]; then
  if [ -p "$pipe" ]; then echo "An instance of this daemon is already running" >&2; exit 1; fi
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" && mkfifo "$pipe"
  exit $?
fi
if [ ! -p "$pipe" ]; then echo "Cannot find MPS control daemon process" >&2; exit 1; fi
if [ "$stdin" = "quit" ]; then rm -f "$pipe"; fi
`

const fakeSMI = `#!/bin/sh
printf '%s\n' "nvidia-smi $*" >> "$FAKE_TOOLS_LOG"
`

func (n *Node) writeFakeTools() error {
	dir := n.path("fakebin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, script := range map[string]string{"nvidia-cuda-mps-control": fakeMPSControl, "nvidia-smi": fakeSMI} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Metrics returns the instance's /metrics (the agent's and the DRA plugin's).
func (p *Plugin) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.http+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("metrics of %s: %w", p.Name, err)
	}
	return string(body), nil
}
