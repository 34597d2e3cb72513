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

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
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
		// Another share keeps the GPU's MPS daemon running, as on a busy
		// node; the measured claim only adds its client limits.
		other := e.claim(framework.UniqueName("bench-other"), []request{{name: "s", class: "shared", memory: "1Gi"}})
		if res, err := p.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{other}); err != nil || res[other.UID].Err != nil {
			b.Fatal(err)
		}
		c := e.claim(framework.UniqueName("bench-share"), []request{{name: "s", class: "shared", memory: "10Gi", compute: "25"}})
		benchPrepare(b, e, p, c)
	})
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
