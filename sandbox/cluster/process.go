package cluster

import (
	"path/filepath"
	"syscall"
	"time"

	"github.com/tessera-gpu/tessera/sandbox/internal/proc"
)

// startProcess starts one control-plane binary with its log in logDir
// (see package proc: it cannot outlive the test binary).
func startProcess(name, binary, logDir string, args ...string) (*proc.Process, error) {
	return proc.Start(name, filepath.Join(logDir, name+".log"), nil, append([]string{binary}, args...)...)
}

// stopProcess asks a control-plane binary to terminate and kills it if it
// has not gone within the grace period.
func stopProcess(p *proc.Process, grace time.Duration) { p.Stop(syscall.SIGTERM, grace) }
