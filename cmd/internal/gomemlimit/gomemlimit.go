// Package gomemlimit gives each tessera binary a Go soft memory limit below its
// container's memory limit, so that the garbage collector works harder as the heap
// nears the limit instead of the kernel OOM-killing the process. Without it the Go
// runtime lets the heap grow to about twice the live heap between collections
// (GOGC=100): a tessera-scheduler holding 1.7 GiB of MIG ResourceSlices
// (docs/benchmarks.md) would reach about 3.5 GiB under a 2 GiB limit.
//
// The cgroup (v1 or v2) is read by github.com/KimMachineGun/automemlimit, the
// library Prometheus and others use for the same purpose. Its environment variables
// apply as documented there: GOMEMLIMIT set leaves the runtime's limit alone, and
// AUTOMEMLIMIT (a ratio, or "off") overrides the flag.
package gomemlimit

import (
	"fmt"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"k8s.io/klog/v2"
)

// DefaultRatio is the share of the container's memory limit given to the Go heap
// and runtime; the rest covers what the Go runtime does not count (cgo, the
// binary's mapped text, kernel buffers charged to the cgroup).
const DefaultRatio = 0.9

// FlagUsage is the help text of each binary's --memory-limit-ratio flag.
const FlagUsage = "Share of the container's memory limit (its cgroup's) given to the Go runtime as its soft memory limit, so the garbage collector works harder near the limit instead of the process being OOM-killed; 0 leaves the runtime's default. GOMEMLIMIT or AUTOMEMLIMIT in the environment takes precedence."

// Validate checks a --memory-limit-ratio value.
func Validate(ratio float64) error {
	if !(ratio >= 0 && ratio <= 1) { // also rejects NaN
		return fmt.Errorf("--memory-limit-ratio must be in [0, 1], got %g", ratio)
	}
	return nil
}

// Set sets the runtime's soft memory limit to ratio × the cgroup's memory limit and
// returns the limit now in force. With ratio 0, or GOMEMLIMIT set in the
// environment, it changes nothing; a cgroup without a limit leaves none.
func Set(ratio float64) (int64, error) {
	return set(ratio, memlimit.FromCgroup)
}

// Apply is Set for a binary's start: a cgroup that cannot be read is logged, not
// fatal, and the binary runs as it would without the flag (the ratio was validated
// with the other flags).
func Apply(logger klog.Logger, ratio float64) {
	limit, err := Set(ratio)
	if err != nil {
		logger.Error(err, "Go memory limit not set from the container's")
		return
	}
	logger.V(1).Info("Go memory limit", "bytes", limit, "ratio", ratio)
}

// set leaves the library's logger off: its one error is the one returned, logged by Apply.
func set(ratio float64, provider memlimit.Provider) (int64, error) {
	if err := Validate(ratio); err != nil {
		return debug.SetMemoryLimit(-1), err
	}
	if ratio == 0 {
		return debug.SetMemoryLimit(-1), nil
	}
	limit, err := memlimit.Set(
		memlimit.WithRatio(ratio),
		memlimit.WithProvider(provider),
	)
	if err != nil {
		return limit, fmt.Errorf("go memory limit from the cgroup: %w", err)
	}
	return limit, nil
}
