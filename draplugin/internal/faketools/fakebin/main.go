// Command fakebin is the fake of nvidia-cuda-mps-control and nvidia-smi
// that draplugin's tests put on PATH (installed under both names; argv[0]
// selects the tool). It keeps state on disk (package state) and fails the
// way the tools fail, so that the plugin's daemon lifecycle is tested
// against something that remembers what was done to it:
//
// nvidia-cuda-mps-control, after the Legacy MPS v2 interface of NVIDIA's
// MPS documentation (Quick Start, Common Tasks, "Legacy MPS v2 Interface",
// "Environment Variables", "Static SM partitioning"):
//
//   - -d starts a control daemon on CUDA_MPS_PIPE_DIRECTORY (default
//     /tmp/nvidia-mps) for CUDA_VISIBLE_DEVICES, with the defaults
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("<ordinal>=<size>,...") and
//     CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from its environment; it creates
//     the control pipe and nvidia-cuda-mps-control.pid there and logs to
//     CUDA_MPS_LOG_DIRECTORY/control.log. -S (--static-partitioning) starts
//     it in static SM partitioning mode, which exists from version 13010
//     (CUDA 13.1) on; older versions reject the option.
//   - A daemon already running on the directory makes -d fail; so does a
//     stale control pipe left by a killed daemon (the socket's address is
//     in use): whoever starts a daemon must remove a stale pipe first.
//   - Without -d, commands are read from stdin, one per line, and sent to
//     the daemon. No daemon listening on the pipe (never started, quit, or
//     killed with its pipe left behind) fails every command with "Cannot
//     find MPS control daemon process" and exit status 1 — including quit.
//   - get_server_list prints one server PID per line; start_server -uid N;
//     get_client_list PID; get/set_default_active_thread_percentage;
//     get/set_default_device_pinned_mem_limit <ordinal> [<size>]; quit;
//     sm_partition add <uuid> <chunks> ("Partition <uuid>/<id> created"),
//     sm_partition rm <uuid> <partition>, lspart (static mode only).
//   - -v prints the version (FAKE_TOOLS_DIR/mps-version, default 12080).
//
// nvidia-smi: compute-policy -i <uuid> --set-timeslice <0..3> (not on MIG
// devices), -i <uuid> -c <DEFAULT|EXCLUSIVE_PROCESS|PROHIBITED|0|2|3> and
// --query-gpu=compute_mode.
//
// Every invocation is appended to FAKE_TOOLS_LOG; a file "fail-mps" or
// "fail-smi" in FAKE_TOOLS_DIR makes the tool fail.
package main

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/draplugin/internal/faketools/state"
)

func main() {
	var code int
	switch filepath.Base(os.Args[0]) {
	case "nvidia-cuda-mps-control":
		code = mps(os.Args[1:])
	case "nvidia-smi":
		code = smi(os.Args[1:])
	default:
		fmt.Fprintf(os.Stderr, "fakebin: unknown tool %q\n", os.Args[0])
		code = 127
	}
	os.Exit(code)
}

func toolsDir() string { return os.Getenv("FAKE_TOOLS_DIR") }

func failing(name string) bool {
	_, err := os.Stat(filepath.Join(toolsDir(), name))
	return toolsDir() != "" && err == nil
}

func record(line string) {
	path := os.Getenv("FAKE_TOOLS_LOG")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	_, _ = f.WriteString(line + "\n")
}

func version() string {
	if b, err := os.ReadFile(filepath.Join(toolsDir(), "mps-version")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "12080"
}

func versionAtLeast(min int) bool {
	v, err := strconv.Atoi(version())
	return err == nil && v >= min
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	return 1
}

func mps(args []string) int {
	pipeDir := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	logDir := envOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
	var stdin []string
	daemon, static := false, false
	for _, a := range args {
		switch a {
		case "-d":
			daemon = true
		case "-S", "--static-partitioning":
			static = true
		case "-v":
		default:
			record(fmt.Sprintf("nvidia-cuda-mps-control %s | pipe=%s", strings.Join(args, " "), pipeDir))
			return fail("nvidia-cuda-mps-control: unrecognized option %q", a)
		}
	}
	if !daemon && !slices.Contains(args, "-v") {
		raw, _ := io.ReadAll(os.Stdin)
		for _, l := range strings.Split(string(raw), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				stdin = append(stdin, l)
			}
		}
	}
	line := fmt.Sprintf("nvidia-cuda-mps-control %s | pipe=%s", strings.Join(args, " "), pipeDir)
	if daemon {
		line += fmt.Sprintf(" | visible=%s mem=%s threads=%s", os.Getenv("CUDA_VISIBLE_DEVICES"),
			os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), os.Getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
	} else if len(stdin) > 0 {
		line += " | stdin=" + strings.Join(stdin, "; ")
	}
	record(line)
	if failing("fail-mps") {
		return fail("fake failure")
	}
	if slices.Contains(args, "-v") {
		fmt.Printf("NVIDIA MPS control daemon version %s\n", version())
		return 0
	}
	if static && !versionAtLeast(13010) {
		return fail("nvidia-cuda-mps-control: unrecognized option '-S' (static SM partitioning needs version 13010 or later; this is %s)", version())
	}
	if _, err := os.Stat(pipeDir); !daemon && errors.Is(err, fs.ErrNotExist) {
		return fail("Cannot find MPS control daemon process")
	}
	unlock, err := state.LockDaemon(pipeDir)
	if err != nil {
		return fail("nvidia-cuda-mps-control: %v", err)
	}
	defer unlock()
	d, err := state.LoadDaemon(pipeDir)
	if err != nil {
		return fail("%v", err)
	}
	if daemon {
		return startDaemon(pipeDir, logDir, d, static)
	}
	if !d.Reachable(pipeDir) {
		return fail("Cannot find MPS control daemon process")
	}
	code := 0
	for _, cmd := range stdin {
		if c := command(pipeDir, d, cmd); c != 0 {
			code = c
		}
	}
	if err := state.SaveDaemon(pipeDir, d); err != nil {
		return fail("%v", err)
	}
	return code
}

var memLimit = regexp.MustCompile(`^[0-9]+[KMG]?$`)

func startDaemon(pipeDir, logDir string, d *state.Daemon, static bool) int {
	if d.Reachable(pipeDir) {
		return fail("An instance of this daemon is already running on %s", pipeDir)
	}
	if _, err := os.Stat(filepath.Join(pipeDir, state.ControlPipe)); err == nil {
		return fail("nvidia-cuda-mps-control: cannot bind %s: address already in use (stale control pipe)", filepath.Join(pipeDir, state.ControlPipe))
	}
	starts := 0
	if d != nil {
		starts = d.Starts
	}
	nd := &state.Daemon{Alive: true, PID: 10000 + rand.IntN(50000), Starts: starts + 1, LogDir: logDir, Version: version(), Static: static}
	if v := os.Getenv("CUDA_VISIBLE_DEVICES"); v != "" {
		nd.Visible = strings.Split(v, ",")
	}
	if v := os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); v != "" {
		nd.PinnedMemLimit = map[int]string{}
		for _, part := range strings.Split(v, ",") {
			idx, lim, ok := strings.Cut(part, "=")
			i, err := strconv.Atoi(idx)
			if !ok || err != nil || i < 0 || i >= max(len(nd.Visible), 1) || !memLimit.MatchString(lim) {
				return fail("nvidia-cuda-mps-control: invalid CUDA_MPS_PINNED_DEVICE_MEM_LIMIT entry %q", part)
			}
			nd.PinnedMemLimit[i] = lim
		}
	}
	if v := os.Getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); v != "" {
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p <= 0 || p > 100 {
			return fail("nvidia-cuda-mps-control: invalid CUDA_MPS_ACTIVE_THREAD_PERCENTAGE %q", v)
		}
		nd.ActiveThreadPercentage = p
	}
	if static {
		nd.Chunks, _ = strconv.Atoi(envOr("FAKE_MPS_CHUNKS", "16"))
		nd.ChunkSMs = 8
	}
	for _, dir := range []string{pipeDir, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail("nvidia-cuda-mps-control: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(pipeDir, state.ControlPipe), nil, 0o600); err != nil {
		return fail("nvidia-cuda-mps-control: %v", err)
	}
	if err := os.WriteFile(filepath.Join(pipeDir, state.PIDFile), []byte(strconv.Itoa(nd.PID)), 0o644); err != nil {
		return fail("nvidia-cuda-mps-control: %v", err)
	}
	if f, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintf(f, "[%s 0 %d] Starting control daemon\n", time.Now().UTC().Format("2006-01-02 15:04:05.000"), nd.PID)
		_ = f.Close()
	}
	if err := state.SaveDaemon(pipeDir, nd); err != nil {
		return fail("%v", err)
	}
	return 0
}

// command runs one control command against a reachable daemon.
func command(pipeDir string, d *state.Daemon, line string) int {
	f := strings.Fields(line)
	arg := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	switch f[0] {
	case "get_server_list":
		for _, s := range d.Servers {
			fmt.Println(s.PID)
		}
	case "start_server":
		if arg(1) != "-uid" {
			return fail("usage: start_server -uid <uid>")
		}
		uid, err := strconv.Atoi(arg(2))
		if err != nil {
			return fail("invalid uid %q", arg(2))
		}
		startServer(d, uid)
	case "get_client_list":
		pid, _ := strconv.Atoi(arg(1))
		for _, s := range d.Servers {
			if s.PID == pid {
				for i := 0; i < s.Clients; i++ {
					fmt.Println(pid + 1 + i)
				}
			}
		}
	case "get_default_active_thread_percentage":
		p := d.ActiveThreadPercentage
		if p == 0 {
			p = 100
		}
		fmt.Printf("%.1f\n", p)
	case "set_default_active_thread_percentage":
		p, err := strconv.ParseFloat(arg(1), 64)
		if err != nil || p <= 0 || p > 100 {
			return fail("invalid percentage %q", arg(1))
		}
		d.ActiveThreadPercentage = p
		fmt.Printf("%.1f\n", p)
	case "get_default_device_pinned_mem_limit":
		i, err := strconv.Atoi(arg(1))
		if err != nil || i < 0 || i >= max(len(d.Visible), 1) {
			return fail("invalid device %q", arg(1))
		}
		if lim, ok := d.PinnedMemLimit[i]; ok {
			fmt.Println(lim)
		} else {
			fmt.Println("0")
		}
	case "set_default_device_pinned_mem_limit":
		i, err := strconv.Atoi(arg(1))
		if err != nil || i < 0 || i >= max(len(d.Visible), 1) || !memLimit.MatchString(arg(2)) {
			return fail("usage: set_default_device_pinned_mem_limit <dev> <value>")
		}
		if d.PinnedMemLimit == nil {
			d.PinnedMemLimit = map[int]string{}
		}
		d.PinnedMemLimit[i] = arg(2)
	case "quit":
		d.Alive = false
		d.Servers = nil
		_ = os.Remove(filepath.Join(pipeDir, state.ControlPipe))
		_ = os.Remove(filepath.Join(pipeDir, state.PIDFile))
	case "sm_partition":
		return smPartition(d, f[1:])
	case "lspart":
		if !d.Static {
			return fail("static partitioning is not enabled on this daemon")
		}
		for _, dev := range d.Visible {
			used := 0
			for _, p := range d.Partitions {
				if p.Device == dev {
					used += p.Chunks
				}
			}
			fmt.Printf("%s free chunks %d, used chunks %d, free SM %d, used SM %d\n", dev, d.Chunks-used, used, (d.Chunks-used)*d.ChunkSMs, used*d.ChunkSMs)
			for _, p := range d.Partitions {
				if p.Device == dev {
					fmt.Printf("partition %s: %d chunks, %d SM\n", p.ID, p.Chunks, p.Chunks*d.ChunkSMs)
				}
			}
		}
	default:
		return fail("Unknown command %q", f[0])
	}
	return 0
}

// startServer starts the server for uid, with the daemon's current
// defaults, unless one runs.
func startServer(d *state.Daemon, uid int) {
	for _, s := range d.Servers {
		if s.UID == uid {
			return
		}
	}
	d.Servers = append(d.Servers, state.Server{PID: d.PID + 1 + len(d.Servers)*100, UID: uid,
		PinnedMemLimit: d.PinnedMemLimit, ActiveThreadPercentage: d.ActiveThreadPercentage})
}

func smPartition(d *state.Daemon, args []string) int {
	if !d.Static {
		return fail("static partitioning is not enabled on this daemon (start it with -S)")
	}
	if len(args) < 3 {
		return fail("usage: sm_partition add <device> <chunks> | sm_partition rm <device> <partition>")
	}
	dev := ""
	for _, v := range d.Visible {
		if strings.HasPrefix(v, args[1]) {
			dev = v
		}
	}
	if dev == "" {
		return fail("device %s is not visible to this daemon", args[1])
	}
	switch args[0] {
	case "add":
		n, err := strconv.Atoi(args[2])
		if err != nil || n < 1 {
			return fail("invalid number of chunks %q", args[2])
		}
		used := 0
		for _, p := range d.Partitions {
			if p.Device == dev {
				used += p.Chunks
			}
		}
		if used+n > d.Chunks {
			fmt.Printf("Failed to fulfill the requested SM partition of %d chunks, error CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION\n", n)
			return 0
		}
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d/%d", dev, d.PID, len(d.Partitions))))
		id := dev + "/" + base64.RawStdEncoding.EncodeToString(sum[:12])
		d.Partitions = append(d.Partitions, state.Partition{ID: id, Device: dev, Chunks: n})
		fmt.Printf("Partition %s created\n", id)
	case "rm":
		i := slices.IndexFunc(d.Partitions, func(p state.Partition) bool { return p.ID == args[2] || strings.HasSuffix(p.ID, "/"+args[2]) })
		if i < 0 {
			return fail("no partition %s on %s", args[2], dev)
		}
		d.Partitions = slices.Delete(d.Partitions, i, i+1)
	default:
		return fail("unknown sm_partition command %q", args[0])
	}
	return 0
}

func smi(args []string) int {
	record("nvidia-smi " + strings.Join(args, " "))
	if failing("fail-smi") {
		return fail("fake failure")
	}
	if err := os.MkdirAll(toolsDir(), 0o755); err != nil {
		return fail("nvidia-smi: %v", err)
	}
	unlock, err := state.Lock(toolsDir())
	if err != nil {
		return fail("nvidia-smi: %v", err)
	}
	defer unlock()
	gpus, err := state.LoadGPUs(toolsDir())
	if err != nil {
		return fail("%v", err)
	}
	gpu := func(id string) (*state.GPU, int) {
		if !strings.HasPrefix(id, "GPU-") {
			if strings.HasPrefix(id, "MIG-") {
				return nil, fail("Not supported on MIG device %s", id)
			}
			return nil, fail("No devices were found matching %q", id)
		}
		if gpus[id] == nil {
			gpus[id] = &state.GPU{}
		}
		return gpus[id], 0
	}
	var id, set, mode, query string
	policy := false
	for i := 0; i < len(args); i++ {
		next := func() string {
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch a := args[i]; {
		case a == "compute-policy":
			policy = true
		case a == "-i" || a == "--id":
			id = next()
		case a == "--set-timeslice":
			set = next()
		case a == "-c" || a == "--compute-mode":
			mode = next()
		case strings.HasPrefix(a, "--query-gpu="):
			query = strings.TrimPrefix(a, "--query-gpu=")
		case strings.HasPrefix(a, "--format="):
		default:
			return fail("Invalid combination of input arguments: %q", a)
		}
	}
	switch {
	case policy && set != "":
		g, code := gpu(id)
		if code != 0 {
			return code
		}
		n, err := strconv.Atoi(set)
		if err != nil || n < 0 || n > 3 {
			return fail("Invalid timeslice value %q: must be 0 (default), 1 (short), 2 (medium) or 3 (long)", set)
		}
		g.TimeSlice = n
		fmt.Printf("Set timeslice to %d for GPU %s.\n", n, id)
	case mode != "":
		g, code := gpu(id)
		if code != 0 {
			return code
		}
		names := map[string]string{"0": "Default", "DEFAULT": "Default", "2": "Prohibited", "PROHIBITED": "Prohibited", "3": "Exclusive_Process", "EXCLUSIVE_PROCESS": "Exclusive_Process"}
		m, ok := names[strings.ToUpper(mode)]
		if !ok {
			return fail("Invalid compute mode %q", mode)
		}
		g.ComputeMode = m
		fmt.Printf("Compute mode set to %s for GPU %s.\nAll done.\n", strings.ToUpper(m), id)
	case query == "compute_mode":
		g, code := gpu(id)
		if code != 0 {
			return code
		}
		fmt.Println(cmp(g.ComputeMode, "Default"))
	default:
		return fail("fake nvidia-smi: unsupported arguments %q", args)
	}
	if err := state.SaveGPUs(toolsDir(), gpus); err != nil {
		return fail("%v", err)
	}
	return 0
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
