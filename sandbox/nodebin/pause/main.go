// Command pause is the sandbox ("pause") container of a real node (the
// real-node tests, `tessera sandbox up --real-node`): it holds the pod's
// namespaces, reaps the zombies that processes of the pod leave to it (it is
// PID 1 when the pod shares its PID namespace), and exits on SIGINT or
// SIGTERM, like the kubelet's registry.k8s.io/pause. It is built statically by
// sandbox/nodebin (hack/build-node.sh), because there is no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
