package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestFlagsReachSchedulerOptions: the flags whose 0 means "off" become the Options' -1 (whose
// 0 means "the default"), and other values pass through unchanged.
func TestFlagsReachSchedulerOptions(t *testing.T) {
	for _, tc := range []struct {
		args                 string
		unfitRetry           time.Duration
		consolidationMaxPods int
	}{
		{args: "", unfitRetry: 30 * time.Second, consolidationMaxPods: 16},
		{args: "--unfit-retry=2m --consolidation-max-pods=4", unfitRetry: 2 * time.Minute, consolidationMaxPods: 4},
		{args: "--unfit-retry=0 --consolidation-max-pods=0", unfitRetry: -1, consolidationMaxPods: -1},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o := newOptions()
		o.addFlags(fs)
		if err := fs.Parse(strings.Fields(tc.args)); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		opts := o.schedulerOptions()
		if opts.UnfitRetry != tc.unfitRetry || opts.ConsolidationMaxPods != tc.consolidationMaxPods {
			t.Errorf("%q: UnfitRetry %s, ConsolidationMaxPods %d; want %s, %d", tc.args, opts.UnfitRetry, opts.ConsolidationMaxPods, tc.unfitRetry, tc.consolidationMaxPods)
		}
	}
}
