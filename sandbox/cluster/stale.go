package cluster

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

const (
	stalePrefix = "tessera-cp-"
	ownerFile   = "owner.pid"
)

// sweepStale removes control-plane directories whose test process is gone (a
// test binary killed before its cleanup ran). Their processes already died with
// it through Pdeathsig; only the files remain.
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), stalePrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.RemoveAll(dir)
		}
	}
}

func sortStrings(s []string) { sort.Strings(s) }
