package realnode

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupRoot is the kubelet's --cgroup-root and the parent of containerd's own
// cgroup: everything the node runs — containerd, its shims, the pods'
// containers — lives below it in every hierarchy, so teardown can kill what is
// left and remove the cgroups the kubelet and runc made. One name is enough:
// one real node per machine (lock.go).
const cgroupRoot = "tessera-realnode"

// runtimeCgroup holds containerd and the shims it starts.
const runtimeCgroup = cgroupRoot + "/runtime"

// cgroupHierarchies returns the mount points of the cgroup hierarchies
// (cgroup v1 controllers, the named systemd hierarchy and the unified one on
// a hybrid host; the single unified one on a cgroup v2 host).
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(s.Text())
		sep := -1
		for i, fld := range fields {
			if fld == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fs := fields[sep+1]; fs == "cgroup" || fs == "cgroup2" {
			out = append(out, fields[4])
		}
	}
	sort.Strings(out)
	return out, s.Err()
}

// createCgroup makes dir (relative to each hierarchy's root) in every
// hierarchy. A new cpuset cgroup of cgroup v1 starts with no CPUs and no
// memory nodes, so they are copied from the parent.
func createCgroup(rel string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := h
		for _, part := range strings.Split(rel, "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				cur, err := os.ReadFile(filepath.Join(dir, file))
				if err != nil || strings.TrimSpace(string(cur)) != "" {
					continue
				}
				if val, err := os.ReadFile(filepath.Join(parent, file)); err == nil {
					if err := os.WriteFile(filepath.Join(dir, file), val, 0o644); err != nil {
						return fmt.Errorf("set %s of %s: %w", file, dir, err)
					}
				}
			}
		}
	}
	return nil
}

// cgroupProcsFiles returns the cgroup.procs file of rel in every hierarchy,
// for a wrapper that moves itself there before it execs a program.
func cgroupProcsFiles(rel string) ([]string, error) {
	hs, err := cgroupHierarchies()
	if err != nil {
		return nil, err
	}
	var files []string
	for _, h := range hs {
		files = append(files, filepath.Join(h, rel, "cgroup.procs"))
	}
	return files, nil
}

// cgroupPIDs returns every process in rel and below, in any hierarchy.
func cgroupPIDs(rel string) []int {
	hs, _ := cgroupHierarchies()
	seen := map[int]bool{}
	for _, h := range hs {
		_ = filepath.Walk(filepath.Join(h, rel), func(path string, info os.FileInfo, err error) error {
			if err != nil || !info.IsDir() {
				return nil
			}
			data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, line := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(line); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// killCgroup kills every process in rel and below until none is left.
func killCgroup(rel string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPIDs(rel)
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v in cgroup %s survive SIGKILL", pids, rel)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeCgroup removes rel and every cgroup below it in every hierarchy,
// deepest first. The cgroups must be empty (killCgroup).
func removeCgroup(rel string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []string
	for _, h := range hs {
		top := filepath.Join(h, rel)
		var dirs []string
		_ = filepath.Walk(top, func(path string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			// An rmdir right after the last process left can see EBUSY.
			for range 50 {
				if err = syscall.Rmdir(dirs[i]); err == nil || os.IsNotExist(err) || err != syscall.EBUSY {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Sprintf("%s: %v", dirs[i], err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove cgroups: %s", strings.Join(errs, "; "))
	}
	return nil
}

// cgroupsLeft lists the hierarchies where rel still exists.
func cgroupsLeft(rel string) []string {
	hs, _ := cgroupHierarchies()
	var left []string
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, rel)); err == nil {
			left = append(left, filepath.Join(h, rel))
		}
	}
	return left
}
