// Package realnode runs one real Kubernetes node on this machine against a
// control plane (the tests', or the sandbox's): containerd v2 (with Debian's
// runc and CNI plugins) and the real kubelet, both built from the Go module
// proxy by sandbox/nodebin, and beside them tessera-node on a mock GPU
// backend with its plugin directories under the kubelet's root. Pods bound
// to the node run as real containers, and the CDI edits of their claims —
// the mock machine's driver files, device nodes, and the hooks of the
// NVIDIA container toolkit's nvidia-cdi-hook, which runc runs — reach them.
//
// Everything lives under one temporary directory and in a mount namespace of
// the node's own (mountns.go); Stop tears everything down — processes,
// mounts, network namespaces, the cgroups, the CNI bridge, the kernel tunables
// the kubelet changes — and Leftovers checks that nothing is left. One real
// node runs per machine at a time (lock.go).
//
// The package has no testing dependency: the real-node tests
// (test/e2e/realnode) and `tessera sandbox up --real-node` both use it.
package realnode

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
	"github.com/tessera-gpu/tessera/sandbox/nodebin"
)

// EnvBinDir overrides where the node binaries are looked up (default the
// cache directory of sandbox/nodebin, which bin/node of a checkout links to).
const EnvBinDir = nodebin.EnvDir

// Options configure a real node.
type Options struct {
	// NodeName is the Node's name (required).
	NodeName string
	// Kubeconfig is an admin kubeconfig of the control plane, used by the
	// kubelet and tessera-node (required).
	Kubeconfig string
	// TesseraNode is the tessera-node binary (required).
	TesseraNode string
	// Machine and GPUs choose the mock GPUs (default dgxh100 with 4).
	Machine string
	GPUs    int
	// PartitionConfig is tessera-node's partition config (YAML); empty offers
	// every GPU whole.
	PartitionConfig string
	// Labels are the Node's labels (kubelet --node-labels).
	Labels map[string]string
	// Taints are the Node's taints (kubelet registerWithTaints).
	Taints []corev1.Taint
	// NodeIP is the kubelet's --node-ip (default: the first global IPv4
	// address of an interface that is up).
	NodeIP string
	// BinDir holds the binaries of sandbox/nodebin: kubelet, containerd,
	// containerd-shim-runc-v2, ctr, pause and nvidia-cdi-hook (default
	// $TESSERA_NODE_BIN, else nodebin's cache directory).
	BinDir string
	// KubeletVerbosity is the kubelet's --v (default 2).
	KubeletVerbosity int
	// NoPlugin starts no tessera-node instance: the caller starts its own
	// (StartPlugin), e.g. two for a rolling update.
	NoPlugin bool
	// PluginArgs are added to the command line of every tessera-node
	// instance (e.g. --health-probe-interval=1s).
	PluginArgs []string
	// Log receives progress lines; nil for silence.
	Log func(format string, args ...any)
}

// Node is a running real node.
type Node struct {
	opts        Options
	dir         string
	binDir      string
	runc        string
	cniBinDir   string
	nodeIP      string
	kubeletPort int
	healthzPort int
	client      kubernetes.Interface
	images      []string
	lock        *machineLock
	sysctls     map[string]string
	baseline    *Baseline // the machine before the node started

	anchor     *proc.Process
	containerd *proc.Process
	kubelet    *proc.Process
	started    []*Plugin
	// Plugin is the tessera-node instance Start started (nil with NoPlugin).
	Plugin *Plugin
}

// stateFile names, in the node's directory.
const (
	ownerFile   = "owner.pid"
	sysctlsFile = "sysctls"
	dirPrefix   = "trn-"
)

// kubeletTunables are the kernel tunables the kubelet sets at start
// (setupKernelTunables, protectKernelDefaults false); the node writes the
// old values back when it stops.
var kubeletTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// hostPathsToWatch are paths a kubelet or containerd would create on the
// host if the mount namespace did not hide them; Leftovers reports any that
// appeared.
var hostPathsToWatch = []string{
	"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/run/containerd", "/run/netns",
	"/var/log/pods", "/var/log/containers", "/etc/cni/net.d", "/opt/containerd", "/run/nri",
	"/usr/libexec/kubernetes", "/etc/kubernetes", "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-caps", "/var/run/cdi", "/run/tessera",
	"/var/lib/kubelet/device-plugins/kubelet.sock",
}

// Check says why this machine cannot run a real node, or returns nil: it
// needs root, runc and the CNI plugins (Debian's runc and
// containernetworking-plugins), busybox-static, unshare and nsenter
// (util-linux), and the binaries of sandbox/nodebin (hack/build-node.sh)
// in binDir (default BinDir()).
func Check(binDir string) error {
	problems := checkMachine()
	if binDir == "" {
		var err error
		if binDir, err = BinDir(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if binDir != "" {
		for _, b := range nodebin.All {
			if !executable(filepath.Join(binDir, b.Name)) {
				problems = append(problems, fmt.Sprintf("no %s in %s (build the node binaries with `make node-bin` or hack/build-node.sh)", b.Name, binDir))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// CheckMachine says why this machine cannot run a real node whatever
// binaries it had, or returns nil.
func CheckMachine() error {
	if problems := checkMachine(); len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

func checkMachine() []string {
	var problems []string
	if os.Geteuid() != 0 {
		problems = append(problems, "not running as root (the kubelet, containerd and runc need root)")
	}
	if _, err := findRunc(); err != nil {
		problems = append(problems, err.Error())
	}
	if _, err := findCNIBinDir(); err != nil {
		problems = append(problems, err.Error())
	}
	if err := checkStatic(BusyboxPath); err != nil {
		problems = append(problems, err.Error()+" (apt-get install busybox-static)")
	}
	for _, tool := range []string{"unshare", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			problems = append(problems, "no "+tool+" on PATH (util-linux, iproute2)")
		}
	}
	return problems
}

// checkStatic makes sure path is a statically linked executable: the test
// image holds it alone, without a C library.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("no usable %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the test image needs a static one", path)
		}
	}
	return nil
}

func findRunc() (string, error) {
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	return "", errors.New("no runc (apt-get install runc)")
}

func findCNIBinDir() (string, error) {
	for _, d := range []string{"/usr/lib/cni", "/opt/cni/bin"} {
		if _, err := os.Stat(filepath.Join(d, "bridge")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no CNI bridge plugin in /usr/lib/cni or /opt/cni/bin (apt-get install containernetworking-plugins)")
}

// BinDir returns where the node binaries are, or will be built: the
// directory of sandbox/nodebin ($TESSERA_NODE_BIN, else
// ~/.cache/tessera/node/<stamp>, which bin/node of a checkout links to). No
// checkout is needed.
func BinDir() (string, error) {
	return nodebin.Dir(context.Background(), nodebin.Options{})
}

// Start brings up the node: containerd, the kubelet (until its Node is Ready)
// and, unless NoPlugin, one tessera-node instance (until it has published
// and registered). On error everything started is torn down again.
func Start(ctx context.Context, opts Options) (n *Node, err error) {
	if opts.NodeName == "" || opts.Kubeconfig == "" || opts.TesseraNode == "" {
		return nil, errors.New("realnode: NodeName, Kubeconfig and TesseraNode are required")
	}
	if opts.Machine == "" {
		opts.Machine = "dgxh100"
	}
	if opts.GPUs == 0 {
		opts.GPUs = 4
	}
	if opts.KubeletVerbosity == 0 {
		opts.KubeletVerbosity = 2
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = BinDir(); err != nil {
			return nil, err
		}
	}
	if err := Check(opts.BinDir); err != nil {
		return nil, fmt.Errorf("this machine cannot run a real node: %w", err)
	}
	n = &Node{opts: opts, binDir: opts.BinDir}
	n.runc, _ = findRunc()
	n.cniBinDir, _ = findCNIBinDir()
	if n.nodeIP = opts.NodeIP; n.nodeIP == "" {
		if n.nodeIP, err = defaultNodeIP(); err != nil {
			return nil, err
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", opts.Kubeconfig, err)
	}
	if n.client, err = kubernetes.NewForConfig(rest.CopyConfig(cfg)); err != nil {
		return nil, err
	}

	if n.lock, err = acquireLock(ctx, opts.Log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if stopErr := n.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, stopErr)
			}
			n = nil
		}
	}()
	if err := sweepStale(); err != nil {
		return nil, fmt.Errorf("clean up after an earlier real node: %w", err)
	}
	n.baseline = TakeBaseline()
	// Unix socket paths are limited to 108 bytes: keep the directory short.
	if n.dir, err = os.MkdirTemp("", dirPrefix); err != nil {
		return nil, fmt.Errorf("node directory: %w", err)
	}
	if err := os.WriteFile(n.path(ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	if err := n.saveTunables(); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "images", "kubelet", "kubelet-pki", "pod-logs", "volume-plugins", "mps"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	if opts.PartitionConfig != "" {
		if err := os.WriteFile(n.path("partition.yaml"), []byte(opts.PartitionConfig), 0o644); err != nil {
			return nil, err
		}
	}
	if n.kubeletPort, err = freePort(n.nodeIP); err != nil {
		return nil, err
	}
	if n.healthzPort, err = freePort("127.0.0.1"); err != nil {
		return nil, err
	}
	if err := n.writeFakeTools(); err != nil {
		return nil, err
	}
	if err := n.buildImages(); err != nil {
		return nil, err
	}
	if err := createCgroup(runtimeCgroup); err != nil {
		return nil, err
	}
	opts.Log("starting the real node %s in %s (containerd, kubelet at %s:%d)", opts.NodeName, n.dir, n.nodeIP, n.kubeletPort)
	if err := n.startAnchor(); err != nil {
		return nil, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	opts.Log("  node %s Ready %s after the kubelet started", opts.NodeName, time.Since(start).Round(10*time.Millisecond))
	if !opts.NoPlugin {
		if n.Plugin, err = n.StartPlugin(ctx, PluginOptions{}); err != nil {
			return nil, err
		}
		opts.Log("  tessera-node published the mock GPUs of %s and registered with its kubelet", opts.NodeName)
	}
	return n, nil
}

func (n *Node) path(elem ...string) string { return filepath.Join(append([]string{n.dir}, elem...)...) }
func (n *Node) bin(name string) string     { return filepath.Join(n.binDir, name) }

// Dir is the node's directory (logs under logs/).
func (n *Node) Dir() string { return n.dir }

// Name is the Node's name.
func (n *Node) Name() string { return n.opts.NodeName }

// nodeEnv is the environment of the node's programs: a plain PATH with the
// given directories first, and nothing of the test's environment (no
// KUBECONFIG, no proxy settings).
func nodeEnv(first ...string) []string {
	path := append(append([]string{}, first...), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
	return []string{"PATH=" + strings.Join(path, ":"), "HOME=/root", "LANG=C.UTF-8"}
}

func (n *Node) saveTunables() error {
	var lines []string
	n.sysctls = map[string]string{}
	for _, t := range kubeletTunables {
		data, err := os.ReadFile("/proc/sys/" + t)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(data))
		n.sysctls[t] = v
		lines = append(lines, t+"="+v)
	}
	return os.WriteFile(n.path(sysctlsFile), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func restoreTunables(values map[string]string) error {
	var errs []error
	for t, v := range values {
		cur, err := os.ReadFile("/proc/sys/" + t)
		if err == nil && strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+t, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s=%s: %w", t, v, err))
		}
	}
	return errors.Join(errs...)
}

func readTunables(path string) map[string]string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// Stop tears the node down completely, whatever state it is in: the
// tessera-node instances, the kubelet and containerd end; every process left
// in the node's cgroups (shims, containers) is killed; the mount namespace
// (and with it every mount and network namespace) goes with its last
// process; the cgroups, the bridge and the directory are removed; the kernel
// tunables are restored; the Node object is deleted. It returns an error
// naming anything that could not be cleaned up. Safe to call more than once.
func (n *Node) Stop() error {
	if n == nil {
		return nil
	}
	var errs []error
	for _, p := range n.plugins() {
		p.Stop()
	}
	n.kubelet.Stop(syscall.SIGTERM, 30*time.Second)
	n.containerd.Stop(syscall.SIGTERM, 15*time.Second)
	if err := killCgroup(cgroupRoot, 20*time.Second); err != nil {
		errs = append(errs, err)
	}
	n.anchor.Stop(syscall.SIGKILL, 10*time.Second)
	if err := removeCgroup(cgroupRoot); err != nil {
		errs = append(errs, err)
	}
	if err := deleteBridge(); err != nil {
		errs = append(errs, err)
	}
	if n.sysctls != nil {
		if err := restoreTunables(n.sysctls); err != nil {
			errs = append(errs, err)
		}
		n.sysctls = nil
	}
	if n.client != nil && n.kubelet != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.client.CoreV1().Nodes().Delete(ctx, n.opts.NodeName, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete node %s: %w", n.opts.NodeName, err))
		}
	}
	if n.dir != "" && os.Getenv("TESSERA_KEEP_REAL_NODE") == "" {
		if mounts := hostMounts(n.dir); len(mounts) > 0 {
			errs = append(errs, fmt.Errorf("mounts left under %s: %v", n.dir, mounts))
		} else if err := os.RemoveAll(n.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", n.dir, err))
		}
	}
	if left := n.Leftovers(); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left behind: %s", strings.Join(left, "; ")))
	}
	n.lock.release()
	n.lock = nil
	return errors.Join(errs...)
}

// plugins are the tessera-node instances started so far (Stop ends them).
func (n *Node) plugins() []*Plugin { return n.started }

// Leftovers lists what of this node is still on the machine: processes of
// the node binaries or under the node's directory, cgroups, the bridge,
// mounts, veth interfaces, host paths the node's programs must never create.
// Empty when the machine is clean.
func (n *Node) Leftovers() []string {
	return n.baseline.leftovers(n.binDir, n.dir)
}

// Baseline is what the machine looked like before real nodes ran, for the
// check that they left nothing behind.
type Baseline struct {
	paths    map[string]bool
	veths    map[string]bool
	tunables map[string]string
}

// TakeBaseline records the machine's state now.
func TakeBaseline() *Baseline {
	b := &Baseline{paths: map[string]bool{}, veths: map[string]bool{}, tunables: map[string]string{}}
	for _, p := range hostPathsToWatch {
		if _, err := os.Lstat(p); err == nil {
			b.paths[p] = true
		}
	}
	for _, v := range vethInterfaces() {
		b.veths[v] = true
	}
	for _, t := range kubeletTunables {
		if data, err := os.ReadFile("/proc/sys/" + t); err == nil {
			b.tunables[t] = strings.TrimSpace(string(data))
		}
	}
	return b
}

// Leftovers lists anything of any real node found on the machine that was
// not there when the baseline was taken: processes of the node binaries (in
// binDir, default BinDir()) or under a node directory, node directories and
// the mounts under them, the cgroups, the bridge, veth interfaces, network
// namespaces in /run/netns, host paths, changed kernel tunables. It takes
// the machine lock first, so that a real node another process runs right
// now is not mistaken for a leftover.
func (b *Baseline) Leftovers(ctx context.Context, binDir string) []string {
	if binDir == "" {
		binDir, _ = BinDir()
	}
	lock, err := acquireLock(ctx, func(string, ...any) {})
	if err != nil {
		return []string{err.Error()}
	}
	defer lock.release()
	left := b.leftovers(binDir, filepath.Join(os.TempDir(), dirPrefix))
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		left = append(left, "node directory "+d)
	}
	for t, v := range b.tunables {
		if data, err := os.ReadFile("/proc/sys/" + t); err == nil && strings.TrimSpace(string(data)) != v {
			left = append(left, fmt.Sprintf("kernel tunable %s=%s (was %s)", t, strings.TrimSpace(string(data)), v))
		}
	}
	return left
}

func (b *Baseline) leftovers(binDir, dir string) []string {
	var left []string
	if b == nil {
		b = &Baseline{}
	}
	left = append(left, processesUnder(binDir, dir)...)
	for _, c := range cgroupsLeft(cgroupRoot) {
		left = append(left, "cgroup "+c)
	}
	if bridgeExists() {
		left = append(left, "network interface "+bridgeName)
	}
	for _, v := range vethInterfaces() {
		if !b.veths[v] {
			left = append(left, "veth interface "+v)
		}
	}
	if dir != "" {
		for _, m := range hostMounts(dir) {
			left = append(left, "mount "+m)
		}
	}
	for _, p := range hostPathsToWatch {
		if _, err := os.Lstat(p); err == nil && !b.paths[p] {
			left = append(left, "host path "+p)
		}
	}
	return left
}

// vethInterfaces lists the host's veth interfaces (a pod's network namespace
// that survived leaves its host end here).
func vethInterfaces() []string {
	entries, _ := os.ReadDir("/sys/class/net")
	var out []string
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/sys/class/net", e.Name(), "uevent"))
		if err == nil && strings.Contains(string(data), "DEVTYPE=veth") {
			out = append(out, e.Name())
		}
	}
	return out
}

// Sweep cleans up after real nodes whose process died without stopping them
// (see sweepStale); Start does it anyway. It waits for the machine lock.
func Sweep(ctx context.Context) error {
	lock, err := acquireLock(ctx, func(string, ...any) {})
	if err != nil {
		return err
	}
	defer lock.release()
	return sweepStale()
}

// sweepStale cleans up after a real node whose process died without
// stopping it (killed test binary): its processes died with it (Pdeathsig),
// except the shims and containers, which are in the node's cgroups.
func sweepStale() error {
	var errs []error
	if len(cgroupsLeft(cgroupRoot)) > 0 {
		if err := killCgroup(cgroupRoot, 20*time.Second); err != nil {
			errs = append(errs, err)
		}
		if err := removeCgroup(cgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteBridge(); err != nil {
		errs = append(errs, err)
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if t := readTunables(filepath.Join(dir, sysctlsFile)); t != nil {
			if err := restoreTunables(t); err != nil {
				errs = append(errs, err)
			}
		}
		if len(hostMounts(dir)) == 0 {
			_ = os.RemoveAll(dir)
		}
	}
	return errors.Join(errs...)
}

func bridgeExists() bool {
	_, err := os.Stat("/sys/class/net/" + bridgeName)
	return err == nil
}

func deleteBridge() error {
	if !bridgeExists() {
		return nil
	}
	if out, err := exec.Command("ip", "link", "delete", bridgeName).CombinedOutput(); err != nil && bridgeExists() {
		return fmt.Errorf("delete bridge %s: %w: %s", bridgeName, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// APIServerFlags are the kube-apiserver flags a control plane needs for a
// real node: the API server reaches the kubelet (logs, exec) at the Node's
// InternalIP, because its Hostname address (the node name) resolves nowhere.
var APIServerFlags = []string{"--kubelet-preferred-address-types=InternalIP"}
