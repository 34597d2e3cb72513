package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/scheduler"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

var (
	e2eNodes = flag.Int("e2e-nodes", 1000, "nodes per scheduler in BenchmarkEndToEnd (8 GPUs each)")
	e2eGang  = flag.Int("e2e-gang", 8, "pods per gang in BenchmarkEndToEnd")
)

// BenchmarkEndToEnd measures pods bound per second on a real API server: nodes × 8 GPUs and
// nodes × 8 one-GPU pods in gangs of e2e-gang through tessera, and the same number of pods
// (no gangs) through the stock kube-scheduler with DRA. Each scheduler gets its own node set
// (label bench-pool) in the same cluster, so both see all nodes and filter half of them. All
// objects exist before a scheduler starts; the clock runs from its start to the last binding.
// Run with -benchtime=1x.
func BenchmarkEndToEnd(b *testing.B) {
	if b.N > 1 {
		b.Skip("one run is the measurement; use -benchtime=1x")
	}
	ctx, cp, cfg, kube, sc := benchCluster(b)
	nodes, pods := *e2eNodes, *e2eNodes*8

	start := time.Now()
	parallel(b, 2*nodes, func(i int) error { return createNode(ctx, kube, i, nodes) })
	b.Logf("created %d nodes with slices in %v", 2*nodes, time.Since(start))

	qname := framework.UniqueName("bench")
	if _, err := sc.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: qname}}); err != nil {
		b.Fatal(err)
	}
	tns, sns := cp.CreateNamespace(b), cp.CreateNamespace(b)
	gangs := pods / *e2eGang
	start = time.Now()
	parallel(b, gangs, func(g int) error {
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: tns, Name: fmt.Sprintf("g%05d", g)},
			Spec: v1alpha1.PodGroupSpec{MinMember: int32(*e2eGang), Queue: qname}}
		if _, err := sc.PodGroups(tns).Create(ctx, pg); err != nil {
			return err
		}
		return nil
	})
	parallel(b, pods, func(i int) error {
		return createPod(ctx, kube, tns, i, "tessera", map[string]string{v1alpha1.PodGroupAnnotation: fmt.Sprintf("g%05d", i / *e2eGang)})
	})
	parallel(b, pods, func(i int) error { return createPod(ctx, kube, sns, i, "stock", nil) })
	b.Logf("created %d PodGroups, %d claims and %d pods in %v", gangs, 2*pods, 2*pods, time.Since(start))

	// tessera
	s, err := scheduler.New(cfg, scheduler.Options{Period: 200 * time.Millisecond, Parallelism: 64})
	if err != nil {
		b.Fatal(err)
	}
	var peak atomic.Uint64
	stopSampling := sampleHeap(&peak)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ResetTimer()
	go func() { done <- s.Run(sctx) }()
	tesseraDur := waitAllBound(ctx, b, kube, tns, pods)
	b.StopTimer()
	cancel()
	<-done
	stopSampling()
	checkAllocated(ctx, b, kube, tns, pods)

	// stock kube-scheduler
	stockDur := runKubeScheduler(ctx, b, cp, kube, sns, pods)

	tp, sp := float64(pods)/tesseraDur.Seconds(), float64(pods)/stockDur.Seconds()
	b.ReportMetric(tp, "tessera-pods/s")
	b.ReportMetric(sp, "stock-pods/s")
	b.ReportMetric(tp/sp, "ratio")
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
	b.Logf("tessera: %d pods in gangs of %d bound in %v (%.0f pods/s); stock kube-scheduler: %d pods in %v (%.0f pods/s); ratio %.2f; peak heap of the benchmark process during the tessera run %.0f MiB",
		pods, *e2eGang, tesseraDur, tp, pods, stockDur, sp, tp/sp, float64(peak.Load())/(1<<20))
}

func sampleHeap(peak *atomic.Uint64) func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}

func parallel(b *testing.B, n int, f func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	var first error
	var mu sync.Mutex
	next := atomic.Int64{}
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// createNode makes node i; the first half is tessera's pool, the second the stock scheduler's.
func createNode(ctx context.Context, kube kubernetes.Interface, i, perPool int) error {
	pool := "tessera"
	if i >= perPool {
		pool = "stock"
	}
	return createPoolNode(ctx, kube, fmt.Sprintf("bench-%s-%04d", pool, i%perPool), pool)
}

func createPod(ctx context.Context, kube kubernetes.Interface, ns string, i int, pool string, annotations map[string]string) error {
	c := fixture.GPUClaim(ns, fmt.Sprintf("p%05d", i), 1)
	c.UID = ""
	if _, err := kube.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		return err
	}
	p := fixture.Pod(ns, c.Name, c.Name)
	p.UID = ""
	p.Annotations = annotations
	p.Spec.NodeSelector = map[string]string{"bench-pool": pool}
	if pool == "stock" {
		p.Spec.SchedulerName = v1.DefaultSchedulerName
	}
	_, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	return err
}

func waitAllBound(ctx context.Context, b *testing.B, kube kubernetes.Interface, ns string, want int) time.Duration {
	b.Helper()
	start := time.Now()
	var last time.Time
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		n := 0
		for i := range list.Items {
			if list.Items[i].Spec.NodeName != "" {
				n++
			}
		}
		last = time.Now()
		return n == want, nil
	})
	if err != nil {
		b.Fatalf("pods in %s not all bound: %v", ns, err)
	}
	return last.Sub(start)
}

func runKubeScheduler(ctx context.Context, b *testing.B, cp *framework.ControlPlane, kube kubernetes.Interface, ns string, pods int) time.Duration {
	b.Helper()
	dir := b.TempDir()
	config := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 1000
  burst: 2000
leaderElection:
  leaderElect: false
`, cp.KubeconfigPath)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		b.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "kube-scheduler.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(cp.BinDir, "kube-scheduler"), "--config="+cfgPath,
		"--authentication-kubeconfig="+cp.KubeconfigPath, "--authorization-kubeconfig="+cp.KubeconfigPath,
		"--bind-address=127.0.0.1", "--secure-port=0", "--v=1")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	d := waitAllBound(ctx, b, kube, ns, pods)
	checkAllocated(ctx, b, kube, ns, pods)
	return d
}

// checkAllocated: every claim of the namespace is allocated and reserved for its pod, and no
// device is allocated twice in the cluster.
func checkAllocated(ctx context.Context, b *testing.B, kube kubernetes.Interface, ns string, want int) {
	b.Helper()
	claims, err := kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	seen := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		if c.Namespace == ns && len(c.Status.ReservedFor) == 1 {
			n++
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := r.Pool + "/" + r.Device
			if seen[id] {
				b.Fatalf("device %s allocated twice", id)
			}
			seen[id] = true
		}
	}
	if n != want {
		b.Fatalf("%d claims in %s allocated and reserved, want %d", n, ns, want)
	}
}

// benchCluster is the shared control plane with tessera's CRDs installed, and clients whose
// QPS is high enough that the API server, not client-side throttling, is the limit.
func benchCluster(b *testing.B) (context.Context, *framework.ControlPlane, *rest.Config, kubernetes.Interface, *client.Client) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	cp := framework.Shared(b)
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	kube := kubernetes.NewForConfigOrDie(cfg)
	sc, err := client.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	installCRDs(ctx, b, cfg, kube, sc)
	return ctx, cp, cfg, kube, sc
}

func installCRDs(ctx context.Context, b *testing.B, cfg *rest.Config, kube kubernetes.Interface, sc *client.Client) {
	b.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	ext := apiextensions.NewForConfigOrDie(cfg)
	for _, f := range []string{"scheduling.tessera.dev_queues.yaml", "scheduling.tessera.dev_podgroups.yaml", "scheduling.tessera.dev_topologies.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, "deployments", "crds", f))
		if err != nil {
			b.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			b.Fatal(err)
		}
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err1 := sc.Queues().List(ctx, metav1.ListOptions{})
		_, err2 := sc.PodGroups("default").List(ctx, metav1.ListOptions{})
		return err1 == nil && err2 == nil, nil
	}); err != nil {
		b.Fatal("scheduling CRDs not served")
	}
	for _, c := range fixture.DeviceClasses() {
		if _, err := kube.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
}

var (
	waitNodes  = flag.Int("e2e-wait-nodes", 20, "nodes (8 GPUs each) in BenchmarkWaitingGang")
	waitWindow = flag.Duration("e2e-wait-window", 20*time.Second, "how long BenchmarkWaitingGang measures a waiting gang")
)

// BenchmarkWaitingGang measures what a gang that cannot fit costs while nothing changes, on a
// real API server: e2e-wait-nodes × 8 GPUs and one gang of nodes × 8 + 1 one-GPU pods. Once
// the gang's PodGroup says Unschedulable, the scheduler's process CPU (getrusage: the
// benchmark process is the scheduler and an idle client) is sampled over e2e-wait-window,
// with the search of unchanged inputs on (unfit-retry=30s, the default) and off
// (unfit-retry=off: searched whenever decide's backoff asks). Sub-benchmarks alternate with
// -count. Run with -benchtime=1x.
func BenchmarkWaitingGang(b *testing.B) {
	ctx, cp, cfg, kube, sc := benchCluster(b)
	pool := framework.UniqueName("wait")
	nodes := *waitNodes
	parallel(b, nodes, func(i int) error { return createPoolNode(ctx, kube, fmt.Sprintf("%s-%03d", pool, i), pool) })
	qname := framework.UniqueName("bench")
	if _, err := sc.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: qname}}); err != nil {
		b.Fatal(err)
	}
	ns := cp.CreateNamespace(b)
	pods := nodes*8 + 1
	if _, err := sc.PodGroups(ns).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "big"},
		Spec: v1alpha1.PodGroupSpec{MinMember: int32(pods), Queue: qname}}); err != nil {
		b.Fatal(err)
	}
	parallel(b, pods, func(i int) error {
		return createPod(ctx, kube, ns, i, pool, map[string]string{v1alpha1.PodGroupAnnotation: "big"})
	})
	for _, v := range []struct {
		name  string
		retry time.Duration
	}{{"unfit-retry=off", -1}, {"unfit-retry=30s", 0}} {
		b.Run(v.name, func(b *testing.B) {
			s, err := scheduler.New(cfg, scheduler.Options{Period: 200 * time.Millisecond, Parallelism: 64, UnfitRetry: v.retry})
			if err != nil {
				b.Fatal(err)
			}
			sctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- s.Run(sctx) }()
			defer func() { cancel(); <-done }()
			// Waiting: the gang's first search failed in this scheduler.
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
				return s.SolverStats().Searches > 0 && s.Cycles() > 5, nil
			}); err != nil {
				b.Fatal("the gang was never searched")
			}
			before, cycles := s.SolverStats(), s.Cycles()
			cpu0 := processCPU()
			time.Sleep(*waitWindow)
			cpu := processCPU() - cpu0
			after := s.SolverStats()
			b.ReportMetric(float64(cpu.Milliseconds())/waitWindow.Seconds(), "cpu-ms/s")
			b.ReportMetric(float64(after.Searches-before.Searches), "searches")
			b.ReportMetric(float64(after.Unchanged-before.Unchanged), "unchanged")
			b.ReportMetric(float64(s.Cycles()-cycles), "cycles")
		})
	}
}

// createPoolNode creates a node with 8 whole GPUs, labelled bench-pool=pool.
func createPoolNode(ctx context.Context, kube kubernetes.Interface, name, pool string) error {
	node := fixture.Node(name, map[string]string{"bench-pool": pool, "kubernetes.io/hostname": name})
	node.UID = ""
	created, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Spec.Taints = nil // TaintNodesByCondition: no kubelet will clear not-ready
	if created, err = kube.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	created.Status = node.Status
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return err
	}
	for _, s := range fixture.WholeGPUSlices(name, 8) {
		s.UID = ""
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}
