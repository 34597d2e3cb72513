package operators

import (
	"flag"
	"os"

	"k8s.io/klog/v2"
)

// KLOG_V=4 go test ./test/e2e/operators shows the logs of the in-process
// components (scheduler, resolver, node agents) at that verbosity.
func init() {
	if v := os.Getenv("KLOG_V"); v != "" {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("v", v)
	}
}
