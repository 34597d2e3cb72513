package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/sandbox/opbin"
)

// Pair 3 of BenchmarkFair (sub-benchmark "kueue"): tessera's queues against Kueue v0.17.0
// (its manager, built from the Go module proxy by hack/build-operators.sh kueue, with the
// CRDs of the same module) + the kube-scheduler v1.37.2.
//
// Both sides get the same control plane (fresh per run), the same nodes × 8 whole GPUs
// (DRA ResourceSlices), and the same batch/v1 Jobs: kueueJobPods pods each, every pod one
// GPU through a ResourceClaimTemplate of tessera's GPU DeviceClass (Kueue v0.17.0 counts
// such devices against quota through `resources.deviceClassMappings` behind its
// DynamicResourceAllocation gate, pkg/dra/claims.go: ExactCount requests without CEL
// selectors, which is what the template asks for). The jobs differ only where each
// system needs it: Kueue's are created suspended with the kueue.x-k8s.io/queue-name label
// (its webhook would do both; the harness serves none to the API server) and use the
// default scheduler; tessera's are not suspended, carry tessera's queue label and name
// tessera-scheduler, whose catalog maps a Job to one gang of its pods (Kueue admits a
// Job's pods together too).
//
// Two queues in one cohort, each with a nominal quota of half the GPUs and a borrowing
// limit of a quarter: Kueue, ClusterQueues "a" and "b" with cohortName "bench",
// nominalQuota G/2 and borrowingLimit G/4 (cpu and memory covered with quotas that never
// bind), a LocalQueue each; tessera, Queues "a" and "b" under a parent "bench" (quota and
// limit G), with gpu quota G/2 and limit 3G/4. Queue a asks for all G GPUs, b for G/8: a
// borrows beyond its nominal share up to its limit, and the rest of a's jobs must wait
// although the cluster still has free GPUs — the borrowing limit, not capacity, stops it.
//
// Per run: the scheduler side is started and waited for until it is ready (Kueue: both
// ClusterQueues Active; tessera: its queues Valid), its cold start reported apart; then
// the jobs are created and the clock runs from the first creation to the last job admitted
// (Kueue: unsuspended; tessera admits a gang by binding it, so its admission time is its
// binding time) and to the last pod bound. Quota is checked on every Job and Pod event
// (informers): per queue the GPUs of admitted jobs and of bound pods against the queue's
// limit (nominal + borrowing limit), and the cohort's against the sum of the nominal
// quotas; a violation fails the run. After the last expected binding the run watches for
// -fair-unfit-window/3 (at least 3 s) that nothing more is admitted. CPU-seconds and peak
// RSS are those of the scheduling side: tessera-scheduler, or the Kueue manager plus the
// kube-scheduler (the sum of both processes' peaks).

// kueueJobPods is the pods of every job of the pair (one GPU each).
const kueueJobPods = 4

// The names of the pair's objects.
const (
	kueueCohort     = "bench"                     // Kueue cohort, tessera parent queue
	kueueFlavor     = "default"                   // Kueue ResourceFlavor
	kueueResource   = "gpus"                      // Kueue's logical resource of tessera's GPU DeviceClass
	kueueTemplate   = "gpu1"                      // ResourceClaimTemplate: one whole GPU
	kueueQueueLabel = "kueue.x-k8s.io/queue-name" // Kueue's label naming a job's LocalQueue
	benchQueueLabel = "bench.tessera.dev/queue"   // job and pod label: the pair's queue (a or b), both sides
	kueueNamespace  = "kueue-system"              // the manager's namespace (its configuration's default)
)

// kueueShape is the pair's workload at a number of nodes.
type kueueShape struct {
	gpus             int64             // G: the cluster's GPUs
	nominal, borrow  int64             // per queue, GPUs
	demand, expected map[string]int    // jobs per queue: created, admitted when quota is enforced
	order            []string          // job names in creation order (interleaved)
	queueOf          map[string]string // job → queue
}

func kueueShapeFor(nodes int) kueueShape {
	g := int64(8 * nodes)
	s := kueueShape{gpus: g, nominal: g / 2, borrow: g / 4, demand: map[string]int{}, expected: map[string]int{}, queueOf: map[string]string{}}
	s.demand["a"] = int(g) / kueueJobPods
	s.demand["b"] = max(1, int(g)/8/kueueJobPods)
	limit := s.nominal + s.borrow
	for _, q := range []string{"a", "b"} {
		s.expected[q] = min(s.demand[q], int(limit)/kueueJobPods)
	}
	for i := 0; i < max(s.demand["a"], s.demand["b"]); i++ {
		for _, q := range []string{"a", "b"} {
			if i < s.demand[q] {
				name := fmt.Sprintf("%s%04d", q, i)
				s.order = append(s.order, name)
				s.queueOf[name] = q
			}
		}
	}
	return s
}

func (s kueueShape) limit() int64 { return s.nominal + s.borrow }

func (s kueueShape) expectedPods() int { return (s.expected["a"] + s.expected["b"]) * kueueJobPods }

type kueueResult struct {
	cold          time.Duration // process start(s) to ready
	admit, bind   time.Duration // first job created to the last expected admitted / bound
	pods, pending int           // expected pods, of them not bound
	admitted      map[string]int
	extra         int           // jobs admitted beyond the expected (each also a violation)
	created       int           // pods the job controller created (tessera: of every job; Kueue: of admitted ones)
	created1      time.Duration // first job created to the last pod created
	violations    int           // quota violations seen
	violation     string        // the first
	cpu, peakRSS  float64       // scheduling side
	reads, writes float64       // API requests per expected pod, all clients
	load          string
	maxGPUs       map[string]int64 // most GPUs bound per queue at any time
	throttled     int              // client-side throttling lines of the scheduling side
	throttleWait  float64          // seconds the schedulers' requests waited for their client-side limits (Kueue's not read)
	throttledReqs int              // and how many waited more than 5 ms
	kcmThrottled  int              // and of the kube-controller-manager
}

func (r kueueResult) podsPerSec() float64 {
	if r.bind <= 0 {
		return 0
	}
	return float64(r.pods-r.pending) / r.bind.Seconds()
}

func (r kueueResult) describe() string {
	return fmt.Sprintf("cold %v, %d pods created by %v, admitted all in %v, bound all in %v (%d pods, %d pending, %.0f pods/s), jobs admitted a=%d b=%d (%d beyond quota), most GPUs bound a=%d b=%d, %d quota violations%s; %.1f CPU-s, peak RSS %.0f MiB, %.2f reads + %.2f writes per pod, scheduler client-side throttling: requests waited %.2f s in sum, %d of them > 5 ms, %d throttling lines (kube-controller-manager %d), load average %s",
		r.cold.Round(time.Millisecond), r.created, r.created1.Round(time.Millisecond), r.admit.Round(time.Millisecond), r.bind.Round(time.Millisecond), r.pods, r.pending, r.podsPerSec(),
		r.admitted["a"], r.admitted["b"], r.extra, r.maxGPUs["a"], r.maxGPUs["b"], r.violations, r.violation, r.cpu, r.peakRSS, r.reads, r.writes, r.throttleWait, r.throttledReqs, r.throttled, r.kcmThrottled, r.load)
}

// fairKueue runs the pair -fair-runs times per side, order alternated, and returns its row.
func fairKueue(b *testing.B, env *fairEnv) string {
	shape := kueueShapeFor(*fairNodes)
	fairLog("kueue — pair 3: two queues in a cohort (nominal %d GPUs each, borrowing limit %d), %d jobs of %d one-GPU pods in a (all %d GPUs), %d in b; expected admitted a=%d b=%d",
		shape.nominal, shape.borrow, shape.demand["a"], kueueJobPods, shape.gpus, shape.demand["b"], shape.expected["a"], shape.expected["b"])
	results := map[string][]kueueResult{}
	for r := 0; r < *fairRuns; r++ {
		order := []string{"tessera", "kueue"}
		if r%2 == 1 {
			order = []string{"kueue", "tessera"}
		}
		for _, which := range order {
			res := kueueRun(b, env, shape, which, r)
			fairLog("run %d %s: %s", r, which, res.describe())
			results[which] = append(results[which], res)
		}
	}
	col := func(rs []kueueResult, f func(kueueResult) float64) spread {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return spreadOf(v)
	}
	sum := func(rs []kueueResult) (string, spread) {
		pps := col(rs, kueueResult.podsPerSec)
		violations := 0
		for _, r := range rs {
			violations += r.violations
		}
		return fmt.Sprintf("pods/s %v, admit all s %v, bind all s %v, cold start s %v, pending %v, CPU ms/pod %v, peak RSS MiB %v, reads/pod %v, writes/pod %v, quota violations %d",
			pps,
			col(rs, func(r kueueResult) float64 { return r.admit.Seconds() }),
			col(rs, func(r kueueResult) float64 { return r.bind.Seconds() }),
			col(rs, func(r kueueResult) float64 { return r.cold.Seconds() }),
			col(rs, func(r kueueResult) float64 { return float64(r.pending) }),
			col(rs, func(r kueueResult) float64 { return 1000 * r.cpu / float64(max(r.pods, 1)) }),
			col(rs, func(r kueueResult) float64 { return r.peakRSS }),
			col(rs, func(r kueueResult) float64 { return r.reads }),
			col(rs, func(r kueueResult) float64 { return r.writes }),
			violations), pps
	}
	t, tp := sum(results["tessera"])
	k, kp := sum(results["kueue"])
	fairLog("kueue — median of %d runs (min–max), %d nodes:", *fairRuns, *fairNodes)
	fairLog("  tessera:                 %s", t)
	fairLog("  Kueue + kube-scheduler:  %s", k)
	ratio := "n/a (Kueue 0)"
	if kp.median != 0 {
		ratio = fmt.Sprintf("%.2f", tp.median/kp.median)
		b.ReportMetric(tp.median/kp.median, "ratio")
	}
	fairLog("  ratio tessera/Kueue pods/s: %s", ratio)
	b.ReportMetric(tp.median, "tessera-pods/s")
	b.ReportMetric(kp.median, "kueue-pods/s")
	return fmt.Sprintf("  %-12s pods/s: tessera %v, Kueue+kube-scheduler %v, ratio %s; tessera [%s] Kueue [%s]", "kueue", tp, kp, ratio, t, k)
}

// kueueRun is one side's run on a control plane of its own.
func kueueRun(b *testing.B, env *fairEnv, shape kueueShape, which string, run int) kueueResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), klog.Background()), 60*time.Minute)
	defer cancel()
	label := fmt.Sprintf("run %d kueue %s", run, which)
	// The job and resourceclaim controllers create the pods and claims on both sides: their
	// client QPS (default 20) raised as the schedulers' is.
	kcmQPS := []string{fmt.Sprintf("--kube-api-qps=%d", *fairQPS), fmt.Sprintf("--kube-api-burst=%d", 2**fairQPS)}
	cp, kube, tc, ns := startFairCluster(ctx, b, scenario{kcmFlags: kcmQPS})
	defer cp.Stop()
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	dyn := dynamic.NewForConfigOrDie(cfg)
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: kueueTemplate},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: fixture.GPUClaim(ns, kueueTemplate, 1).Spec},
	}
	if _, err := kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	var procs []*schedProc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	start := time.Now()
	if which == "tessera" {
		createTesseraCohort(ctx, b, tc, shape)
		procs = append(procs, startScheduler(b, env, scenario{catalog: true}, "tessera", cp.KubeconfigPath, filepath.Join(dir, "tessera.log")))
		waitReady(ctx, b, label, procs, func() bool { return tesseraQueuesValid(ctx, tc) })
	} else {
		createKueueObjects(ctx, b, cfg, kube, dyn, ns, shape)
		procs = append(procs, startKueue(b, cp.KubeconfigPath, dir))
		procs = append(procs, startScheduler(b, env, scenario{}, "stock", cp.KubeconfigPath, filepath.Join(dir, "kube-scheduler.log")))
		waitReady(ctx, b, label, procs, func() bool { return kueueQueuesActive(ctx, dyn) })
	}
	res := kueueResult{cold: time.Since(start), load: loadAverage(), pods: shape.expectedPods()}
	mon := newQuotaMonitor(b, kube, ns, shape, which == "kueue")
	defer mon.stop()
	reads0, writes0 := apiRequests(ctx, b, kube)

	t0 := time.Now()
	parallel(b, len(shape.order), func(i int) error {
		name := shape.order[i]
		_, err := kube.BatchV1().Jobs(ns).Create(ctx, kueueJob(ns, name, shape.queueOf[name], which), metav1.CreateOptions{})
		return err
	})
	// Wait for every expected pod bound, or no progress for -fair-stall.
	want := shape.expectedPods()
	last, progress := -1, time.Now()
	for {
		c := mon.boundPods()
		if c >= want {
			break
		}
		if c != last {
			last, progress = c, time.Now()
		}
		if time.Since(progress) > *fairStall {
			break
		}
		for _, p := range procs {
			if p.exited() {
				b.Fatalf("%s: %s exited:\n%s", label, filepath.Base(p.cmd.Path), logTail(p.log, 15))
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			b.Fatalf("%s: %v", label, ctx.Err())
		}
	}
	// Nothing more may be admitted: the rest of queue a's jobs are beyond its limit.
	sleepCtx(ctx, max(*fairWindow/3, 3*time.Second))
	for _, p := range procs {
		p.exitedCheck(b, label)
		cpu, rss := processUsage(b, p.pid())
		res.cpu += cpu
		res.peakRSS += rss
		if p.metricsURL != "" { // a scheduler
			w, n := p.clientThrottling(ctx, b)
			res.throttleWait += w
			res.throttledReqs += n
		}
	}
	reads1, writes1 := apiRequests(ctx, b, kube)
	for _, p := range procs {
		p.stop()
		res.throttled += countLines(b, p.log, "client-side throttling")
	}
	res.kcmThrottled = countLines(b, filepath.Join(cp.Dir, "kube-controller-manager.log"), "client-side throttling")
	res.reads, res.writes = (reads1-reads0)/float64(max(want, 1)), (writes1-writes0)/float64(max(want, 1))

	m := mon.result()
	res.admitted, res.maxGPUs, res.violations, res.violation = m.admitted, m.maxGPUs, m.violations, m.first
	res.pending = want - min(m.bound, want)
	if !m.lastAdmit.IsZero() {
		res.admit = m.lastAdmit.Sub(t0)
	}
	if !m.lastBind.IsZero() {
		res.bind = m.lastBind.Sub(t0)
	}
	if res.created = m.created; !m.lastCreate.IsZero() {
		res.created1 = m.lastCreate.Sub(t0)
	}
	for _, q := range []string{"a", "b"} {
		res.extra += max(0, m.admitted[q]-shape.expected[q])
	}
	if res.violations > 0 {
		b.Errorf("%s: %d quota violations, the first: %s", label, res.violations, res.violation)
	}
	if res.pending > 0 || m.admitted["a"] != shape.expected["a"] || m.admitted["b"] != shape.expected["b"] {
		b.Errorf("%s: admitted a=%d b=%d, want %d and %d; %d of %d pods not bound (logs in %s)",
			label, m.admitted["a"], m.admitted["b"], shape.expected["a"], shape.expected["b"], res.pending, want, dir)
	}
	return res
}

// waitReady waits until ready() (polled) while the processes run.
func waitReady(ctx context.Context, b *testing.B, label string, procs []*schedProc, ready func() bool) {
	b.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		for _, p := range procs {
			if p.exited() {
				return false, fmt.Errorf("%s exited:\n%s", filepath.Base(p.cmd.Path), logTail(p.log, 15))
			}
		}
		return ready(), nil
	}); err != nil {
		b.Fatalf("%s: not ready: %v", label, err)
	}
}

// kueueJob is the pair's job: kueueJobPods pods of one GPU each (a claim from the template).
func kueueJob(ns, name, queue, which string) *batchv1.Job {
	pod := fixture.Pod(ns, name)
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(kueueTemplate)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	labels := map[string]string{benchQueueLabel: queue, phaseLabel: "batch", gangLabel: name}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{benchQueueLabel: queue}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(int32(kueueJobPods)), Completions: ptr.To(int32(kueueJobPods)),
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
	if which == "kueue" {
		job.Labels[kueueQueueLabel] = queue
		job.Spec.Suspend = ptr.To(true)
		job.Spec.Template.Spec.SchedulerName = v1.DefaultSchedulerName
	} else {
		job.Labels[v1alpha1.QueueLabel] = queue
		job.Spec.Template.Labels[v1alpha1.QueueLabel] = queue
	}
	return job
}

// createTesseraCohort makes tessera's queues: a parent holding all GPUs and two children
// with half as quota and three quarters as limit.
func createTesseraCohort(ctx context.Context, b *testing.B, tc *client.Client, shape kueueShape) {
	b.Helper()
	q := func(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.DecimalSI) }
	queues := []*v1alpha1.Queue{{
		ObjectMeta: metav1.ObjectMeta{Name: kueueCohort},
		Spec:       v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{Quota: q(shape.gpus), Limit: q(shape.gpus)}}},
	}}
	for _, name := range []string{"a", "b"} {
		queues = append(queues, &v1alpha1.Queue{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.QueueSpec{Parent: kueueCohort, Resources: v1alpha1.QueueResources{
				GPU: &v1alpha1.ResourceQuota{Quota: q(shape.nominal), Limit: q(shape.limit())},
			}},
		})
	}
	for _, queue := range queues {
		if _, err := tc.Queues().Create(ctx, queue); err != nil {
			b.Fatalf("queue %s: %v", queue.Name, err)
		}
	}
}

func tesseraQueuesValid(ctx context.Context, tc *client.Client) bool {
	for _, name := range []string{kueueCohort, "a", "b"} {
		q, err := tc.Queues().Get(ctx, name)
		if err != nil || !metaConditionTrue(q.Status.Conditions, v1alpha1.QueueConditionValid) {
			return false
		}
	}
	return true
}

func metaConditionTrue(conds []metav1.Condition, typ string) bool {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

var (
	kueueGroup        = "kueue.x-k8s.io"
	clusterQueueGVR   = schema.GroupVersionResource{Group: kueueGroup, Version: "v1beta2", Resource: "clusterqueues"}
	localQueueGVR     = schema.GroupVersionResource{Group: kueueGroup, Version: "v1beta2", Resource: "localqueues"}
	resourceFlavorGVR = schema.GroupVersionResource{Group: kueueGroup, Version: "v1beta2", Resource: "resourceflavors"}
)

// createKueueObjects installs Kueue's CRDs (from its module, beside the built manager) and
// makes its namespace, the flavor, the two ClusterQueues in one cohort and a LocalQueue each.
func createKueueObjects(ctx context.Context, b *testing.B, cfg *rest.Config, kube kubernetes.Interface, dyn dynamic.Interface, ns string, shape kueueShape) {
	b.Helper()
	dir := kueueDir(b)
	files, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		b.Fatalf("no Kueue CRDs in %s/crds (%v); run hack/build-operators.sh kueue", dir, err)
	}
	ext := apiextensions.NewForConfigOrDie(cfg)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			b.Fatalf("%s: %v", f, err)
		}
		if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatalf("%s: %v", f, err)
		}
	}
	// The manager's client maps every kind once at its start: all must be served by then.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		list, err := kube.Discovery().ServerResourcesForGroupVersion(clusterQueueGVR.GroupVersion().String())
		if err != nil {
			return false, nil
		}
		kinds := 0
		for _, r := range list.APIResources {
			if !strings.Contains(r.Name, "/") { // not a subresource
				kinds++
			}
		}
		return kinds == len(files), nil
	}); err != nil {
		b.Fatalf("Kueue's %d CRDs not served: %v", len(files), err)
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kueueNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	// Quotas that never bind for what the pods also request (Kueue admits only requests its
	// ClusterQueue covers); tessera's queues set no cpu or memory quota.
	resources := func(gpuBorrow int64) []any {
		return []any{
			map[string]any{"name": "cpu", "nominalQuota": "100000"},
			map[string]any{"name": "memory", "nominalQuota": "1000Ti"},
			map[string]any{"name": kueueResource, "nominalQuota": fmt.Sprint(shape.nominal), "borrowingLimit": fmt.Sprint(gpuBorrow)},
		}
	}
	objs := []struct {
		gvr schema.GroupVersionResource
		obj map[string]any
	}{{resourceFlavorGVR, map[string]any{"metadata": map[string]any{"name": kueueFlavor}, "spec": map[string]any{}}}}
	for _, q := range []string{"a", "b"} {
		objs = append(objs,
			struct {
				gvr schema.GroupVersionResource
				obj map[string]any
			}{clusterQueueGVR, map[string]any{"metadata": map[string]any{"name": q}, "spec": map[string]any{
				"cohortName":        kueueCohort,
				"namespaceSelector": map[string]any{},
				"resourceGroups": []any{map[string]any{
					"coveredResources": []any{"cpu", "memory", kueueResource},
					"flavors":          []any{map[string]any{"name": kueueFlavor, "resources": resources(shape.borrow)}},
				}},
			}}},
			struct {
				gvr schema.GroupVersionResource
				obj map[string]any
			}{localQueueGVR, map[string]any{"metadata": map[string]any{"name": q, "namespace": ns}, "spec": map[string]any{"clusterQueue": q}}})
	}
	for _, o := range objs {
		u := &unstructured.Unstructured{Object: o.obj}
		u.SetAPIVersion(o.gvr.GroupVersion().String())
		u.SetKind(map[string]string{"clusterqueues": "ClusterQueue", "localqueues": "LocalQueue", "resourceflavors": "ResourceFlavor"}[o.gvr.Resource])
		var ri dynamic.ResourceInterface = dyn.Resource(o.gvr)
		if u.GetNamespace() != "" {
			ri = dyn.Resource(o.gvr).Namespace(u.GetNamespace())
		}
		// The CRDs were just created: retry until they are served.
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := ri.Create(ctx, u, metav1.CreateOptions{})
			return err == nil, nil
		}); err != nil {
			_, err := ri.Create(ctx, u, metav1.CreateOptions{})
			b.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

func kueueQueuesActive(ctx context.Context, dyn dynamic.Interface) bool {
	for _, q := range []string{"a", "b"} {
		u, err := dyn.Resource(clusterQueueGVR).Get(ctx, q, metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		active := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Active" && m["status"] == "True" {
				active = true
			}
		}
		if !active {
			return false
		}
	}
	return true
}

func kueueDir(b *testing.B) string {
	b.Helper()
	dir, err := opbin.Dir(context.Background(), opbin.Options{}, "kueue")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "manager")); err != nil {
		b.Fatalf("Kueue's manager is not built (%v); run hack/build-operators.sh kueue (make bench-e2e does)", err)
	}
	return dir
}

// kueueMetricsCertDir is where Kueue v0.17.0's manager reads its metrics serving
// certificate when its internal certificate management is off (cmd/kueue/main.go,
// hard-coded; the release mounts a Secret there).
const kueueMetricsCertDir = "/etc/kueue/metrics/certs"

// startKueue starts Kueue's manager with internal certificate management off: its webhook
// server gets a self-signed certificate in a directory of the run (the API server calls no
// Kueue webhook: none is registered), its metrics server is off but still loads the
// certificate from kueueMetricsCertDir, which gets the same kind of certificate if it has
// none. Only the batch/v1 Job integration; DRA devices of tessera's GPU class count as
// kueueResource; the visibility API server (an aggregated API server) is off.
func startKueue(b *testing.B, kubeconfig, dir string) *schedProc {
	b.Helper()
	certDir := filepath.Join(dir, "kueue-certs")
	writeSelfSigned(b, certDir, false)
	writeSelfSigned(b, kueueMetricsCertDir, true)
	port := freePort(b)
	config := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
manageJobsWithoutQueueName: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: "0"
leaderElection:
  leaderElect: false
clientConnection:
  qps: %d
  burst: %d
integrations:
  frameworks: ["batch/job"]
resources:
  deviceClassMappings:
  - name: %s
    deviceClassNames: [%s]
featureGates:
  DynamicResourceAllocation: true
  VisibilityOnDemand: false
`, kueueNamespace, port, certDir, *fairQPS, 2**fairQPS, kueueResource, fixture.GPUClass)
	cfgPath := filepath.Join(dir, "kueue-config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(kueueDir(b), "manager"), "--config="+cfgPath, "--zap-log-level=info")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	return startProcess(b, cmd, filepath.Join(dir, "kueue.log"))
}

// writeSelfSigned writes tls.crt and tls.key for 127.0.0.1 into dir; keep leaves a pair
// already there.
func writeSelfSigned(b *testing.B, dir string, keep bool) {
	b.Helper()
	if keep {
		if _, err := os.Stat(filepath.Join(dir, "tls.key")); err == nil {
			return
		}
	}
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatalf("Kueue's certificates: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600); err != nil {
		b.Fatal(err)
	}
}

func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// quotaMonitor checks quota on every Job and Pod event of the namespace: per queue the
// GPUs of admitted jobs (Kueue: not suspended; tessera: its pods bound) and of bound pods
// against the queue's limit, and the cohort's against the sum of the nominal quotas.
type quotaMonitor struct {
	shape    kueueShape
	suspends bool // jobs start suspended: admission is unsuspending (Kueue)

	mu         sync.Mutex
	jobs       map[string]bool // admitted jobs
	jobBound   map[string]int  // job → pods bound
	pods       map[string]bool // bound pods
	gpus       map[string]int64
	admGPUs    map[string]int64
	maxGPUs    map[string]int64
	violations int
	first      string
	lastAdmit  time.Time
	seen       map[string]bool // pods created
	lastCreate time.Time       // the last pod first seen
	lastBind   time.Time

	inf    informers.SharedInformerFactory
	stopCh chan struct{}
}

type quotaResult struct {
	admitted            map[string]int
	maxGPUs             map[string]int64
	bound, violations   int
	first               string
	lastAdmit, lastBind time.Time
	created             int       // pods created (the job controller's)
	lastCreate          time.Time // when the last was first seen
}

func newQuotaMonitor(b testing.TB, kube kubernetes.Interface, ns string, shape kueueShape, suspends bool) *quotaMonitor {
	b.Helper()
	m := &quotaMonitor{shape: shape, suspends: suspends, jobs: map[string]bool{}, seen: map[string]bool{}, jobBound: map[string]int{}, pods: map[string]bool{},
		gpus: map[string]int64{}, admGPUs: map[string]int64{}, maxGPUs: map[string]int64{}, stopCh: make(chan struct{})}
	m.inf = informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(ns))
	h := func(f func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, o any) { f(o) }}
	}
	if _, err := m.inf.Core().V1().Pods().Informer().AddEventHandler(h(m.onPod)); err != nil {
		b.Fatal(err)
	}
	if _, err := m.inf.Batch().V1().Jobs().Informer().AddEventHandler(h(m.onJob)); err != nil {
		b.Fatal(err)
	}
	m.inf.Start(m.stopCh)
	m.inf.WaitForCacheSync(m.stopCh)
	return m
}

func (m *quotaMonitor) stop() { close(m.stopCh); m.inf.Shutdown() }

func (m *quotaMonitor) onJob(obj any) {
	j, ok := obj.(*batchv1.Job)
	if !ok || !m.suspends {
		return
	}
	q := j.Labels[benchQueueLabel]
	admitted := j.Spec.Suspend == nil || !*j.Spec.Suspend
	m.mu.Lock()
	defer m.mu.Unlock()
	if admitted == m.jobs[j.Name] {
		return
	}
	n := int64(ptr.Deref(j.Spec.Parallelism, 1))
	if admitted {
		m.jobs[j.Name] = true
		m.admGPUs[q] += n
		m.lastAdmit = time.Now()
	} else {
		delete(m.jobs, j.Name) // suspended again (evicted)
		m.admGPUs[q] -= n
	}
	m.checkLocked("admitted", m.admGPUs)
}

func (m *quotaMonitor) onPod(obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	q, job := p.Labels[benchQueueLabel], p.Labels[gangLabel]
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.seen[p.Name] {
		m.seen[p.Name] = true
		m.lastCreate = time.Now()
	}
	if p.Spec.NodeName == "" || m.pods[p.Name] {
		return
	}
	m.pods[p.Name] = true
	m.gpus[q]++ // one GPU per pod
	m.maxGPUs[q] = max(m.maxGPUs[q], m.gpus[q])
	m.lastBind = time.Now()
	m.jobBound[job]++
	if !m.suspends && m.jobBound[job] == kueueJobPods {
		// tessera admits a gang by binding it whole.
		m.jobs[job] = true
		m.admGPUs[q] += kueueJobPods
		m.lastAdmit = m.lastBind
		m.checkLocked("admitted", m.admGPUs)
	}
	m.checkLocked("bound", m.gpus)
}

func (m *quotaMonitor) checkLocked(what string, use map[string]int64) {
	var bad []string
	for _, q := range []string{"a", "b"} {
		if use[q] > m.shape.limit() {
			bad = append(bad, fmt.Sprintf("queue %s %s %d GPUs, limit %d", q, what, use[q], m.shape.limit()))
		}
	}
	if total := use["a"] + use["b"]; total > 2*m.shape.nominal {
		bad = append(bad, fmt.Sprintf("cohort %s %d GPUs, nominal quotas %d", what, total, 2*m.shape.nominal))
	}
	if len(bad) == 0 {
		return
	}
	m.violations++
	if m.first == "" {
		sort.Strings(bad)
		m.first = " (" + strings.Join(bad, "; ") + ")"
	}
}

func (m *quotaMonitor) boundPods() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pods)
}

func (m *quotaMonitor) result() quotaResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := quotaResult{admitted: map[string]int{}, maxGPUs: map[string]int64{}, bound: len(m.pods), violations: m.violations, first: m.first,
		lastAdmit: m.lastAdmit, lastBind: m.lastBind, created: len(m.seen), lastCreate: m.lastCreate}
	for j := range m.jobs {
		r.admitted[m.shape.queueOf[j]]++
	}
	for q, v := range m.maxGPUs {
		r.maxGPUs[q] = v
	}
	return r
}

// logTail is the last n lines of a log file.
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
