package draplugin

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"k8s.io/component-base/metrics/testutil"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/draplugin/executor"
	"github.com/tessera-gpu/tessera/draplugin/internal/faketools"
	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/test/framework"
)

// benchPrepare measures one claim's prepare (plan, two checkpoint writes
// with fsync, side effects, CDI spec) by calling the plugin directly, then
// unprepares it untimed, and reports p50/p99.
func benchPrepare(b *testing.B, e *env, p *Plugin, c *resourceapi.ResourceClaim) {
	b.Helper()
	var durations []time.Duration
	claims := []*resourceapi.ResourceClaim{c}
	un := []kubeletplugin.NamespacedObject{{UID: c.UID}}
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		res, err := p.PrepareResourceClaims(e.ctx, claims)
		durations = append(durations, time.Since(start))
		if err != nil || res[c.UID].Err != nil {
			b.Fatal(err, res[c.UID].Err)
		}
		b.StopTimer()
		if _, err := p.UnprepareResourceClaims(e.ctx, un); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, durations)
	e.release(c) // free the device for the next -count round
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	pct := func(q float64) float64 {
		return float64(d[min(len(d)-1, int(q*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

func BenchmarkPrepare(b *testing.B) {
	e := newEnv(b)
	p := e.start()
	b.Run("wholeGPU", func(b *testing.B) {
		c := e.claim(framework.UniqueName("bench-gpu"), []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
		benchPrepare(b, e, p, c)
	})
	b.Run("MIG", func(b *testing.B) {
		c := e.claim(framework.UniqueName("bench-mig"), []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].profile == "1g.10gb"`}})
		benchPrepare(b, e, p, c)
	})
	b.Run("fractionalMPS", func(b *testing.B) {
		// Each share claim starts its own MPS daemon, in a pod of its own
		// (the runner plays the kubelet; its container start is immediate,
		// a real kubelet's takes about a second more).
		c := e.claim(framework.UniqueName("bench-share"), []request{{name: "s", class: "shared", memory: "10Gi", compute: "25"}})
		benchPrepare(b, e, p, c)
	})
}

// BenchmarkPrepareMPS measures a share's prepare (1) when its MPS daemon
// must be started, in a pod (the default) and as a child process, and (2)
// when the daemon runs already (a retried prepare: it is adopted, its
// limits read back).
func BenchmarkPrepareMPS(b *testing.B) {
	e := newEnv(b)
	share := []request{{name: "s", class: "shared", memory: "10Gi", compute: "25"}}
	b.Run("daemonStarts/pod", func(b *testing.B) {
		p := e.start()
		benchPrepare(b, e, p, e.claim(framework.UniqueName("bench-pod"), share))
		p.Stop()
	})
	b.Run("daemonStarts/process", func(b *testing.B) {
		p := e.start(func(o *Options) { o.MPSLauncher = sharing.ProcessLauncher{Exec: executor.OS{}} })
		benchPrepare(b, e, p, e.claim(framework.UniqueName("bench-process"), share))
		p.Stop()
	})
	b.Run("daemonRuns", func(b *testing.B) {
		p := e.start(func(o *Options) { o.MPSLauncher = sharing.ProcessLauncher{Exec: executor.OS{}} })
		c := e.claim(framework.UniqueName("bench-runs"), share)
		spec := sharing.DaemonSpec{ID: string(c.UID), Claim: c.Namespace + "/" + c.Name, Devices: []string{gpuUUID(e, 2)}, PinnedMemoryMiB: []int64{10240}, ActiveThreadPercentage: 25}
		var durations []time.Duration
		for b.Loop() {
			b.StopTimer()
			if _, err := p.sharing.Start(e.ctx, spec); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start := time.Now()
			res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c})
			durations = append(durations, time.Since(start))
			if err != nil || res[c.UID].Err != nil {
				b.Fatal(err, res[c.UID].Err)
			}
			b.StopTimer()
			if _, err := p.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.StopTimer()
		reportPercentiles(b, durations)
		e.release(c)
		p.Stop()
	})
}

// BenchmarkRestartAdopts64 restarts the plugin on a node with 64 prepared
// MPS claims, each with its daemon in a pod: the timed part is Start, which
// reconciles the checkpoint and adopts every daemon (asks it, reads its
// limits back).
func BenchmarkRestartAdopts64(b *testing.B) {
	e := newEnvWith(b, 8, "default:\n  gpus:\n  - mode: shared\n    shared:\n      memoryStep: 256Mi\n      defaultMemory: 256Mi\n")
	claims := make([]*resourceapi.ResourceClaim, 64)
	for i := range claims {
		claims[i] = e.claim(fmt.Sprintf("c%d", i), []request{{name: "s", class: "shared", memory: "1Gi", compute: "5"}})
	}
	p := e.start()
	for i := 0; i < len(claims); i += 16 {
		if res, err := p.PrepareResourceClaims(e.ctx, claims[i:i+16]); err != nil {
			b.Fatal(err)
		} else {
			for _, r := range res {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
	}
	if n := len(faketools.AliveDaemons(e.mpsDir)); n != 64 {
		b.Fatalf("%d daemons", n)
	}
	var d []time.Duration
	for b.Loop() {
		b.StopTimer()
		p.Stop()
		b.StartTimer()
		start := time.Now()
		var err error
		p, err = Start(e.ctx, e.options())
		d = append(d, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got, _ := testutil.GetCounterMetricValue(p.metrics.recoveredActions.WithLabelValues("mps_adopted")); got != 64 {
		b.Fatalf("adopted %v daemons, want 64", got)
	}
	reportPercentiles(b, d)
	var un []kubeletplugin.NamespacedObject
	for _, c := range claims {
		un = append(un, kubeletplugin.NamespacedObject{UID: c.UID})
	}
	if _, err := p.UnprepareResourceClaims(e.ctx, un); err != nil {
		b.Fatal(err)
	}
	p.Stop()
}

// BenchmarkPrepared512 prepares 512 fractional claims (8 shared GPUs) and
// reports the heap their state takes (the plugin's only per-claim memory),
// the checkpoint size, the test process's peak RSS (API clients, node agent,
// mock and allocator included: an upper bound for the plugin) and the
// prepare latency of one more claim at that size.
func BenchmarkPrepared512(b *testing.B) {
	e := newEnvWith(b, 8, "default:\n  gpus:\n  - mode: shared\n    shared:\n      memoryStep: 256Mi\n      defaultMemory: 256Mi\n")
	claims := make([]*resourceapi.ResourceClaim, 512)
	for i := range claims {
		claims[i] = e.claim(fmt.Sprintf("c%d", i), []request{{name: "s", class: "shared", memory: "256Mi"}})
	}
	extra := e.claim("extra", []request{{name: "s", class: "shared", memory: "256Mi"}})
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	p := e.start()
	var wg sync.WaitGroup
	for i := 0; i < len(claims); i += 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := p.PrepareResourceClaims(e.ctx, claims[i:i+64])
			if err != nil {
				b.Error(err)
				return
			}
			for _, r := range res {
				if r.Err != nil {
					b.Error(r.Err)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(p.PreparedClaims()); n != 512 {
		b.Fatalf("%d prepared", n)
	}
	// The plugin's memory for its claims is its state: measure what the
	// state of 512 claims takes by loading it once more.
	path := filepath.Join(e.pluginDir, "checkpoint.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	// Ten copies make the measurement stand out of the background noise
	// (gRPC, node agent) of about a MiB.
	const copies = 10
	states := make([]*checkpoint.Checkpoint, copies)
	before := heap()
	for i := range states {
		if states[i], err = checkpoint.Decode(raw); err != nil {
			b.Fatal(err)
		}
	}
	after := heap()
	runtime.KeepAlive(states)
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	var d []time.Duration
	un := []kubeletplugin.NamespacedObject{{UID: extra.UID}}
	for b.Loop() {
		start := time.Now()
		if res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{extra}); err != nil || res[extra.UID].Err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(start))
		b.StopTimer()
		if _, err := p.UnprepareResourceClaims(e.ctx, un); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportPercentiles(b, d)
	b.ReportMetric((float64(after)-float64(before))/copies/(1<<20), "state-heap-MiB")
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmHWM:") {
				var kb float64
				_, _ = fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), "%f", &kb)
				b.ReportMetric(kb/1024, "process-peak-RSS-MiB")
			}
		}
	}
	b.ReportMetric(float64(st.Size())/1024, "checkpoint-KiB")
}

// BenchmarkPrepareGRPC is what the kubelet sees for a whole GPU: the
// NodePrepareResources call over the unix socket, including the helper's
// GET of the claim from the API server and its serialization lock.
func BenchmarkPrepareGRPC(b *testing.B) {
	e := newEnv(b)
	e.start()
	k := e.kubelet()
	c := e.claim(framework.UniqueName("bench-grpc"), []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
	var d []time.Duration
	for b.Loop() {
		start := time.Now()
		if r := k.prepare(b, e.ctx, c)[string(c.UID)]; r.Error != "" {
			b.Fatal(r.Error)
		}
		d = append(d, time.Since(start))
		b.StopTimer()
		k.unprepare(b, e.ctx, c)
		b.StartTimer()
	}
	reportPercentiles(b, d)
	e.release(c)
}
