package cluster

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
)

// Components that Restart can restart.
const (
	ComponentEtcd      = "etcd"
	ComponentAPIServer = "kube-apiserver"
)

// Restart kills one component of the control plane (etcd or kube-apiserver)
// with SIGKILL, as a crash or an OOM kill would, starts it again with the
// same command line (same ports, same data directory; its log continues),
// and waits until the API server is ready again. It is for fault tests (the
// chaos run); callers must not restart concurrently.
func (cp *ControlPlane) Restart(ctx context.Context, component string) error {
	var p **proc.Process
	switch component {
	case ComponentEtcd:
		p = &cp.etcd
	case ComponentAPIServer:
		p = &cp.apiserver
	default:
		return fmt.Errorf("restart %q: only %s and %s can be restarted", component, ComponentEtcd, ComponentAPIServer)
	}
	old := *p
	if old == nil {
		return fmt.Errorf("restart %s: not running", component)
	}
	old.Stop(syscall.SIGKILL, 10*time.Second)
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return fmt.Errorf("restart %s: client: %w", component, err)
	}
	// A component that exits at once (its port still held a moment after
	// the kill) is started again, a few times.
	for attempt := 1; ; attempt++ {
		*p, err = proc.Start(old.Name, old.LogPath, old.Env(), old.Argv()...)
		if err != nil {
			return fmt.Errorf("restart %s: %w", component, err)
		}
		err = cp.waitReady(ctx, client)
		if done, _ := (*p).Exited(); err == nil || !done || attempt == 5 {
			return err
		}
		time.Sleep(time.Second)
	}
}
