package gomemlimit

import (
	"errors"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// isolate restores the process's memory limit after the test and clears the
// variables through which the environment overrides the flag.
func isolate(t *testing.T) {
	t.Helper()
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, v := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		if old, ok := os.LookupEnv(v); ok {
			t.Setenv(v, old) // restores it after the test
			if err := os.Unsetenv(v); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// counting returns a provider of limit that counts its calls.
func counting(limit uint64, err error) (memlimit.Provider, *int) {
	calls := 0
	return func() (uint64, error) { calls++; return limit, err }, &calls
}

func TestSetAppliesRatioOfCgroupLimit(t *testing.T) {
	isolate(t)
	const container = 2 << 30 // a 2 GiB container
	provider, _ := counting(container, nil)
	got, err := set(0.9, provider)
	if err != nil {
		t.Fatal(err)
	}
	const want = container * 9 / 10 // 1,932,735,283 bytes
	if got != want || debug.SetMemoryLimit(-1) != want {
		t.Errorf("limit %d, runtime %d; want %d", got, debug.SetMemoryLimit(-1), want)
	}
}

func TestSetLeavesLimitAlone(t *testing.T) {
	for name, tc := range map[string]struct {
		ratio float64
		env   string
	}{
		"ratio 0":           {ratio: 0},
		"GOMEMLIMIT is set": {ratio: 0.9, env: "700MiB"},
	} {
		t.Run(name, func(t *testing.T) {
			isolate(t)
			if tc.env != "" {
				t.Setenv("GOMEMLIMIT", tc.env)
			}
			before := debug.SetMemoryLimit(-1)
			provider, calls := counting(1<<30, nil)
			got, err := set(tc.ratio, provider)
			if err != nil {
				t.Fatal(err)
			}
			if got != before || debug.SetMemoryLimit(-1) != before || *calls != 0 {
				t.Errorf("limit %d (runtime %d, cgroup read %d times); want %d, unread", got, debug.SetMemoryLimit(-1), *calls, before)
			}
		})
	}
}

func TestSetWithoutCgroupLimit(t *testing.T) {
	isolate(t)
	debug.SetMemoryLimit(1 << 30)
	provider, _ := counting(0, memlimit.ErrNoLimit)
	got, err := set(0.9, provider)
	if err != nil {
		t.Fatal(err)
	}
	if got != math.MaxInt64 || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("limit %d; want none (MaxInt64)", got)
	}
}

func TestSetErrors(t *testing.T) {
	isolate(t)
	debug.SetMemoryLimit(3 << 30)
	unreadable := errors.New("open /sys/fs/cgroup/memory.max: permission denied")
	provider, _ := counting(0, unreadable)
	if _, err := set(0.9, provider); !errors.Is(err, unreadable) {
		t.Errorf("error %v; want it to wrap %v", err, unreadable)
	}
	for _, bad := range []float64{-0.1, 1.5, math.NaN()} {
		if _, err := set(bad, provider); err == nil || !strings.Contains(err.Error(), "--memory-limit-ratio") {
			t.Errorf("ratio %g: error %v; want one naming the flag", bad, err)
		}
	}
	if got := debug.SetMemoryLimit(-1); got != 3<<30 {
		t.Errorf("a failed Set changed the limit to %d", got)
	}
}
