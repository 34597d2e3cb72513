package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestBadFlagsAreNamed parses flags and runs without applying logging (which may happen only
// once per process).
func TestBadFlagsAreNamed(t *testing.T) {
	for args, want := range map[string]string{
		"--max-tries=0":          "--max-tries must be positive",
		"--parallelism=0":        "--parallelism must be positive",
		"--joint-steps=0":        "--joint-steps must be positive",
		"--min-cycle-interval=0": "--min-cycle-interval must be positive",
		"--kube-api-qps=0":       "--kube-api-qps and --kube-api-burst must be positive",
		"--leader-elect-lease-duration=1s --leader-elect-renew-deadline=2s": "--leader-elect-lease-duration (1s) must be longer",
		"--kubeconfig=/does/not/exist":                                      `--kubeconfig "/does/not/exist"`,
		"--shadow --shadow-deadlock-after=0":                                "--shadow-deadlock-after must be positive",
		"--consolidation-max-pods=-1":                                       "--consolidation-max-pods must not be negative",
		"--usage-weight=-1":                                                 "--usage-weight must not be negative",
		"--unfit-retry=-1s":                                                 "--unfit-retry must not be negative",
		"--memory-limit-ratio=1.5":                                          "--memory-limit-ratio must be in [0, 1]",
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o := newOptions()
		o.addFlags(fs)
		if err := fs.Parse(strings.Fields(args)); err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		err := run(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want it to contain %q", args, err, want)
		}
	}
}
