package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestShadowDecidesWithThePolicyFlags: the shadow's decisions use the policy flags the
// acting scheduler uses (a shadow that ignored --usage-weight or --consolidation-max-pods
// would report decisions tessera would not make).
func TestShadowDecidesWithThePolicyFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		halfLife  time.Duration
		weight    float64
		maxMoves  int
		topoFirst string
	}{
		{args: []string{"--shadow", "--usage-half-life=30m", "--usage-weight=0.5", "--consolidation-max-pods=4", "--topology-keys=example.com/rack"},
			halfLife: 30 * time.Minute, weight: 0.5, maxMoves: 4, topoFirst: "example.com/rack"},
		{args: []string{"--shadow", "--consolidation-max-pods=0"}, halfLife: time.Hour, weight: 1, maxMoves: -1}, // the flags' defaults
	} {
		o := newOptions()
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		o.addFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		opts := shadowOptions(o)
		if opts.UsageHalfLife != tc.halfLife || opts.UsageWeight != tc.weight || opts.MaxConsolidationMoves != tc.maxMoves {
			t.Errorf("%v: shadow options half-life %v weight %v consolidation %d; want %v %v %d",
				tc.args, opts.UsageHalfLife, opts.UsageWeight, opts.MaxConsolidationMoves, tc.halfLife, tc.weight, tc.maxMoves)
		}
		if tc.topoFirst != "" && (len(opts.Solver.TopologyKeys) == 0 || opts.Solver.TopologyKeys[0] != tc.topoFirst) {
			t.Errorf("%v: shadow topology keys %v", tc.args, opts.Solver.TopologyKeys)
		}
	}
}
