package realnode

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
)

// The node's programs (containerd with its shims, the kubelet) run in a mount
// namespace of their own, held open by an anchor process. In it:
//
//   - /run, /var/lib and /var/log are empty tmpfs: the paths the kubelet and
//     containerd use whatever they are told (the device-plugin socket
//     /var/lib/kubelet/device-plugins/kubelet.sock, /var/log/containers,
//     /run/containerd/s for the shims' sockets, the CNI result cache under
//     /var/lib/cni) exist only there and vanish with it;
//   - /dev is the host's: tessera-node's CDI specs give every device node
//     with its type, major and minor (nvcdi's edits from the mock machine's
//     driver root, completed by draplugin/cdi), so containerd never stats a
//     host path and runc creates the nodes inside each container; nothing
//     NVIDIA needs to exist on the host;
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
	ready := n.path("mount-namespace.ready")
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, d := range hiddenDirs {
		fmt.Fprintf(&script, "mount -t tmpfs -o mode=0755 tessera-realnode %s\n", d)
	}
	fmt.Fprintf(&script, "echo ok > %s\n", ready)
	fmt.Fprintf(&script, "exec %s\n", n.bin("pause"))
	p, err := proc.Start("mount-namespace", n.path("logs", "mount-namespace.log"), nodeEnv(),
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
		if done, err := p.Exited(); done {
			return fmt.Errorf("set up the node's mount namespace: %w (%v): %s", proc.ErrExited, err, p.LogTail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the node's mount namespace was not set up within 10s: %s", p.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inNamespace returns argv prefixed so that it runs in the node's mount
// namespace.
func (n *Node) inNamespace(argv ...string) []string {
	return append([]string{"nsenter", "--mount=/proc/" + strconv.Itoa(n.anchor.Pid()) + "/ns/mnt", "--"}, argv...)
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
