package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Leader election of the two replicas: short, so that a killed leader's
// Lease expires within the run's recovery budget (the defaults are 15s/10s/2s).
const (
	leaseDuration = 8 * time.Second
	renewDeadline = 5 * time.Second
	retryPeriod   = time.Second
	leaseName     = "tessera-scheduler"
	leaseNS       = "kube-system"
)

// replica is one tessera-scheduler process (the real binary, leader election on).
type replica struct {
	slot int
	cmd  *exec.Cmd
	done chan struct{}
}

func (e *env) startReplica(slot int) (*replica, error) {
	logFile, err := os.OpenFile(filepath.Join(e.dir, fmt.Sprintf("tessera-scheduler-%d.log", slot)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(e.bin.scheduler,
		"--kubeconfig="+e.proxyKubeconfig,
		"--leader-elect",
		"--leader-elect-resource-namespace="+leaseNS,
		"--leader-elect-resource-name="+leaseName,
		"--leader-elect-lease-duration="+leaseDuration.String(),
		"--leader-elect-renew-deadline="+renewDeadline.String(),
		"--leader-elect-retry-period="+retryPeriod.String(),
		"--secure-port=0", // two replicas on one host
		"--v=2",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start tessera-scheduler: %w", err)
	}
	r := &replica{slot: slot, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(r.done) }()
	return r, nil
}

func (r *replica) kill() {
	select {
	case <-r.done:
	default:
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
}

// stop sends SIGTERM to the replica and waits up to grace for it to exit,
// then kills it (as the kubelet ends a container); exited: within grace.
func (r *replica) stop(grace time.Duration) (took time.Duration, exited bool) {
	start := time.Now()
	select {
	case <-r.done:
		return 0, true
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
		return time.Since(start), true
	case <-time.After(grace):
		r.kill()
		return time.Since(start), false
	}
}

func (r *replica) alive() bool {
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// leader returns the replica holding the Lease (its identity is
// <hostname>_<pid>), or nil.
func (e *env) leader(ctx context.Context) *replica {
	lease, err := e.kube.CoordinationV1().Leases(leaseNS).Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return nil
	}
	id := *lease.Spec.HolderIdentity
	i := strings.LastIndex(id, "_")
	if i < 0 {
		return nil
	}
	pid := id[i+1:]
	for _, r := range e.replicas {
		if r != nil && strconv.Itoa(r.cmd.Process.Pid) == pid && r.alive() {
			return r
		}
	}
	return nil
}
