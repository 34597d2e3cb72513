package sharing

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/tessera-gpu/tessera/draplugin/cdi"
	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
)

func newController(t *testing.T) (*Controller, *faketools.Tools) {
	t.Helper()
	tools := faketools.Install(t)
	ex := executor.OS{}
	// Short root: MPS puts unix sockets into the pipe directory.
	root, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	return &Controller{Exec: ex, Root: root, Launcher: ProcessLauncher{Exec: ex}}, tools
}

var spec2 = DaemonSpec{ID: "c1", Claim: "ns/c1", Devices: []string{"MIG-a", "GPU-b"}, PinnedMemoryMiB: []int64{4096, 10240}, ActiveThreadPercentage: 25}

func TestDaemonLifecycle(t *testing.T) {
	c, tools := newController(t)
	ctx := context.Background()
	d, err := c.Start(ctx, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if d.Adopted || d.Pipe != filepath.Join(c.Root, "claims", "c1", "pipe") || d.Shm != filepath.Join(c.Root, "claims", "c1", "shm") {
		t.Errorf("daemon = %+v", d)
	}
	st, err := faketools.Daemon(d.Pipe)
	if err != nil || !st.Reachable(d.Pipe) {
		t.Fatalf("no daemon running: %+v %v", st, err)
	}
	// Both devices, in order, each with its limit, set on the daemon.
	if !reflect.DeepEqual(st.Visible, []string{"MIG-a", "GPU-b"}) || !reflect.DeepEqual(st.PinnedMemLimit, map[int]string{0: "4096M", 1: "10240M"}) || st.ActiveThreadPercentage != 25 {
		t.Errorf("daemon state %+v", st)
	}
	// A second start adopts it: one call asks whether it runs and reads
	// its limits.
	tools.Reset()
	if d, err := c.Start(ctx, spec2); err != nil || !d.Adopted {
		t.Fatalf("second start: %+v, %v", d, err)
	}
	if calls := tools.Calls(); len(calls) != 1 || !strings.Contains(calls[0], "get_server_list") {
		t.Errorf("adopting ran %q", calls)
	}
	if got, _ := c.Daemons(ctx); !reflect.DeepEqual(got, []string{"c1"}) {
		t.Errorf("Daemons = %v", got)
	}
	if err := c.Stop(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if faketools.Alive(d.Pipe) {
		t.Error("daemon alive after Stop")
	}
	if _, err := os.Stat(d.Root); !os.IsNotExist(err) {
		t.Errorf("directory left: %v", err)
	}
	// Stopping what is not there succeeds.
	if err := c.Stop(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
}

// TestStalePipe: a killed daemon leaves its control pipe. The next start
// on the directory asks the daemon, finds no answer, removes the stale
// pipe and starts a fresh daemon (the wave-1 controller took the pipe for
// a running daemon and started nothing).
func TestStalePipe(t *testing.T) {
	c, _ := newController(t)
	ctx := context.Background()
	d, err := c.Start(ctx, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if err := faketools.KillDaemon(d.Pipe); err != nil {
		t.Fatal(err)
	}
	if up, err := c.Alive(ctx, "c1"); err != nil || up {
		t.Fatalf("killed daemon: alive %v, %v", up, err)
	}
	again, err := c.Start(ctx, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if again.Adopted || !faketools.Alive(d.Pipe) {
		t.Fatalf("no fresh daemon after the old one was killed: %+v", again)
	}
}

// TestStopDeadDaemon: stopping a daemon that was killed succeeds (quit to a
// dead daemon fails; the wave-1 controller returned that error forever).
func TestStopDeadDaemon(t *testing.T) {
	c, tools := newController(t)
	ctx := context.Background()
	d, err := c.Start(ctx, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if err := faketools.KillDaemon(d.Pipe); err != nil {
		t.Fatal(err)
	}
	tools.Reset()
	if err := c.Stop(ctx, "c1"); err != nil {
		t.Fatalf("stopping a dead daemon: %v", err)
	}
	if len(tools.CallsMatching("quit")) != 0 {
		t.Errorf("quit sent to a daemon that does not answer: %q", tools.Calls())
	}
	if _, err := os.Stat(d.Root); !os.IsNotExist(err) {
		t.Errorf("directory left: %v", err)
	}
}

// TestLimitsSetBack: limits changed through the control pipe (a tenant
// with access to it) are set back when the daemon is adopted.
func TestLimitsSetBack(t *testing.T) {
	c, _ := newController(t)
	ctx := context.Background()
	d, err := c.Start(ctx, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec.Run(ctx, mpsCommand(d.Dirs, "set_default_device_pinned_mem_limit 1 80G", "set_default_active_thread_percentage 100")); err != nil {
		t.Fatal(err)
	}
	again, err := c.Start(ctx, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Corrected) != 2 {
		t.Errorf("corrected = %q", again.Corrected)
	}
	st, _ := faketools.Daemon(d.Pipe)
	if st.PinnedMemLimit[1] != "10240M" || st.ActiveThreadPercentage != 25 {
		t.Errorf("limits after adoption: %+v", st)
	}
}

func TestStaticPartitioning(t *testing.T) {
	c, tools := newController(t)
	ctx := context.Background()
	if caps := c.Capabilities(ctx); caps.StaticPartitioning || caps.Version != 12080 || !strings.Contains(caps.Reason, "13010") {
		t.Errorf("12080: %+v", caps)
	}
	tools.SetMPSVersion(t, "13040")
	c.caps = capsCache{}
	if caps := c.Capabilities(ctx); !caps.StaticPartitioning || !caps.V3 || caps.Version != 13040 {
		t.Errorf("13040: %+v", caps)
	}
	spec := DaemonSpec{ID: "s1", Claim: "ns/s1", Devices: []string{"GPU-x"}, PinnedMemoryMiB: []int64{8192}, StaticPartitioning: true, SMPercent: 25}
	d, err := c.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// 25% of the fake's 16 chunks.
	if !strings.HasPrefix(d.SMPartition, "GPU-x/") || d.SMPartitionChunks != 4 {
		t.Fatalf("partition %q of %d chunks", d.SMPartition, d.SMPartitionChunks)
	}
	st, _ := faketools.Daemon(d.Pipe)
	if !st.Static || len(st.Partitions) != 1 || st.ActiveThreadPercentage != 0 {
		t.Errorf("daemon %+v", st)
	}
	// Adopted: the daemon's partition is used, no second one.
	again, err := c.Start(ctx, spec)
	if err != nil || again.SMPartition != d.SMPartition {
		t.Fatalf("adopted partition %q, %v", again.SMPartition, err)
	}
	env, mounts := ClientEdits(again)
	if !reflect.DeepEqual(env, []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_SM_PARTITION=" + d.SMPartition}) {
		t.Errorf("env %q", env)
	}
	ms := map[string]string{}
	for _, m := range mounts {
		ms[m.ContainerPath] = m.HostPath
	}
	if _, err := faketools.Connect(faketools.Container{Mounts: ms}); err == nil {
		t.Error("a client that unset CUDA_MPS_SM_PARTITION got onto the GPU")
	}
	if cl, err := faketools.Connect(faketools.Container{Env: env, Mounts: ms}); err != nil || cl.Partition != d.SMPartition || cl.PinnedMemLimitMiB[0] != 8192 {
		t.Errorf("client %+v, %v", cl, err)
	}
}

func TestSpecValidate(t *testing.T) {
	for name, s := range map[string]DaemonSpec{
		"no devices":    {ID: "a"},
		"bad ID":        {ID: "../x", Devices: []string{"GPU-1"}},
		"newline in ID": {ID: "a\nquit", Devices: []string{"GPU-1"}},
		"bad UUID":      {ID: "a", Devices: []string{"GPU-1,GPU-2"}},
		"stdin in UUID": {ID: "a", Devices: []string{"GPU-1\nquit"}},
		"twice":         {ID: "a", Devices: []string{"GPU-1", "GPU-1"}},
		"threads":       {ID: "a", Devices: []string{"GPU-1"}, ActiveThreadPercentage: 101},
		"memory":        {ID: "a", Devices: []string{"GPU-1"}, PinnedMemoryMiB: []int64{-1}},
		"limits":        {ID: "a", Devices: []string{"GPU-1"}, PinnedMemoryMiB: []int64{1, 2}},
		"static no SMs": {ID: "a", Devices: []string{"GPU-1"}, StaticPartitioning: true},
		"static two":    {ID: "a", Devices: []string{"GPU-1", "GPU-2"}, StaticPartitioning: true, SMPercent: 10},
		"claim newline": {ID: "a", Claim: "ns/x\nquit", Devices: []string{"GPU-1"}},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("%s: %+v accepted", name, s)
		}
	}
	if err := spec2.Validate(); err != nil {
		t.Error(err)
	}
	// A spec that fails validation runs nothing.
	c, tools := newController(t)
	if _, err := c.Start(context.Background(), DaemonSpec{ID: "a", Devices: []string{"GPU-1 -S"}}); err == nil || len(tools.Calls()) != 0 {
		t.Errorf("bad spec: %v, calls %q", err, tools.Calls())
	}
}

func TestDaemonFlagsRoundTrip(t *testing.T) {
	in := DaemonFlags{Spec: DaemonSpec{ID: "c1", Claim: "ns/c1", Devices: []string{"MIG-a", "GPU-b"}, PinnedMemoryMiB: []int64{4096, 0}, ActiveThreadPercentage: 25}, MPSDir: "/run/tessera/mps", Chroot: "/driver-root"}
	var out DaemonFlags
	fs := newFlagSet()
	out.AddFlags(fs)
	if err := fs.Parse(in.Args()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) || out.Validate() != nil {
		t.Errorf("round trip %+v → %+v (%v)", in, out, out.Validate())
	}
}

// TestRunDaemon is a daemon pod's main loop: it starts the daemon, returns
// an error when the daemon stops answering (the kubelet restarts the
// container), and quits the daemon when the pod goes.
func TestRunDaemon(t *testing.T) {
	c, _ := newController(t)
	dirs := c.Dirs(spec2.ID)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunDaemon(ctx, c.Exec, spec2, dirs, 10*time.Millisecond) }()
	waitAlive(t, dirs.Pipe, true)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitAlive(t, dirs.Pipe, false)

	// Killed under it: RunDaemon fails.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- RunDaemon(ctx, c.Exec, spec2, dirs, 10*time.Millisecond) }()
	waitAlive(t, dirs.Pipe, true)
	if err := faketools.KillDaemon(dirs.Pipe); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stopped answering") {
			t.Fatalf("RunDaemon after the daemon died: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunDaemon did not notice the daemon died")
	}
}

func waitAlive(t *testing.T, pipe string, want bool) {
	t.Helper()
	for i := 0; i < 500; i++ {
		if faketools.Alive(pipe) == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("daemon on %s alive != %v", pipe, want)
}

func TestGPUSettings(t *testing.T) {
	tools := faketools.Install(t)
	g := GPUSettings{Exec: executor.OS{}}
	ctx := context.Background()
	if err := g.SetTimeSlice(ctx, "GPU-2", TimeSliceLong); err != nil {
		t.Fatal(err)
	}
	if err := g.SetComputeMode(ctx, "GPU-2", ComputeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	if mode, ts := tools.GPU("GPU-2"); mode != "Exclusive_Process" || ts != 3 {
		t.Errorf("GPU-2: %s, %d", mode, ts)
	}
	for _, err := range []error{
		g.SetTimeSlice(ctx, "GPU-2", 4),
		g.SetTimeSlice(ctx, "MIG-2", 1),
		g.SetTimeSlice(ctx, "GPU-2 --help", 1),
		g.SetComputeMode(ctx, "GPU-2", "PROHIBITED"),
	} {
		if err == nil {
			t.Error("bad setting accepted")
		}
	}
	if n := len(tools.Calls()); n != 2 {
		t.Errorf("%d tool calls, want 2 (bad settings run nothing): %q", n, tools.Calls())
	}
}

func TestClientEdits(t *testing.T) {
	env, mounts := ClientEdits(Daemon{Dirs: DirsOf("/run/tessera/mps", "c1")})
	if !reflect.DeepEqual(env, []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}) {
		t.Errorf("env = %q: no limit belongs in the client's environment", env)
	}
	want := []cdi.Mount{
		{HostPath: "/run/tessera/mps/claims/c1/pipe", ContainerPath: "/tmp/nvidia-mps"},
		{HostPath: "/run/tessera/mps/claims/c1/shm", ContainerPath: "/dev/shm"},
	}
	if !reflect.DeepEqual(mounts, want) {
		t.Errorf("mounts = %+v", mounts)
	}
}

func TestLegacyDaemon(t *testing.T) {
	c, _ := newController(t)
	ctx := context.Background()
	// A v2 daemon for a device, started as wave 1 did.
	legacy := c.legacyDirs("GPU-9")
	if _, err := c.Exec.Run(ctx, executor.Command{Name: MPSControl, Args: []string{"-d"}, Env: []string{"CUDA_VISIBLE_DEVICES=GPU-9", "CUDA_MPS_PIPE_DIRECTORY=" + legacy.Pipe, "CUDA_MPS_LOG_DIRECTORY=" + legacy.Log}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, spec2); err != nil {
		t.Fatal(err)
	}
	if got, err := c.LegacyDaemons(); err != nil || !reflect.DeepEqual(got, []string{"GPU-9"}) {
		t.Fatalf("legacy daemons %v, %v (the claims directory is not one)", got, err)
	}
	if err := c.StopLegacy(ctx, "GPU-9"); err != nil {
		t.Fatal(err)
	}
	if faketools.Alive(legacy.Pipe) {
		t.Error("legacy daemon alive")
	}
	if got, _ := c.LegacyDaemons(); len(got) != 0 {
		t.Errorf("legacy daemons after stop: %v", got)
	}
}

func newFlagSet() *pflag.FlagSet { return pflag.NewFlagSet("mps-daemon", pflag.ContinueOnError) }
