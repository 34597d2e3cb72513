package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The node's programs (containerd with its shims, the kubelet) run in a mount
// namespace of their own, held open by an anchor process. In it:
//
//   - /run, /var/lib and /var/log are empty tmpfs: the paths the kubelet and
//     containerd use whatever they are told (the device-plugin socket
//     /var/lib/kubelet/device-plugins/kubelet.sock, /var/log/containers,
//     /run/containerd/s for the shims' sockets, the CNI result cache under
//     /var/lib/cni) exist only there and vanish with it;
//   - /dev is an overlay of the host's /dev and the node's driver root
//     (<dir>/driver-root/dev), so that the stand-in NVIDIA device nodes exist
//     at the /dev paths the CDI specs name without creating anything in the
//     host's /dev;
//   - every mount the kubelet makes (the bind mount of its root directory
//     onto itself, the pods' volumes) and every mount containerd makes (the
//     containers' root file systems, the network namespaces' bind mounts)
//     lives and dies with the namespace.
//
// When the anchor and every process that joined the namespace are gone, the
// kernel drops the namespace and all of its mounts: nothing can stay mounted
// on the host, whatever state a test left the node in.

// hiddenDirs are covered by an empty tmpfs in the node's mount namespace.
var hiddenDirs = []string{"/run", "/var/lib", "/var/log"}

// startAnchor starts the process that holds the node's mount namespace and
// waits until the namespace is set up.
func (n *Node) startAnchor() error {
	upper := n.path("driver-root", "dev")
	work := n.path("overlay", "work")
	merged := n.path("overlay", "dev")
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	ready := n.path("overlay", "ready")
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range hiddenDirs {
		fmt.Fprintf(&script, "mount -t tmpfs -o mode=0755 tessera-realnode %s\n", d)
	}
	fmt.Fprintf(&script, "mount -t overlay tessera-realnode-dev -o lowerdir=/dev,upperdir=%s,workdir=%s %s\n", upper, work, merged)
	for _, sub := range []string{"pts", "shm", "mqueue", "hugepages"} {
		fmt.Fprintf(&script, "if mountpoint -q /dev/%[1]s; then mount --rbind /dev/%[1]s %[2]s/%[1]s; fi\n", sub, merged)
	}
	fmt.Fprintf(&script, "mount --move %s /dev\n", merged)
	fmt.Fprintf(&script, "echo ok > %s\n", ready)
	fmt.Fprintf(&script, "exec %s\n", n.bin("pause"))
	p, err := startProcess("mount-namespace", n.path("logs", "mount-namespace.log"), nodeEnv(),
		"unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script.String())
	if err != nil {
		return err
	}
	n.anchor = p
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return nil
		}
		if done, err := p.exited(); done {
			return fmt.Errorf("set up the node's mount namespace: %w (%v): %s", errExited, err, p.logTail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the node's mount namespace was not set up within 10s: %s", p.logTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inNamespace returns argv prefixed so that it runs in the node's mount
// namespace.
func (n *Node) inNamespace(argv ...string) []string {
	return append([]string{"nsenter", "--mount=/proc/" + strconv.Itoa(n.anchor.pid()) + "/ns/mnt", "--"}, argv...)
}

// StandIn device numbers. A machine without a GPU has no NVIDIA driver, so
// the nodes are created with the major numbers the driver uses (195 for
// /dev/nvidia*; nvidia-uvm and nvidia-caps get dynamic majors, here 510 and
// 511); opening them fails with ENXIO, which no test does.
const (
	nvidiaMajor     = 195
	nvidiaCtlMinor  = 255
	nvidiaUVMMajor  = 510
	nvidiaCapsMajor = 511
	// capsPerGPU is the number of MIG capability minors the driver reserves
	// per GPU (draplugin/cdi: 3 + gpu·135 + gi·9, + 1 + ci).
	capsPerGPU = 135
)

// createDeviceNodes makes the stand-in device nodes of gpus GPUs under the
// driver root's dev directory: the nodes the CDI specs of draplugin name
// (whole GPUs, control nodes, MIG capabilities). When tessera-node's CDI
// specs carry the device numbers and host paths under a driver root, this
// directory becomes that driver root's /dev and the overlay is not needed.
func (n *Node) createDeviceNodes(gpus int) error {
	dev := n.path("driver-root", "dev")
	type node struct {
		path         string
		major, minor uint32
	}
	nodes := []node{
		{"nvidiactl", nvidiaMajor, nvidiaCtlMinor},
		{"nvidia-uvm", nvidiaUVMMajor, 0},
		{"nvidia-uvm-tools", nvidiaUVMMajor, 1},
		{"nvidia-caps/nvidia-cap1", nvidiaCapsMajor, 1},
		{"nvidia-caps/nvidia-cap2", nvidiaCapsMajor, 2},
	}
	for g := range gpus {
		nodes = append(nodes, node{"nvidia" + strconv.Itoa(g), nvidiaMajor, uint32(g)})
		for c := range capsPerGPU {
			minor := uint32(3 + g*capsPerGPU + c)
			nodes = append(nodes, node{"nvidia-caps/nvidia-cap" + strconv.Itoa(int(minor)), nvidiaCapsMajor, minor})
		}
	}
	if err := os.MkdirAll(filepath.Join(dev, "nvidia-caps"), 0o755); err != nil {
		return err
	}
	for _, nd := range nodes {
		mode := uint32(syscall.S_IFCHR | 0o666)
		if strings.HasPrefix(nd.path, "nvidia-caps/") {
			mode = syscall.S_IFCHR | 0o444
		}
		path := filepath.Join(dev, nd.path)
		if err := syscall.Mknod(path, mode, int(mkdev(nd.major, nd.minor))); err != nil && !os.IsExist(err) {
			return fmt.Errorf("mknod %s: %w", path, err)
		}
	}
	return nil
}

// mkdev encodes a device number as Linux's makedev does.
func mkdev(major, minor uint32) uint64 {
	return uint64(minor&0xff) | uint64(major&0xfff)<<8 | uint64(minor&^0xff)<<12 | uint64(major&^0xfff)<<32
}

// hostMounts returns the host's mounts (its mount namespace, seen by this
// process) whose mount point or source is under one of dirs.
func hostMounts(dirs ...string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"(cannot read mountinfo: " + err.Error() + ")"}
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		for _, d := range dirs {
			if d != "" && (strings.HasPrefix(fields[4], d) || strings.HasPrefix(fields[3], d)) {
				out = append(out, fields[4])
				break
			}
		}
	}
	return out
}
