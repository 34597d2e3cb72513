package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// FuzzFlags: any command line (arguments separated by newlines) is parsed
// and validated or refused with an error naming the flag, never a panic;
// what validates is what the scheduler can start with — in particular a
// leader election client-go accepts (checked here, where run would fail
// only after connecting to the API server). Seeds:
// testdata/fuzz/FuzzFlags (the chart's command line and bad values).
func FuzzFlags(f *testing.F) {
	f.Fuzz(func(t *testing.T, cmdline string) {
		var args []string
		if cmdline != "" {
			args = strings.Split(cmdline, "\n")
		}
		fs := pflag.NewFlagSet("tessera-scheduler", pflag.ContinueOnError)
		fs.SetOutput(discard{})
		o := newOptions()
		o.addFlags(fs)
		if err := fs.Parse(args); err != nil {
			return // pflag's own error: it names the flag or the argument
		}
		if err := o.validate(); err != nil {
			if !strings.Contains(err.Error(), "--") {
				t.Fatalf("validation error names no flag: %v", err)
			}
			return
		}
		if o.schedulerName == "" || o.maxTries <= 0 || o.period <= 0 || o.parallelism <= 0 || o.jointSteps <= 0 || o.maxSteps <= 0 || o.volumeBind <= 0 {
			t.Fatalf("accepted %+v", o)
		}
		if o.leaderElect {
			_, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock:          &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: o.leaseNamespace, Name: o.leaseName}, LockConfig: resourcelock.ResourceLockConfig{Identity: "fuzz"}},
				LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod,
				Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
			})
			if err != nil {
				t.Fatalf("validated leader election refused by client-go: %v", err)
			}
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
