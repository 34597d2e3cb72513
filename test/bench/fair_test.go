package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/test/framework"
)

var (
	fairRuns      = flag.Int("fair-runs", 3, "runs of each scheduler per scenario of BenchmarkFair (order alternated, a fresh control plane each)")
	fairNodes     = flag.Int("fair-nodes", 100, "nodes in BenchmarkFair (8 GPUs each)")
	fairQPS       = flag.Int("fair-qps", 5000, "client QPS of both schedulers in BenchmarkFair (burst twice that)")
	fairScore     = flag.Int("fair-stock-percentage", 0, "the kube-scheduler's percentageOfNodesToScore in BenchmarkFair; 0 is its default (all nodes up to 100, then 50% less 1% per 125 nodes, at least 100 nodes)")
	fairChurn     = flag.Duration("fair-churn", 5*time.Minute, "how long the churn scenario of BenchmarkFair runs")
	fairChurnRate = flag.Float64("fair-churn-rate", 0, "pods per second that arrive (and as many end) in the churn scenario of BenchmarkFair; 0: nodes/5 (20/s at 100 nodes: the live pods turn over every 20 s)")
	fairWindow    = flag.Duration("fair-unfit-window", 30*time.Second, "how long the unfit scenario of BenchmarkFair measures the cost of gangs that wait")
	fairStall     = flag.Duration("fair-stall", time.Minute, "a run of BenchmarkFair ends when no pod has been bound for this long; the pods left are reported as pending")
	fairTessera   = flag.String("fair-tessera-args", "", "more flags of tessera-scheduler in BenchmarkFair, space-separated (e.g. '--min-cycle-interval=10ms'); the results say which")
	fairStockArgs = flag.String("fair-stock-args", "", "more flags of the kube-scheduler in BenchmarkFair, space-separated (e.g. '--v=4' to see its queue; later flags win); the results say which")
	fairProfile   = flag.String("fair-cpu-profile", "", "a directory: each tessera run of the churn scenario writes a CPU profile of tessera-scheduler over its churn phase there (from its /debug/pprof, served on plain HTTP on loopback for it)")
	fairLogDir    = flag.String("fair-log-dir", "", "a directory where the schedulers' logs are kept (<scenario>-run<N>-<scheduler>[-init].log); without it they are removed with the run")
)

// BenchmarkFair measures equal-semantics pairs and scheduler_perf's shapes fairly, each a
// sub-benchmark (the scenarios of fair_scenarios_test.go; select with -bench
// 'BenchmarkFair/<name>'): tessera-scheduler against the kube-scheduler v1.37.2, both as
// separate processes with the same client QPS, placing the same pods (one ResourceClaim
// of their own each; gangs as upstream scheduling.k8s.io/v1beta1 PodGroups both read) on
// the same nodes × 8 GPUs, both packing (tessera's default; the kube-scheduler's
// NodeResourcesFit with MostAllocated, percentageOfNodesToScore at its default or
// -fair-stock-percentage).
//
// Each run gets a fresh control plane (etcd, kube-apiserver, kube-controller-manager);
// the order alternates (tessera first in even runs). A scenario's init pods are placed
// by the same scheduler first (not measured, like scheduler_perf's initPods), then that
// scheduler is stopped, the measured pods are created, and a fresh scheduler process is
// started: cold start (process start to first binding: informer sync included) is
// reported apart, the clock of the throughput runs from the first binding to the last.
// Per run: pods/s, throughput sampled every second (average and percentiles as
// scheduler_perf's SchedulingThroughput), the scheduler process's CPU-seconds and peak
// RSS, the API requests per pod the API server served (all clients), client-side
// throttling (the scheduler's rest_client_rate_limiter_duration_seconds from its /metrics,
// and client-go's throttling lines in its log), and placement quality (fair_quality_test.go): nodes
// used, free GPUs on partly used nodes, the largest gang of 8-GPU pods that still fits,
// and violations (partial gangs, topology, double allocations; each must be 0).
// Run with -benchtime=1x (make bench-e2e).
func BenchmarkFair(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement; use -benchtime=1x")
	}
	binDir, err := framework.BinDir()
	if err != nil {
		b.Fatal(err)
	}
	env := &fairEnv{binDir: binDir, tesseraBin: buildTesseraScheduler(b)}
	var rows []string
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			if b.N > 1 {
				b.Skip("one run is the measurement; use -benchtime=1x")
			}
			rows = append(rows, fairScenario(b, env, sc))
		})
	}
	// Pair 3, tessera's queues against Kueue + the kube-scheduler (fair_kueue_test.go).
	b.Run("kueue", func(b *testing.B) {
		if b.N > 1 {
			b.Skip("one run is the measurement; use -benchtime=1x")
		}
		rows = append(rows, fairKueue(b, env))
	})
	fairLog("BenchmarkFair, %d nodes × 8 GPUs, %d runs each, load average now %s:\n%s", *fairNodes, *fairRuns, loadAverage(), strings.Join(rows, "\n"))
}

// fairLog prints at once to stdout: the testing package keeps only the first 10 lines of
// a benchmark's b.Logf output, and prints them only when the benchmark ends.
func fairLog(format string, args ...any) { fmt.Printf(format+"\n", args...) }

type fairEnv struct{ binDir, tesseraBin string }

// fairScenario runs the scenario -fair-runs times per scheduler and returns its row.
func fairScenario(b *testing.B, env *fairEnv, sc scenario) string {
	results := map[string][]fairResult{}
	for r := 0; r < *fairRuns; r++ {
		order := []string{"tessera", "stock"}
		if r%2 == 1 {
			order = []string{"stock", "tessera"}
		}
		for _, which := range order {
			res := fairRun(b, env, sc, which, r)
			fairLog("run %d %s: %s", r, which, res.describe(sc))
			results[which] = append(results[which], res)
		}
	}
	t, s := summarize(results["tessera"]), summarize(results["stock"])
	fairLog("%s — %s", sc.name, sc.what)
	fairLog("median of %d runs (min–max), %d nodes:", *fairRuns, *fairNodes)
	if *fairTessera != "" {
		fairLog("  tessera-scheduler ran with %s", *fairTessera)
	}
	if *fairStockArgs != "" {
		fairLog("  the kube-scheduler ran with %s", *fairStockArgs)
	}
	fairLog("  tessera:        %s", t.describe(sc))
	fairLog("  kube-scheduler: %s", s.describe(sc))
	name, tv, sv := t.headline(sc, s)
	ratio := "n/a (kube-scheduler 0)"
	if sv.median != 0 {
		ratio = fmt.Sprintf("%.2f", tv.median/sv.median)
		b.ReportMetric(tv.median/sv.median, "ratio")
	}
	fairLog("  ratio tessera/kube-scheduler %s: %s", name, ratio)
	b.ReportMetric(tv.median, "tessera-"+name)
	b.ReportMetric(sv.median, "stock-"+name)
	return fmt.Sprintf("  %-12s %s: tessera %v, kube-scheduler %v, ratio %s; quality tessera [%s] kube-scheduler [%s]",
		sc.name, name, tv, sv, ratio, t.quality, s.quality)
}

type fairResult struct {
	pods, pending int
	cold          time.Duration // process start to first binding
	synced        time.Duration // process start to the scheduler's informers synced (syncedAfter)
	bind          time.Duration // first binding to last
	perSecond     []float64     // pods bound in each whole second of the bind phase
	cpu           float64       // CPU-seconds of the measured scheduler process
	peakRSS       float64       // MiB
	reads, writes float64       // API requests (not watches) per pod, all clients
	throttled     int           // client-side throttling lines in the scheduler's log
	throttleWait  float64       // seconds the scheduler's requests waited for its client-side limit
	throttledReqs int           // its requests that waited more than 5 ms for it
	load          string        // load average when the measured scheduler started
	quality       quality

	// churn
	latency  []float64 // ms from creation to bound, per churn pod
	achieved float64   // pods per second that arrived
	// unfit
	idleCPU, idleWrites float64 // CPU ms and API writes per second while the gangs wait
}

func (r fairResult) podsPerSec() float64 {
	if r.bind <= 0 {
		return 0
	}
	return float64(r.pods-r.pending) / r.bind.Seconds()
}

// podsPerSecFromSync is podsPerSec with the clock started when the scheduler's informers
// had synced rather than at the first binding: what the scheduler did before its first
// binding (for a gang scheduler, the gangs it placed but had not bound yet) counts.
func (r fairResult) podsPerSecFromSync() float64 {
	d := r.cold + r.bind - r.synced
	if r.synced <= 0 || d <= 0 {
		return 0
	}
	return float64(r.pods-r.pending) / d.Seconds()
}

func (r fairResult) describe(sc scenario) string {
	common := fmt.Sprintf("%.1f CPU-s, peak RSS %.0f MiB, %.2f reads + %.2f writes per pod, client-side throttling: requests waited %.2f s in sum, %d of them > 5 ms (%d log lines), load average %s; %s",
		r.cpu, r.peakRSS, r.reads, r.writes, r.throttleWait, r.throttledReqs, r.throttled, r.load, r.quality)
	switch {
	case sc.unfit:
		return fmt.Sprintf("%d pods of unfit gangs waiting (%d bound): %.1f CPU ms/s, %.2f API writes/s; %s", r.pods, r.pods-r.pending, r.idleCPU, r.idleWrites, common)
	case sc.churn:
		return fmt.Sprintf("cold %v (informers synced after %v), %d churn pods at %.1f/s: creation→bound p50 %.0f ms p99 %.0f ms, %d pending; %s",
			r.cold.Round(time.Millisecond), r.synced.Round(time.Millisecond), r.pods, r.achieved, percentile(r.latency, 0.5), percentile(r.latency, 0.99), r.pending, common)
	}
	return fmt.Sprintf("cold %v (informers synced after %v), %d pods (%d pending) in %v (%.0f pods/s; from the sync %.0f pods/s; per second avg %.0f p50 %.0f p90 %.0f p99 %.0f), %.2f CPU ms/pod; %s",
		r.cold.Round(time.Millisecond), r.synced.Round(time.Millisecond), r.pods, r.pending, r.bind.Round(time.Millisecond), r.podsPerSec(), r.podsPerSecFromSync(),
		mean(r.perSecond), percentile(r.perSecond, 0.5), percentile(r.perSecond, 0.9), percentile(r.perSecond, 0.99),
		1000*r.cpu/float64(max(r.pods, 1)), common)
}

// spread is a median with the range of the runs.
type spread struct{ median, min, max float64 }

func (s spread) String() string { return fmt.Sprintf("%.1f (%.1f–%.1f)", s.median, s.min, s.max) }

func spreadOf(v []float64) spread {
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	if len(v) == 0 {
		return spread{}
	}
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{m, v[0], v[len(v)-1]}
}

type fairSummary struct {
	podsPerSec, fromSync, avg, p50, p90, p99, cold, synced, cpuMsPerPod, rss, reads, writes, pending spread
	latP50, latP99, achieved, idleCPU, idleWrites                                                    spread
	throttled, throttledReqs                                                                         int
	throttleWait                                                                                     float64
	quality                                                                                          string // of the median run by pods/s (the first run's otherwise)
}

func (s fairSummary) describe(sc scenario) string {
	common := fmt.Sprintf("CPU ms/pod %v, peak RSS MiB %v, reads/pod %v, writes/pod %v, client-side throttling: requests waited %.2f s in sum over the runs, %d of them > 5 ms (%d log lines)", s.cpuMsPerPod, s.rss, s.reads, s.writes, s.throttleWait, s.throttledReqs, s.throttled)
	switch {
	case sc.unfit:
		return fmt.Sprintf("CPU ms/s %v, API writes/s %v, pods left waiting %v (all must be); %s", s.idleCPU, s.idleWrites, s.pending, common)
	case sc.churn:
		return fmt.Sprintf("creation→bound p50 ms %v, p99 ms %v, arrivals/s %v, pending %v, cold start s %v (informers synced after s %v); %s", s.latP50, s.latP99, s.achieved, s.pending, s.cold, s.synced, common)
	}
	return fmt.Sprintf("pods/s %v (from the informers' sync %v), per second avg %v p50 %v p90 %v p99 %v, pending %v, cold start s %v (informers synced after s %v); %s", s.podsPerSec, s.fromSync, s.avg, s.p50, s.p90, s.p99, s.pending, s.cold, s.synced, common)
}

// headline is the row's metric for the ratio.
func (s fairSummary) headline(sc scenario, stock fairSummary) (string, spread, spread) {
	switch {
	case sc.unfit:
		return "CPU-ms/s-waiting", s.idleCPU, stock.idleCPU
	case sc.churn:
		return "p99-ms-creation-to-bound", s.latP99, stock.latP99
	}
	return "pods/s", s.podsPerSec, stock.podsPerSec
}

func summarize(rs []fairResult) fairSummary {
	var s fairSummary
	col := func(f func(fairResult) float64) spread {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return spreadOf(v)
	}
	s.podsPerSec = col(fairResult.podsPerSec)
	s.fromSync = col(fairResult.podsPerSecFromSync)
	s.synced = col(func(r fairResult) float64 { return r.synced.Seconds() })
	s.avg = col(func(r fairResult) float64 { return mean(r.perSecond) })
	s.p50 = col(func(r fairResult) float64 { return percentile(r.perSecond, 0.5) })
	s.p90 = col(func(r fairResult) float64 { return percentile(r.perSecond, 0.9) })
	s.p99 = col(func(r fairResult) float64 { return percentile(r.perSecond, 0.99) })
	s.cold = col(func(r fairResult) float64 { return r.cold.Seconds() })
	s.cpuMsPerPod = col(func(r fairResult) float64 { return 1000 * r.cpu / float64(max(r.pods, 1)) })
	s.rss = col(func(r fairResult) float64 { return r.peakRSS })
	s.reads = col(func(r fairResult) float64 { return r.reads })
	s.writes = col(func(r fairResult) float64 { return r.writes })
	s.pending = col(func(r fairResult) float64 { return float64(r.pending) })
	s.latP50 = col(func(r fairResult) float64 { return percentile(r.latency, 0.5) })
	s.latP99 = col(func(r fairResult) float64 { return percentile(r.latency, 0.99) })
	s.achieved = col(func(r fairResult) float64 { return r.achieved })
	s.idleCPU = col(func(r fairResult) float64 { return r.idleCPU })
	s.idleWrites = col(func(r fairResult) float64 { return r.idleWrites })
	for _, r := range rs {
		s.throttled += r.throttled
		s.throttleWait += r.throttleWait
		s.throttledReqs += r.throttledReqs
	}
	if len(rs) > 0 {
		med := rs[0]
		for _, r := range rs {
			if r.podsPerSec() == s.podsPerSec.median {
				med = r
			}
		}
		s.quality = med.quality.String()
	}
	return s
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}

func podsOf(spec []gangSpec) int {
	n := 0
	for _, g := range spec {
		n += g.pods
	}
	return n
}

// fairRun is one scheduler's run of the scenario on a control plane of its own.
func fairRun(b *testing.B, env *fairEnv, sc scenario, which string, run int) fairResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), klog.Background()), 60*time.Minute)
	defer cancel()
	cp, kube, tc, ns := startFairCluster(ctx, b, sc)
	defer cp.Stop()
	nodes := *fairNodes
	if _, err := tc.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: fairQueue}}); err != nil {
		b.Fatal(err)
	}
	tr := newTracker(b, kube, ns)
	defer tr.stop()
	label := fmt.Sprintf("run %d %s %s", run, sc.name, which)
	logPath := func(suffix string) string {
		if *fairLogDir == "" {
			return filepath.Join(b.TempDir(), which+suffix+".log")
		}
		if err := os.MkdirAll(*fairLogDir, 0o755); err != nil {
			b.Fatal(err)
		}
		return filepath.Join(*fairLogDir, fmt.Sprintf("%s-run%d-%s%s.log", sc.name, run, which, suffix))
	}

	if sc.init != nil {
		init := sc.init(nodes)
		createGangs(ctx, b, kube, ns, which, "init", "i", init)
		p := startScheduler(b, env, sc, which, cp.KubeconfigPath, logPath("-init"))
		if _, _, pending := tr.measure(ctx, b, p, "init", len(init), label+" (init)"); pending > 0 {
			p.stop()
			b.Fatalf("%s: %d of %d init pods not bound (log %s)", label, pending, len(init), p.log)
		}
		p.stop()
	}
	var batch []gangSpec
	if sc.batch != nil {
		batch = sc.batch(nodes)
		createGangs(ctx, b, kube, ns, which, "batch", "b", batch)
	}
	res := fairResult{load: loadAverage(), pods: podsOf(batch)}
	reads0, writes0 := apiRequests(ctx, b, kube)
	p := startScheduler(b, env, sc, which, cp.KubeconfigPath, logPath(""))
	defer p.stop()

	switch {
	case sc.unfit:
		// Let the scheduler start and try, then measure a window of waiting.
		sleepCtx(ctx, max(*fairWindow/3, 5*time.Second))
		cpu0, _ := processUsage(b, p.pid())
		_, w0 := apiRequests(ctx, b, kube)
		t0 := time.Now()
		sleepCtx(ctx, *fairWindow)
		cpu1, _ := processUsage(b, p.pid())
		_, w1 := apiRequests(ctx, b, kube)
		el := time.Since(t0).Seconds()
		res.idleCPU, res.idleWrites = 1000*(cpu1-cpu0)/el, (w1-w0)/el
		res.pending = res.pods - tr.count("batch")
	case sc.churn:
		tr.churn(ctx, b, kube, ns, which, p, label, &res)
	default:
		res.cold, res.bind, res.pending = tr.measure(ctx, b, p, "batch", res.pods, label)
		res.perSecond = tr.perSecond
	}
	p.exitedCheck(b, label)
	// Every scheduler has synced by the end of its run (the unfit scenario binds nothing,
	// but runs seconds past its start); no sync time is a harness that no longer
	// reads it (the short mode in CI fails on it).
	d, ok := p.syncedAfter(b)
	if !ok {
		b.Fatalf("%s: no informer sync seen (tessera's %s line in %s, or an ok from the kube-scheduler's %q)", label, p.syncLine, p.log, p.readyURL)
	}
	res.synced = d
	cpu, rss := processUsage(b, p.pid())
	res.throttleWait, res.throttledReqs = p.clientThrottling(ctx, b)
	reads1, writes1 := apiRequests(ctx, b, kube)
	p.stop()
	res.cpu, res.peakRSS = cpu, rss
	res.reads, res.writes = (reads1-reads0)/float64(max(res.pods, 1)), (writes1-writes0)/float64(max(res.pods, 1))
	res.throttled = countLines(b, p.log, "client-side throttling")
	rack := ""
	if sc.rackSize > 0 {
		rack = rackLabel
	}
	initPods := 0
	if sc.init != nil && !sc.churn {
		initPods = podsOf(sc.init(nodes))
	}
	res.quality = measureQuality(ctx, b, kube, ns, nodes, rack, initPods)
	if q := res.quality; q.doubleAllocations > 0 || q.partialGangs > 0 || q.topologyViolations > 0 || q.initDisturbed > 0 {
		b.Errorf("%s: placement violates the semantics: %s; init pods disturbed: %v (log %s)", label, q, q.disturbed, p.log)
	}
	if sc.unfit && res.pending != res.pods {
		b.Errorf("%s: %d pods of gangs that cannot fit were bound", label, res.pods-res.pending)
	}
	return res
}

// startFairCluster starts a fresh control plane with the scheduling CRDs, DeviceClasses and
// -fair-nodes nodes of the scenario, and a namespace for the run; the caller stops it.
func startFairCluster(ctx context.Context, b *testing.B, sc scenario) (*framework.ControlPlane, kubernetes.Interface, *client.Client, string) {
	b.Helper()
	// Every control plane serves the upstream PodGroups and has the gates on, whichever
	// scheduler runs; the kube-scheduler's own gates are the scenario's.
	gates := map[string]bool{gateGenericWorkload: true, gateTopologyWorkload: true}
	for k, v := range framework.FeatureGates {
		gates[k] = v
	}
	cp, err := framework.Start(ctx, framework.Options{FeatureGates: gates, RuntimeConfig: framework.RuntimeConfig + ",scheduling.k8s.io/v1beta1=true",
		ExtraControllerManagerFlags: sc.kcmFlags})
	if err != nil {
		b.Fatalf("start control plane: %v", err)
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	kube := kubernetes.NewForConfigOrDie(cfg)
	tc, err := client.NewForConfig(cfg)
	if err != nil {
		cp.Stop()
		b.Fatal(err)
	}
	installCRDs(ctx, b, cfg, kube, tc)
	parallel(b, *fairNodes, func(i int) error { return createFairNode(ctx, kube, i, sc) })
	return cp, kube, tc, cp.CreateNamespace(b)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// schedProc is a running scheduler process.
type schedProc struct {
	// debugAddr is tessera-scheduler's plain-HTTP endpoint (host:port): /metrics, and
	// /debug/pprof for -fair-cpu-profile.
	debugAddr string
	// metricsURL and metrics are where and how the scheduler's /metrics is read (the
	// kube-scheduler's over HTTPS with the control plane's admin token).
	metricsURL string
	metrics    *http.Client
	cmd        *exec.Cmd
	start      time.Time
	// syncLine is the message tessera-scheduler logs once its informers have synced
	// ("Informers synced").
	syncLine string
	// readyURL: the kube-scheduler's /readyz, which answers ok once its informers and its
	// event handlers have synced (its sched-handler-sync check; it schedules nothing
	// before). Polled from the start: its log says so only at V(3), and turning that on
	// for one file (--vmodule) makes every V check of the process look up its caller —
	// 2026-12-08, gang8 at 1,000 nodes: 31 instead of 43 pods/s.
	readyURL string
	readyMu  sync.Mutex
	readyAt  time.Time
	log      string
	logFile  *os.File
	done     chan struct{}
	once     sync.Once
}

func (p *schedProc) pid() int { return p.cmd.Process.Pid }

func (p *schedProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *schedProc) exitedCheck(b *testing.B, label string) {
	if p.exited() {
		b.Fatalf("%s: the scheduler exited (log %s)", label, p.log)
	}
}

// stop ends the process (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (p *schedProc) stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		_ = p.logFile.Close()
	})
}

// startScheduler starts tessera-scheduler or the kube-scheduler (which "stock") against the
// control plane, logging to logPath.
func startScheduler(b *testing.B, env *fairEnv, sc scenario, which, kubeconfig, logPath string) *schedProc {
	b.Helper()
	var cmd *exec.Cmd
	if which == "tessera" {
		cmd = exec.Command(env.tesseraBin, "--kubeconfig="+kubeconfig, "--leader-elect=false", "--secure-port=0",
			fmt.Sprintf("--catalog=%t", sc.catalog), "--workload-definitions=false",
			fmt.Sprintf("--kube-api-qps=%d", *fairQPS), fmt.Sprintf("--kube-api-burst=%d", 2**fairQPS), "--v=1")
		cmd.Args = append(cmd.Args, strings.Fields(*fairTessera)...)
		// Plain HTTP on loopback: /metrics for the client-side throttling check, and
		// /debug/pprof for -fair-cpu-profile.
		addr := freeLoopbackAddr(b)
		cmd.Args = append(cmd.Args, "--metrics-bind-address="+addr)
		p := startProcess(b, cmd, logPath)
		p.syncLine = `"Informers synced"`
		p.debugAddr, p.metricsURL, p.metrics = addr, "http://"+addr+"/metrics", http.DefaultClient
		return p
	} else {
		percentage := ""
		if *fairScore > 0 {
			percentage = fmt.Sprintf("percentageOfNodesToScore: %d", *fairScore)
		}
		config := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: %d
  burst: %d
leaderElection:
  leaderElect: false
%s
profiles:
- schedulerName: default-scheduler
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
`, kubeconfig, *fairQPS, 2**fairQPS, percentage)
		cfgPath := logPath + ".config.yaml"
		if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
			b.Fatal(err)
		}
		// Its /metrics is HTTPS only, with delegated authentication and authorization:
		// the admin token passes both.
		_, port, err := net.SplitHostPort(freeLoopbackAddr(b))
		if err != nil {
			b.Fatal(err)
		}
		args := []string{"--config=" + cfgPath,
			"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
			"--bind-address=127.0.0.1", "--secure-port=" + port, "--v=1"}
		if len(sc.stockGates) > 0 {
			var g []string
			for _, name := range sc.stockGates {
				g = append(g, name+"=true")
			}
			args = append(args, "--feature-gates="+strings.Join(g, ","))
		}
		args = append(args, strings.Fields(*fairStockArgs)...)
		cmd = exec.Command(filepath.Join(env.binDir, "kube-scheduler"), args...)
		p := startProcess(b, cmd, logPath)
		p.readyURL = "https://127.0.0.1:" + port + "/readyz"
		p.metricsURL, p.metrics = "https://127.0.0.1:"+port+"/metrics", adminHTTPClient(b, kubeconfig)
		go p.pollReady()
		return p
	}
}

// adminHTTPClient is an HTTP client with the kubeconfig's credentials that accepts any
// server certificate (the kube-scheduler's is self-signed, made at its start).
func adminHTTPClient(b *testing.B, kubeconfig string) *http.Client {
	b.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cfg = &rest.Config{BearerToken: cfg.BearerToken, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return hc
}

// clientThrottling reads client-go's rate-limiter histogram from the scheduler's /metrics
// (rest_client_rate_limiter_duration_seconds, every client of the process): the seconds its
// requests waited for the client-side limit, and how many waited more than 5 ms. Unlike
// client-go's log line, which is written only for waits over 1 s at the default verbosity,
// it counts every wait, and it reads the same on both schedulers.
func (p *schedProc) clientThrottling(ctx context.Context, b *testing.B) (waitSeconds float64, waited int) {
	b.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metricsURL, nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := p.metrics.Do(req)
	if err != nil {
		b.Fatalf("scheduler metrics %s: %v", p.metricsURL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("scheduler metrics %s: %s %v", p.metricsURL, resp.Status, err)
	}
	waitSeconds, waited, err = parseClientThrottling(body)
	if err != nil {
		b.Fatalf("scheduler metrics %s: %v", p.metricsURL, err)
	}
	return waitSeconds, waited
}

// parseClientThrottling sums the histogram rest_client_rate_limiter_duration_seconds over its
// label sets in a Prometheus text exposition (parsed with expfmt): its sum, and its count
// less its first bucket (5 ms). A process with no rate-limited request has no such series.
func parseClientThrottling(exposition []byte) (waitSeconds float64, waited int, err error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(exposition))
	if err != nil {
		return 0, 0, fmt.Errorf("metrics exposition: %w", err)
	}
	mf := families["rest_client_rate_limiter_duration_seconds"]
	if mf == nil {
		return 0, 0, nil
	}
	var slow uint64
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			return 0, 0, fmt.Errorf("rest_client_rate_limiter_duration_seconds is a %s, not a histogram", mf.GetType())
		}
		waitSeconds += h.GetSampleSum()
		fast := uint64(0)
		for _, bk := range h.GetBucket() {
			if bk.GetUpperBound() <= 0.005 {
				fast = bk.GetCumulativeCount()
			}
		}
		slow += h.GetSampleCount() - fast
	}
	return waitSeconds, int(slow), nil
}

// freeLoopbackAddr is a loopback host:port nothing listened on a moment ago.
func freeLoopbackAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// cpuProfile fetches a CPU profile of d from the scheduler's /debug/pprof into path; the
// returned func waits for it and says what went wrong.
func (p *schedProc) cpuProfile(ctx context.Context, d time.Duration, path string) (wait func() error) {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.debugAddr, max(1, int(d.Seconds())))
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("CPU profile: %w", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("CPU profile: %s", resp.Status)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				_ = f.Close()
				return fmt.Errorf("CPU profile %s: %w", path, err)
			}
			return f.Close()
		}()
	}()
	return func() error { return <-done }
}

// startProcess starts cmd logging to logPath.
func startProcess(b *testing.B, cmd *exec.Cmd, logPath string) *schedProc {
	b.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p := &schedProc{cmd: cmd, log: logPath, logFile: logFile, done: make(chan struct{}), start: time.Now()}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p
}

// tracker sees pods bound, from a watch of the namespace.
type tracker struct {
	mu          sync.Mutex
	seen        map[string]bool
	bound       map[string]int       // phase → pods seen bound
	first, last map[string]time.Time // phase → first and last binding seen
	order       []string             // init and churn pods in the order they were bound: churn ends the oldest first
	next        int                  // order[next] is the oldest pod not yet ended
	created     map[string]time.Time // churn pods: when the benchmark asked for them
	latency     []float64            // ms, churn pods
	perSecond   []float64            // of the last measure
	inf         informers.SharedInformerFactory
	stopCh      chan struct{}
}

func newTracker(b *testing.B, kube kubernetes.Interface, ns string) *tracker {
	b.Helper()
	tr := &tracker{seen: map[string]bool{}, bound: map[string]int{}, first: map[string]time.Time{}, last: map[string]time.Time{},
		created: map[string]time.Time{}, stopCh: make(chan struct{})}
	tr.inf = informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns))
	podInf := tr.inf.Core().V1().Pods().Informer()
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: tr.onPod, UpdateFunc: func(_, o any) { tr.onPod(o) }}); err != nil {
		b.Fatal(err)
	}
	tr.inf.Start(tr.stopCh)
	tr.inf.WaitForCacheSync(tr.stopCh)
	return tr
}

func (tr *tracker) stop() { close(tr.stopCh); tr.inf.Shutdown() }

func (tr *tracker) onPod(obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return
	}
	now := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.seen[p.Name] {
		return
	}
	tr.seen[p.Name] = true
	ph := p.Labels[phaseLabel]
	tr.bound[ph]++
	if _, ok := tr.first[ph]; !ok {
		tr.first[ph] = now
	}
	tr.last[ph] = now
	if ph == "init" || ph == "churn" {
		tr.order = append(tr.order, p.Name)
	}
	if t, ok := tr.created[p.Name]; ok {
		tr.latency = append(tr.latency, float64(now.Sub(t))/float64(time.Millisecond))
	}
}

func (tr *tracker) count(phase string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.bound[phase]
}

// measure waits until want pods of the phase are bound, or none has been for -fair-stall,
// sampling the count every second. It returns the time from the process start to the
// first binding, from the first binding to the last, and how many pods are left.
func (tr *tracker) measure(ctx context.Context, b *testing.B, p *schedProc, phase string, want int, label string) (cold, bind time.Duration, pending int) {
	b.Helper()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var samples []int
	last, progress := 0, time.Now()
	for {
		c := tr.count(phase)
		if c >= want {
			break
		}
		if c != last {
			last, progress = c, time.Now()
		}
		if c > 0 && time.Since(progress) > *fairStall {
			break
		}
		if c == 0 && time.Since(p.start) > 10*time.Minute {
			b.Fatalf("%s: no pod bound 10 minutes after the scheduler started (log %s)", label, p.log)
		}
		p.exitedCheck(b, label)
		select {
		case <-tick.C:
			samples = append(samples, c)
		case <-ctx.Done():
			b.Fatalf("%s: %v", label, ctx.Err())
		}
	}
	tr.mu.Lock()
	first, lastBind, got := tr.first[phase], tr.last[phase], tr.bound[phase]
	tr.mu.Unlock()
	tr.perSecond = wholeSeconds(samples, got)
	if got == 0 {
		return 0, 0, want
	}
	return first.Sub(p.start), lastBind.Sub(first), want - got
}

// wholeSeconds are the pods bound in each whole second between ticks (counts sampled
// every second from the process start), from the second of the first binding to the
// second of the last: seconds before the first binding, the partial second in which
// the last pod was bound before the run ended, and a stall's empty seconds after the
// last binding are left out.
func wholeSeconds(ticks []int, got int) []float64 {
	var out []float64
	for i := 1; i < len(ticks); i++ {
		if ticks[i] == 0 {
			continue
		}
		if ticks[i-1] >= got {
			break
		}
		out = append(out, float64(ticks[i]-ticks[i-1]))
	}
	return out
}

// churn warms the running scheduler with one pod, then for -fair-churn ends the oldest
// bound pod (deleted at once, with its claim: the claim controller deallocates it) and
// creates a new one, -fair-churn-rate times a second, and waits for the last ones.
func (tr *tracker) churn(ctx context.Context, b *testing.B, kube kubernetes.Interface, ns, which string, p *schedProc, label string, res *fairResult) {
	b.Helper()
	if err := createFairPod(ctx, kube, ns, which, "warm", "w0", "w0", gangSpec{pods: 1, gpus: 1}); err != nil {
		b.Fatal(err)
	}
	if cold, _, pending := tr.measure(ctx, b, p, "warm", 1, label+" (warm-up)"); pending > 0 {
		b.Fatalf("%s: warm-up pod not bound", label)
	} else {
		res.cold = cold
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var errMu sync.Mutex
	var firstErr error
	do := func(f func() error) {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(); err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}
		}()
	}
	rate := *fairChurnRate
	if rate <= 0 {
		rate = float64(*fairNodes) / 5
	}
	if *fairProfile != "" && p.debugAddr != "" {
		path := filepath.Join(*fairProfile, strings.NewReplacer("/", "-", " ", "-").Replace(label)+".pprof")
		profiled := p.cpuProfile(ctx, *fairChurn, path)
		defer func() {
			if err := profiled(); err != nil {
				b.Errorf("%s: %v", label, err)
			} else {
				b.Logf("%s: CPU profile of the churn phase in %s", label, path)
			}
		}()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	start := time.Now()
	// Each arrival owes one ending; an ending waits for a bound pod to end, so the
	// population stays where the init phase left it (50% of G) whatever the latency.
	acc, n, owed := 0.0, 0, 0
	for time.Since(start) < *fairChurn {
		<-tick.C
		for acc += rate / 10; acc >= 1; acc-- {
			name := fmt.Sprintf("c%06d", n)
			n++
			owed++
			do(func() error {
				tr.mu.Lock()
				tr.created[name] = time.Now()
				tr.mu.Unlock()
				return createFairPod(ctx, kube, ns, which, "churn", name, name, gangSpec{pods: 1, gpus: 1})
			})
		}
		for ; owed > 0; owed-- {
			tr.mu.Lock()
			victim := ""
			if tr.next < len(tr.order) {
				victim = tr.order[tr.next]
				tr.next++
			}
			tr.mu.Unlock()
			if victim == "" {
				break
			}
			do(func() error {
				if err := kube.CoreV1().Pods(ns).Delete(ctx, victim, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
					return err
				}
				return kube.ResourceV1().ResourceClaims(ns).Delete(ctx, victim, metav1.DeleteOptions{})
			})
		}
	}
	tick.Stop()
	wg.Wait()
	if firstErr != nil {
		b.Fatalf("%s: churn: %v", label, firstErr)
	}
	res.pods = n
	res.achieved = float64(n) / time.Since(start).Seconds()
	_, _, res.pending = tr.measure(ctx, b, p, "churn", n, label+" (churn)")
	tr.mu.Lock()
	res.latency = append([]float64(nil), tr.latency...)
	tr.mu.Unlock()
}

// percentile of the samples, nearest rank; 0 when there are none.
func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	i := int(math.Ceil(q*float64(len(v)))) - 1
	return v[max(0, min(len(v)-1, i))]
}

func buildTesseraScheduler(b *testing.B) string {
	b.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(b.TempDir(), "tessera-scheduler")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/tessera-scheduler")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build tessera-scheduler: %v\n%s", err, msg)
	}
	return out
}

// apiRequests returns the requests the API server has served (apiserver_request_total), reads
// (GET, LIST) and writes (POST, PUT, PATCH, DELETE, APPLY); watches are not counted.
func apiRequests(ctx context.Context, b *testing.B, kube kubernetes.Interface) (reads, writes float64) {
	b.Helper()
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatalf("API server metrics: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(line, `verb="GET"`), strings.Contains(line, `verb="LIST"`):
			reads += v
		case strings.Contains(line, `verb="WATCH"`), strings.Contains(line, `verb="CONNECT"`):
		default:
			writes += v
		}
	}
	return reads, writes
}

// processUsage returns the CPU-seconds (user + system) and peak RSS (MiB) of a running
// process from /proc.
func processUsage(b *testing.B, pid int) (cpu, rssMiB float64) {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	// Fields after the command: state is 0, utime 11, stime 12 (proc(5): 14 and 15).
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	const clockTicks = 100 // USER_HZ on Linux
	cpu = (ut + st) / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
			rssMiB = kb / 1024
		}
	}
	return cpu, rssMiB
}

// pollReady asks readyURL every 20 ms until it answers 200 or the process ends, and
// records when it first did.
func (p *schedProc) pollReady() {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
		resp, err := p.metrics.Get(p.readyURL)
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			p.readyMu.Lock()
			p.readyAt = time.Now()
			p.readyMu.Unlock()
			return
		}
	}
}

// syncedAfter is how long after its start the scheduler's informers had synced: the first
// ok of the kube-scheduler's /readyz, or the time of tessera's log line (klog's header:
// "I1208 00:07:11.172252 ..."); false when neither came.
func (p *schedProc) syncedAfter(b *testing.B) (time.Duration, bool) {
	b.Helper()
	if p.readyURL != "" {
		p.readyMu.Lock()
		defer p.readyMu.Unlock()
		if p.readyAt.IsZero() {
			return 0, false
		}
		return p.readyAt.Sub(p.start), true
	}
	data, err := os.ReadFile(p.log)
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if p.syncLine == "" || !strings.Contains(line, p.syncLine) {
			continue
		}
		if t, ok := klogTime(line, p.start); ok {
			return t.Sub(p.start), true
		}
	}
	return 0, false
}

// klogTime is the time of a klog text line ("Lmmdd hh:mm:ss.uuuuuu"), in the year and
// location of near.
func klogTime(line string, near time.Time) (time.Time, bool) {
	if len(line) < 21 || !strings.ContainsRune("IWEF", rune(line[0])) {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], near.Location())
	if err != nil {
		return time.Time{}, false
	}
	return t.AddDate(near.Year(), 0, 0), true
}

func countLines(b *testing.B, path, substr string) int {
	b.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	return strings.Count(string(data), substr)
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}
