package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// lockName is the machine-wide lock every real node holds while it runs. The
// kubelet's device-plugin socket path is fixed, the cgroup root and the bridge
// have fixed names, and two kubelets on two cores would starve each other:
// one real node per machine, whichever test binary or sandbox starts it.
//
// The lock is an abstract unix socket: binding it fails while another
// process holds it, the kernel releases it when the holder dies however it
// dies, and it leaves no file behind.
const lockName = "@tessera-realnode"

type machineLock struct{ ln net.Listener }

// acquireLock waits until no other real node runs on this machine.
func acquireLock(ctx context.Context, logf func(string, ...any)) (*machineLock, error) {
	said := false
	for {
		ln, err := net.Listen("unix", lockName)
		if err == nil {
			return &machineLock{ln: ln}, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("machine lock %s: %w", lockName, err)
		}
		if !said {
			logf("another real node runs on this machine; waiting for it to stop")
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the real node of another process to stop: %w", ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (l *machineLock) release() {
	if l != nil {
		_ = l.ln.Close()
	}
}

// Running reports whether a real node runs on this machine now (in any process).
func Running() bool {
	ln, err := net.Listen("unix", lockName)
	if err != nil {
		return true
	}
	_ = ln.Close()
	return false
}
