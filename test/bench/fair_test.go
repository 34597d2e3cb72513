package bench

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/test/framework"
)

var (
	fairRuns  = flag.Int("fair-runs", 3, "runs of each scheduler in BenchmarkFair (order alternated, a fresh control plane each)")
	fairNodes = flag.Int("fair-nodes", 100, "nodes in BenchmarkFair (8 GPUs each, as many one-GPU pods as GPUs)")
	fairQPS   = flag.Int("fair-qps", 5000, "client QPS of both schedulers in BenchmarkFair (burst twice that)")
	fairScore = flag.Int("fair-stock-percentage", 0, "the kube-scheduler's percentageOfNodesToScore in BenchmarkFair; 0 is its default (all nodes up to 100, then 50% less 1% per 125 nodes, at least 100 nodes)")
)

// BenchmarkFair is one equal-semantics pair, measured fairly: tessera-scheduler placing
// gangs of one (every pod without a PodGroup is one) against the stock kube-scheduler
// v1.37.2 with DRA, both placing nodes × 8 one-GPU pods (each with its own ResourceClaim
// of the gpu DeviceClass) on nodes × 8 whole GPUs, both packing (tessera's default; the
// kube-scheduler's NodeResourcesFit with MostAllocated; percentageOfNodesToScore at its
// default, or -fair-stock-percentage), both as separate processes with the same client QPS.
//
// Each run gets a fresh control plane (etcd, kube-apiserver, kube-controller-manager), all
// objects are created before the scheduler starts, and the order alternates (tessera first
// in even runs, the stock scheduler first in odd ones). Cold start (process start to first
// binding: informer sync included) is reported apart; the clock of the throughput runs
// from the first binding to the last. Per run: pods/s, throughput sampled every second
// (percentiles as scheduler_perf's SchedulingThroughput), the scheduler process's
// CPU-seconds (from process start to the last binding) and peak RSS, the API requests per
// pod the API server served during the run (all clients: the scheduler, the controller
// manager and this benchmark's one watch), and the client-side throttling lines in the
// scheduler's log. Run with -benchtime=1x (make bench-e2e).
func BenchmarkFair(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement; use -benchtime=1x")
	}
	binDir, err := framework.BinDir()
	if err != nil {
		b.Fatal(err)
	}
	tesseraBin := buildTesseraScheduler(b)
	results := map[string][]fairResult{}
	for r := 0; r < *fairRuns; r++ {
		order := []string{"tessera", "stock"}
		if r%2 == 1 {
			order = []string{"stock", "tessera"}
		}
		for _, which := range order {
			res := fairRun(b, which, r, binDir, tesseraBin)
			b.Logf("run %d %s: %s", r, which, res)
			results[which] = append(results[which], res)
		}
	}
	t, s := summarize(results["tessera"]), summarize(results["stock"])
	b.Logf("median of %d runs (min–max), %d nodes, %d pods, load average %s", *fairRuns, *fairNodes, *fairNodes*8, loadAverage())
	b.Logf("  tessera (gangs of 1): %s", t)
	b.Logf("  stock kube-scheduler: %s", s)
	b.Logf("  ratio tessera/stock pods/s: %.2f", t.podsPerSec.median/s.podsPerSec.median)
	b.ReportMetric(t.podsPerSec.median, "tessera-pods/s")
	b.ReportMetric(s.podsPerSec.median, "stock-pods/s")
	b.ReportMetric(t.podsPerSec.median/s.podsPerSec.median, "ratio")
}

type fairResult struct {
	pods          int
	cold          time.Duration // process start to first binding
	bind          time.Duration // first binding to last
	perSecond     []float64     // pods bound in each whole second of the bind phase
	cpu           float64       // CPU-seconds of the scheduler process up to the last binding
	peakRSS       float64       // MiB
	reads, writes float64       // API requests (not watches) per pod, all clients
	throttled     int           // client-side throttling lines in the scheduler's log
	load          string        // load average when the scheduler started
}

func (r fairResult) podsPerSec() float64 { return float64(r.pods) / r.bind.Seconds() }

func (r fairResult) String() string {
	return fmt.Sprintf("cold %v, %d pods in %v (%.0f pods/s; per second p50 %.0f p90 %.0f p99 %.0f), %.1f CPU-s (%.2f ms/pod), peak RSS %.0f MiB, %.2f reads + %.2f writes per pod, %d throttling lines, load average %s",
		r.cold.Round(time.Millisecond), r.pods, r.bind.Round(time.Millisecond), r.podsPerSec(),
		percentile(r.perSecond, 0.5), percentile(r.perSecond, 0.9), percentile(r.perSecond, 0.99),
		r.cpu, 1000*r.cpu/float64(r.pods), r.peakRSS, r.reads, r.writes, r.throttled, r.load)
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
	podsPerSec, p50, cold, cpuMsPerPod, rss, reads, writes spread
	throttled                                              int
}

func (s fairSummary) String() string {
	return fmt.Sprintf("pods/s %v, per-second p50 %v, cold start s %v, CPU ms/pod %v, peak RSS MiB %v, reads/pod %v, writes/pod %v, throttling lines %d",
		s.podsPerSec, s.p50, s.cold, s.cpuMsPerPod, s.rss, s.reads, s.writes, s.throttled)
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
	s.p50 = col(func(r fairResult) float64 { return percentile(r.perSecond, 0.5) })
	s.cold = col(func(r fairResult) float64 { return r.cold.Seconds() })
	s.cpuMsPerPod = col(func(r fairResult) float64 { return 1000 * r.cpu / float64(r.pods) })
	s.rss = col(func(r fairResult) float64 { return r.peakRSS })
	s.reads = col(func(r fairResult) float64 { return r.reads })
	s.writes = col(func(r fairResult) float64 { return r.writes })
	for _, r := range rs {
		s.throttled += r.throttled
	}
	return s
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

// fairRun is one scheduler's run on a control plane of its own.
func fairRun(b *testing.B, which string, run int, binDir, tesseraBin string) fairResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), klog.Background()), 30*time.Minute)
	defer cancel()
	cp, err := framework.Start(ctx, framework.Options{})
	if err != nil {
		b.Fatalf("start control plane: %v", err)
	}
	defer cp.Stop()
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	kube := kubernetes.NewForConfigOrDie(cfg)
	sc, err := client.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	installCRDs(ctx, b, cfg, kube, sc)
	nodes, pods := *fairNodes, *fairNodes*8
	parallel(b, nodes, func(i int) error { return createNode(ctx, kube, i, nodes) })
	ns := cp.CreateNamespace(b)
	queue := "bench"
	if _, err := sc.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: queue}}); err != nil {
		b.Fatal(err)
	}
	parallel(b, pods, func(i int) error { return createPodOn(ctx, kube, ns, i, which, queue) })
	load := loadAverage()

	// Count bindings from a watch, sampled every second.
	var bound atomic.Int64
	var firstBind, lastBind atomic.Int64
	inf := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns))
	podInf := inf.Core().V1().Pods().Informer()
	seen := sync.Map{}
	onPod := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		if _, dup := seen.LoadOrStore(p.UID, true); dup {
			return
		}
		now := time.Now().UnixNano()
		firstBind.CompareAndSwap(0, now)
		lastBind.Store(now)
		bound.Add(1)
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onPod, UpdateFunc: func(_, o any) { onPod(o) }}); err != nil {
		b.Fatal(err)
	}
	stopInf := make(chan struct{})
	defer func() { close(stopInf); inf.Shutdown() }()
	inf.Start(stopInf)
	inf.WaitForCacheSync(stopInf)

	reads0, writes0 := apiRequests(ctx, b, kube)
	dir := b.TempDir()
	logPath := filepath.Join(dir, which+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	var cmd *exec.Cmd
	if which == "tessera" {
		cmd = exec.Command(tesseraBin, "--kubeconfig="+cp.KubeconfigPath, "--leader-elect=false", "--secure-port=0",
			"--catalog=false", "--workload-definitions=false",
			fmt.Sprintf("--kube-api-qps=%d", *fairQPS), fmt.Sprintf("--kube-api-burst=%d", 2**fairQPS), "--v=1")
	} else {
		cfgPath := filepath.Join(dir, "config.yaml")
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
`, cp.KubeconfigPath, *fairQPS, 2**fairQPS, percentage)
		if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd = exec.Command(filepath.Join(binDir, "kube-scheduler"), "--config="+cfgPath,
			"--authentication-kubeconfig="+cp.KubeconfigPath, "--authorization-kubeconfig="+cp.KubeconfigPath,
			"--bind-address=127.0.0.1", "--secure-port=0", "--v=1")
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	}
	defer stop()

	var samples []int64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.After(20 * time.Minute)
	for bound.Load() < int64(pods) {
		select {
		case <-tick.C:
			samples = append(samples, bound.Load())
		case <-deadline:
			b.Fatalf("run %d %s: %d of %d pods bound after 20 minutes (log %s)", run, which, bound.Load(), pods, logPath)
		}
		if cmd.ProcessState != nil {
			b.Fatalf("run %d %s: scheduler exited", run, which)
		}
	}
	cpu, rss := processUsage(b, cmd.Process.Pid)
	reads1, writes1 := apiRequests(ctx, b, kube)
	stop()
	checkAllocated(ctx, b, kube, ns, pods)

	res := fairResult{
		pods: pods, cold: time.Unix(0, firstBind.Load()).Sub(start), bind: time.Duration(lastBind.Load() - firstBind.Load()),
		load: load, cpu: cpu, peakRSS: rss, reads: (reads1 - reads0) / float64(pods), writes: (writes1 - writes0) / float64(pods),
	}
	// Whole seconds from the first with a binding (the last, partial one is left out).
	for i := 1; i < len(samples); i++ {
		if d := samples[i] - samples[i-1]; d > 0 || (samples[i-1] > 0 && samples[i] < int64(pods)) {
			res.perSecond = append(res.perSecond, float64(d))
		}
	}
	res.throttled = countLines(b, logPath, "client-side throttling")
	return res
}

// createPodOn makes pod i with a one-GPU claim of its own for the scheduler which ("stock":
// the default scheduler, else tessera-scheduler) in tessera's queue (a label the stock
// scheduler ignores); no node selector (one scheduler per cluster).
func createPodOn(ctx context.Context, kube kubernetes.Interface, ns string, i int, which, queue string) error {
	c := fixture.GPUClaim(ns, fmt.Sprintf("p%05d", i), 1)
	c.UID = ""
	if _, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		return err
	}
	p := fixture.Pod(ns, c.Name, c.Name)
	p.UID = ""
	p.Labels = map[string]string{v1alpha1.QueueLabel: queue}
	if which == "stock" {
		p.Spec.SchedulerName = v1.DefaultSchedulerName
	}
	_, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	return err
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
