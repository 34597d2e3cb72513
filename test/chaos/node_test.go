package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/sandbox/realnode"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
)

// Node modes of the chaos cluster (the partition config selects them by the
// node label modeLabel).
const (
	modeWhole  = "whole"
	modeMIG    = "mig"
	modeShared = "shared"
	modeLabel  = "chaos.tessera.dev/mode"
)

// gpusPerNode: each node is a DGX H100 (8 GPUs).
const gpusPerNode = 8

// chaosNode is one simulated GPU node: a simulated kubelet in this process
// (sandbox/simkubelet, with a state file as the kubelet's DRA checkpoint) and
// tessera-node as a process of its own on a mock machine, talking over the
// plugin's real registration and DRA sockets. Killing the process (kill -9)
// is a crash of the DaemonSet pod; its checkpoint and sockets stay on disk.
type chaosNode struct {
	name, mode string
	env        *env

	// mu serializes the faults' changes of the node (its processes).
	mu sync.Mutex
	// dir is the node's root; a node deleted and added back is a new
	// machine with a new dir. dmu guards it alone, so that the checker
	// reads paths while a fault holds mu.
	dmu   sync.Mutex
	dir   string
	epoch int

	kubelet       *simkubelet.Kubelet
	kubeletCancel context.CancelFunc
	kubeletDone   chan struct{}

	proc     *exec.Cmd
	procDone chan struct{}
	http     string
}

func (n *chaosNode) path(elem ...string) string {
	n.dmu.Lock()
	dir := n.dir
	n.dmu.Unlock()
	return filepath.Join(append([]string{dir}, elem...)...)
}
func (n *chaosNode) registryDir() string { return n.path("registry") }
func (n *chaosNode) pluginDir() string   { return n.path("plugins", contract.DriverName) }
func (n *chaosNode) checkpointPath() string {
	return filepath.Join(n.pluginDir(), "checkpoint.json")
}
func (n *chaosNode) kubeletState() string  { return n.path("kubelet-state.json") }
func (n *chaosNode) controlSocket() string { return n.path("nvml.sock") }

// holdDir holds the fake tools' holds (realnode.HoldTool).
func (n *chaosNode) holdDir() string { return n.path("holds") }

// newDir gives the node a fresh root directory (a new machine).
func (n *chaosNode) newDir() error {
	n.dmu.Lock()
	n.epoch++
	// Short: unix socket paths (MPS pipes under mps/) have a 108-byte limit.
	n.dir = filepath.Join(n.env.dir, fmt.Sprintf("n%s.%d", strings.TrimPrefix(n.name, "chaos-node-"), n.epoch))
	n.dmu.Unlock()
	for _, d := range []string{n.registryDir(), n.pluginDir(), n.path("cdi"), n.path("mps"), n.path("logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	return realnode.WriteFakeTools(n.path("fakebin"))
}

func (n *chaosNode) startKubelet(client kubernetes.Interface) {
	n.kubelet = simkubelet.New(simkubelet.Options{
		NodeName: n.name, Client: client, RegistryDir: n.registryDir(),
		Labels: map[string]string{modeLabel: n.mode, "nvidia.com/gpu.present": "true"}, StateFile: n.kubeletState(),
	})
	ctx, cancel := context.WithCancel(n.env.ctx)
	n.kubeletCancel = cancel
	n.kubeletDone = make(chan struct{})
	k, done := n.kubelet, n.kubeletDone
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := k.Run(ctx); err != nil && ctx.Err() == nil {
				// The API server may be restarting: a kubelet keeps trying.
				n.env.logf("kubelet %s: %v (retrying)", n.name, err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
				continue
			}
			return
		}
	}()
}

func (n *chaosNode) stopKubelet() {
	if n.kubeletCancel == nil {
		return
	}
	n.kubeletCancel()
	<-n.kubeletDone
	n.kubeletCancel = nil
}

// startPlugin starts tessera-node and waits until it serves /readyz and its
// registration socket is where the kubelet looks.
func (n *chaosNode) startPlugin(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	n.http = "127.0.0.1:" + strconv.Itoa(port)
	// The serial keeps the GPUs' UUIDs over tessera-node restarts on this
	// machine; a node deleted and added back is another machine.
	n.dmu.Lock()
	serial := fmt.Sprintf("%s.%d", n.name, n.epoch)
	n.dmu.Unlock()
	// The state file keeps the machine's MIG modes and instances over
	// tessera-node restarts, as the driver does: a killed plugin's
	// successor finds what it left.
	backend := "mock:dgxh100?gpus=" + strconv.Itoa(gpusPerNode) + "&serial=" + serial + "&root=" + n.path("driver-root") + "&control=" + n.controlSocket() + "&state=" + n.path("driver-state.json")
	args := []string{
		"--node-name=" + n.name,
		"--kubeconfig=" + n.env.proxyKubeconfig,
		"--backend=" + backend,
		"--config=" + n.env.partitionConfig,
		"--nvidia-cdi-hook-path=" + n.path("fakebin", "nvidia-cdi-hook"),
		"--kubelet-registry-dir=" + n.registryDir(),
		"--kubelet-plugin-dir=" + n.pluginDir(),
		"--cdi-dir=" + n.path("cdi"),
		"--mps-dir=" + n.path("mps"),
		"--mps-daemon=process",
		"--http-address=" + n.http,
		"--secure-port=0", // eight agents on one host: their HTTPS default port would collide
		"--health-probe-interval=1s",
		"--startup-timeout=5m",
		"--v=2",
	}
	logFile, err := os.OpenFile(n.path("logs", "tessera-node.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.env.bin.node, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "PATH="+n.path("fakebin")+":"+os.Getenv("PATH"), "FAKE_TOOLS_LOG="+n.path("logs", "tools.log"), "FAKE_TOOLS_HOLD_DIR="+n.holdDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start tessera-node on %s: %w", n.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(done) }()
	n.proc, n.procDone = cmd, done
	deadline := time.Now().Add(5 * time.Minute)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-done:
			return fmt.Errorf("tessera-node on %s exited: %s", n.name, tail(n.path("logs", "tessera-node.log"), 20))
		default:
		}
		if resp, err := client.Get("http://" + n.http + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if fi, err := os.Stat(filepath.Join(n.registryDir(), contract.DriverName+"-reg.sock")); resp.StatusCode == http.StatusOK && err == nil && fi.Mode()&os.ModeSocket != 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tessera-node on %s not ready within 5m: %s", n.name, tail(n.path("logs", "tessera-node.log"), 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// killPlugin is kill -9 of tessera-node (its process group).
func (n *chaosNode) killPlugin() {
	if n.proc == nil {
		return
	}
	select {
	case <-n.procDone:
	default:
		_ = syscall.Kill(-n.proc.Process.Pid, syscall.SIGKILL)
		<-n.procDone
	}
	n.proc = nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	n := 0
	for i := len(data) - 1; i >= 0; i-- {
		if data[i] == '\n' {
			n++
			if n > lines {
				return string(data[i+1:])
			}
		}
	}
	return string(data)
}
