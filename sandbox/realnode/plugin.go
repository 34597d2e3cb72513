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
	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
)

// Plugin is one running tessera-node process of the node: the node agent
// publishing the mock GPUs and the kubelet DRA plugin, as its DaemonSet pod
// would run it (in the node's mount namespace, with the kubelet's plugin
// directories).
type Plugin struct {
	Name   string
	PodUID string
	proc   *proc.Process
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
		// The MPS control daemons run as children of tessera-node here, not in pods of
		// their own (the default, which a DaemonSet needs to survive upgrades): a daemon
		// pod needs an image with tessera-node, which the real node's image builder does
		// not make. The daemon's protocol (start, limits, get_server_list, quit) is the
		// same in both modes; what differs is only who starts the process.
		"--mps-daemon=process",
		"--http-address=" + p.http,
		"--secure-port=0", // several nodes share this host: plain HTTP on their own ports only
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
	p.proc, err = proc.Start(opts.Name, n.path("logs", opts.Name+".log"), env, n.inNamespace(args...)...)
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
		if done, err := p.proc.Exited(); done {
			return fmt.Errorf("%s: %w (%v): %s", p.Name, proc.ErrExited, err, p.proc.LogTail(30))
		}
		if p.published(client) && p.registered(n.RegistryDir()) && n.kubeletRegistered(ctx, p.socket(n.RegistryDir())) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not publish and register within 60s: %s", p.Name, p.proc.LogTail(30))
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
		p.proc.Stop(syscall.SIGTERM, 30*time.Second)
	}
}

// Kill ends the instance at once (SIGKILL): a crash.
func (p *Plugin) Kill() {
	if p != nil {
		p.proc.Stop(syscall.SIGKILL, 10*time.Second)
	}
}

// Running reports whether the instance still runs.
func (p *Plugin) Running() bool {
	done, _ := p.proc.Exited()
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
func (p *Plugin) Log(lines int) string { return p.proc.LogTail(lines) }

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
// daemon's stand-in keeps the state the plugin can observe in the pipe
// directory — the control pipe exists while the daemon runs; the default
// active thread percentage and each device's pinned memory limit are files
// beside it — answers the control commands one per stdin line as the tool
// does (get_* print the value, get_server_list prints no server: no CUDA
// client runs here), and fails as the tool does when there is no daemon to
// talk to or a command is unknown. The full model of the tool (servers per
// UID, clients, static SM partitions) is draplugin's fakebin, which the
// draplugin tests use; the real node's tests are about the kubelet,
// containerd and the CDI edits, for which this much of MPS is enough.
const fakeMPSControl = `#!/bin/sh
` + toolHoldSh + `
stdin=""
if [ "$1" != "-d" ]; then stdin=$(cat); fi
printf '%s\n' "nvidia-cuda-mps-control $* | visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY | stdin=$(printf '%s' "$stdin" | tr '\n' ';') | limits=mem:$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,threads:$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" >> "$FAKE_TOOLS_LOG"
dir="$CUDA_MPS_PIPE_DIRECTORY"
pipe="$dir/control"
if [ "$1" = "-d" ]; then
  tool_hold ` + HoldMPSDaemonStart + ` "$dir"
  if [ -p "$pipe" ]; then echo "An instance of this daemon is already running" >&2; exit 1; fi
  mkdir -p "$dir" && rm -f "$dir"/limit.* && mkfifo "$pipe"
  exit $?
fi
case ";$(printf '%s' "$stdin" | tr '\n' ';');" in *";quit;"*) tool_hold ` + HoldMPSDaemonQuit + ` "$dir" ;; esac
if [ ! -p "$pipe" ]; then echo "Cannot find MPS control daemon process" >&2; exit 1; fi
printf '%s\n' "$stdin" | while read -r cmd a1 a2; do
  case "$cmd" in
  "") ;;
  get_server_list) ;;
  get_default_active_thread_percentage) cat "$dir/limit.threads" 2>/dev/null || echo 100.0 ;;
  set_default_active_thread_percentage) echo "$a1.0" > "$dir/limit.threads"; cat "$dir/limit.threads" ;;
  get_default_device_pinned_mem_limit) cat "$dir/limit.mem.$a1" 2>/dev/null || echo 0 ;;
  set_default_device_pinned_mem_limit) echo "$a2" > "$dir/limit.mem.$a1" ;;
  quit) rm -f "$pipe" "$dir"/limit.* ;;
  *) echo "Unrecognized command: $cmd" >&2; exit 1 ;;
  esac
done
`

const fakeSMI = `#!/bin/sh
` + toolHoldSh + `
printf '%s\n' "nvidia-smi $*" >> "$FAKE_TOOLS_LOG"
if [ "$1" = "compute-policy" ]; then tool_hold ` + HoldSMIComputePolicy + ` "$*"; fi
`

func (n *Node) writeFakeTools() error { return WriteFakeTools(n.path("fakebin")) }

// WriteFakeTools writes the stand-ins of nvidia-cuda-mps-control and
// nvidia-smi (above) into dir, for tessera-node processes on a mock backend
// with dir first on PATH; they log each call to $FAKE_TOOLS_LOG. The chaos
// run (test/chaos) uses them too.
func WriteFakeTools(dir string) error {
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
