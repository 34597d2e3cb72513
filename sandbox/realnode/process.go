package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// processesUnder returns the PIDs of processes whose executable or command
// line names a path under dir (what a node left running, for the leak check).
func processesUnder(dirs ...string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		args := strings.ReplaceAll(string(cmdline), "\x00", " ")
		for _, d := range dirs {
			if d != "" && (strings.HasPrefix(exe, d) || strings.Contains(args, d)) {
				found = append(found, fmt.Sprintf("pid %d: %s", pid, strings.TrimSpace(args)))
				break
			}
		}
	}
	return found
}
