package realnode

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
)

// kubeletConfig is the KubeletConfiguration of the node. Every path the kubelet
// would put outside its --root-dir is set (pod logs, volume plugins) or is
// inside the node's mount namespace (mountns.go).
func (n *Node) kubeletConfig() string {
	resolv := ""
	if _, err := os.Stat("/etc/resolv.conf"); err == nil {
		resolv = "/etc/resolv.conf"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 and no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupRoot: /%[1]s
containerRuntimeEndpoint: unix://%[2]s
address: %[3]s
port: %[4]d
healthzBindAddress: 127.0.0.1
healthzPort: %[5]d
readOnlyPort: 0
# The API server reaches the kubelet for logs without client certificates;
# this test node serves it anonymously.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
podLogsDir: %[6]s
volumePluginDir: %[7]s
resolvConf: %[8]q
# The test images are imported, not pulled: never collect them, and never
# evict pods because the shared disk of a test machine is busy.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1%%", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
serializeImagePulls: false
syncFrequency: 10s
%[9]s`, cgroupRoot, n.containerdSocket(), n.nodeIP, n.kubeletPort, n.healthzPort, n.path("pod-logs"), n.path("volume-plugins"), resolv, n.registerTaints())
}

// registerTaints is the registerWithTaints field for Options.Taints.
func (n *Node) registerTaints() string {
	if len(n.opts.Taints) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("registerWithTaints:\n")
	for _, t := range n.opts.Taints {
		fmt.Fprintf(&b, "- {key: %q, value: %q, effect: %q}\n", t.Key, t.Value, t.Effect)
	}
	return b.String()
}

// KubeletRootDir is the kubelet's --root-dir: the DRA plugin's registration
// socket goes into plugins_registry/ under it, its own directory into
// plugins/<driver>/.
func (n *Node) KubeletRootDir() string { return n.path("kubelet") }

func (n *Node) startKubelet(ctx context.Context) error {
	if err := os.WriteFile(n.path("kubelet.yaml"), []byte(n.kubeletConfig()), 0o644); err != nil {
		return err
	}
	var labels []string
	for k, v := range n.opts.Labels {
		labels = append(labels, k+"="+v)
	}
	sort.Strings(labels)
	args := []string{n.bin("kubelet"),
		"--config=" + n.path("kubelet.yaml"),
		"--kubeconfig=" + n.opts.Kubeconfig,
		"--root-dir=" + n.KubeletRootDir(),
		"--cert-dir=" + n.path("kubelet-pki"),
		"--node-ip=" + n.nodeIP,
		"--hostname-override=" + n.opts.NodeName,
		"--v=" + strconv.Itoa(n.opts.KubeletVerbosity),
	}
	if len(labels) > 0 {
		args = append(args, "--node-labels="+strings.Join(labels, ","))
	}
	var err error
	n.kubelet, err = proc.Start("kubelet", n.path("logs", "kubelet.log"), nodeEnv(n.binDir), n.inNamespace(args...)...)
	if err != nil {
		return err
	}
	return n.waitNodeReady(ctx, n.kubelet)
}

// waitNodeReady waits until the kubelet reports its Node Ready, then lifts
// the not-ready taint it registered with: the test control plane runs no
// node-lifecycle controller, which would do that in a cluster.
func (n *Node) waitNodeReady(ctx context.Context, kubelet *proc.Process) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		if done, err := kubelet.Exited(); done {
			return fmt.Errorf("kubelet: %w (%v): %s", proc.ErrExited, err, kubelet.LogTail(40))
		}
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.opts.NodeName, metav1.GetOptions{})
		if err == nil && nodeReady(node) {
			break
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("get node %s: %w", n.opts.NodeName, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s not Ready within 90s; kubelet log:\n%s", n.opts.NodeName, kubelet.LogTail(40))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.client.CoreV1().Nodes().Get(ctx, n.opts.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var kept []corev1.Taint
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = kept
		_, err = n.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// StopKubelet stops the kubelet (SIGTERM, as systemd does) and waits for it.
// Its pods keep running: containerd and the shims are not touched.
func (n *Node) StopKubelet() {
	n.kubelet.Stop(syscall.SIGTERM, 30*time.Second)
}

// StartKubelet starts the kubelet again on the same root directory (after
// StopKubelet) and waits until its Node is Ready.
func (n *Node) StartKubelet(ctx context.Context) error {
	if done, _ := n.kubelet.Exited(); !done {
		return fmt.Errorf("the kubelet of %s is still running", n.opts.NodeName)
	}
	return n.startKubelet(ctx)
}

// KubeletLog returns the end of the kubelet's log.
func (n *Node) KubeletLog(lines int) string { return n.kubelet.LogTail(lines) }

// ContainerdLog returns the end of containerd's log.
func (n *Node) ContainerdLog(lines int) string { return n.containerd.LogTail(lines) }

// freePort asks the kernel for a free TCP port on addr.
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// defaultNodeIP is the first global IPv4 address of an interface that is up
// and not loopback: the kubelet refuses a loopback --node-ip, and the API
// server reaches the kubelet there (kubectl logs).
func defaultNodeIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list network interfaces: %w", err)
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 || iface.Name == bridgeName {
			continue
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("no interface that is up has a global IPv4 address; the kubelet needs a non-loopback --node-ip")
}
