package shadow_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/catalog"
	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/shadow"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) {
	shadow.RegisterMetrics()
	os.Exit(framework.Run(m))
}

// writeRecorder records every request that is not a read.
type writeRecorder struct {
	mu     sync.Mutex
	writes []string
	next   http.RoundTripper
}

func (w *writeRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.mu.Lock()
		w.writes = append(w.writes, req.Method+" "+req.URL.Path)
		w.mu.Unlock()
	}
	return w.next.RoundTrip(req)
}

func (w *writeRecorder) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes...)
}

// TestShadowAgainstKubeScheduler: the stock kube-scheduler (DRA on) places a workload mix of
// batch Jobs: a small gang that fits, a MIG gang, a gang whose queue's limit it ignores, and a
// 12-pod gang it half-places on a node with 8 GPUs. The shadow maps the Jobs to gangs through
// the catalog and reports, for each, what the kube-scheduler did and what tessera would have
// decided; every request it makes that is not a read is a write of its own reports.
func TestShadowAgainstKubeScheduler(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cp := framework.Shared(t)
	kube := cp.Client(t)
	sc, err := client.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	install(ctx, t, cp, kube, sc)
	ns := cp.CreateNamespace(t)
	reportNS := cp.CreateNamespace(t)
	id := framework.UniqueName("s")

	whole := addNode(ctx, t, kube, id+"-whole", fixture.WholeGPUSlices(id+"-whole", 8))
	mig := addNode(ctx, t, kube, id+"-mig", fixture.PartitionableSlices(id+"-mig", 1))
	open := addQueue(ctx, t, sc, id+"-open", "")
	tight := addQueue(ctx, t, sc, id+"-tight", "1")
	for _, tmpl := range []*resourceapi.ResourceClaimTemplate{
		claimTemplate(ns, "gpu", fixture.GPUClaim(ns, "gpu", 1)),
		claimTemplate(ns, "mig", fixture.MIGClaim(ns, "mig", "1g.10gb")),
	} {
		if _, err := kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The shadow, as the chart's shadow-mode service account (read-only RBAC plus its
	// reports), with every request it makes recorded.
	rec := &writeRecorder{}
	cfg := chartIdentity(ctx, t, cp, reportNS)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec })
	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := mapper.NewCatalogResolver(ctx, cat, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel() // the resolver's informers stop with ctx
		res.Resolver.Shutdown()
	}()
	s, err := shadow.New(cfg, shadow.Options{Namespace: reportNS, Resolver: res, Period: 200 * time.Millisecond, DeadlockAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopShadow := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	var runErr error
	stopFirst := sync.OnceFunc(func() {
		stopShadow()
		runErr = <-done
	})
	defer stopFirst()
	startKubeScheduler(t, cp)

	createJob(ctx, t, kube, ns, "small", open, "gpu", whole, 2)
	waitBound(ctx, t, kube, ns, "small", 2)
	createJob(ctx, t, kube, ns, "mig", open, "mig", mig, 2)
	waitBound(ctx, t, kube, ns, "mig", 2)
	createJob(ctx, t, kube, ns, "quota", tight, "gpu", whole, 2)
	waitBound(ctx, t, kube, ns, "quota", 2)
	createJob(ctx, t, kube, ns, "big", open, "gpu", whole, 12)
	waitBound(ctx, t, kube, ns, "big", 4) // 8 GPUs, 4 taken by small and quota

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	var reports map[string]*shadowv1.ShadowReport
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		reports = listReports(ctx, t, dyn, reportNS)
		big, small, q, m := reports["big"], reports["small"], reports["quota"], reports["mig"]
		return big != nil && small != nil && q != nil && m != nil &&
			big.Actual.DeadlockTime != nil && big.Tessera.Decision != "" &&
			small.Tessera.Decision == shadowv1.DecisionPlaced && m.Tessera.Decision == shadowv1.DecisionPlaced &&
			q.Actual.QuotaViolation != "" && q.Tessera.Decision != "", nil
	}); err != nil {
		for k, r := range reports {
			t.Logf("report %s: gang %+v actual %+v tessera %+v", k, r.Gang, r.Actual, r.Tessera)
		}
		t.Fatalf("reports not complete: %v", err)
	}

	big := reports["big"]
	if big.Gang.MinMember != 12 || big.Gang.Workload != "Job "+ns+"/big" || big.Gang.MappedReason != v1alpha1.ReasonCatalog || big.Gang.ReadyTime == nil {
		t.Errorf("big gang = %+v, want the catalog's Job gang of 12, ready", big.Gang)
	}
	if a := big.Actual; a.Bound != 4 || a.MaxPartial != 4 || a.PartialStartTime == nil || a.PartialEndTime != nil || a.FullyBoundTime != nil || !slices.Equal(a.Nodes, []string{whole}) {
		t.Errorf("big actual = %+v, want 4 of 12 bound on %s and still partial", a, whole)
	}
	if tt := big.Tessera; tt.Decision != shadowv1.DecisionWaiting || tt.Reason != v1alpha1.ReasonUnschedulable || len(tt.Pods) != 0 {
		t.Errorf("big tessera = %+v, want Waiting/Unschedulable, nothing placed (whole or not at all)", tt)
	}

	small := reports["small"]
	if a := small.Actual; a.Bound != 2 || a.FullyBoundTime == nil || len(a.Pods) != 2 || len(a.Pods[0].Devices) != 1 {
		t.Errorf("small actual = %+v, want 2 pods bound with a device each", a)
	}
	if tt := small.Tessera; !slices.Equal(tt.Nodes, []string{whole}) || len(tt.Pods) != 2 || tt.Cycles < 1 || tt.DecidedTime == nil || tt.GPUUnits == nil || tt.GPUUnits.Cmp(resource.MustParse("2")) != 0 {
		t.Errorf("small tessera = %+v, want both pods on %s, 2 GPU units", tt, whole)
	}

	m := reports["mig"]
	if tt := m.Tessera; !slices.Equal(tt.Nodes, []string{mig}) || len(tt.Pods) != 2 || !strings.Contains(strings.Join(tt.Pods[0].Devices, ","), "mig-1g") {
		t.Errorf("mig tessera = %+v, want both pods on MIG 1g devices of %s", tt, mig)
	}

	q := reports["quota"]
	if !strings.Contains(q.Actual.QuotaViolation, tight) || q.Actual.FullyBoundTime == nil {
		t.Errorf("quota actual = %+v, want a violation of queue %s", q.Actual, tight)
	}
	if tt := q.Tessera; tt.Decision != shadowv1.DecisionWaiting || tt.Reason != v1alpha1.ReasonQuotaExceeded {
		t.Errorf("quota tessera = %+v, want Waiting/QuotaExceeded", tt)
	}

	// The summary the CLI prints.
	var list []shadowv1.ShadowReport
	for _, r := range reports {
		list = append(list, *r)
	}
	sum := shadowreport.Summarize(list, time.Now())
	tot := sum.Totals
	if tot.PlacedByBoth != 2 || tot.PlacedByActualOnly != 1 || tot.PlacedByNeither != 1 || tot.Deadlocks != 1 || tot.QuotaViolations != 1 {
		t.Errorf("totals = %+v", tot)
	}
	var table bytes.Buffer
	if err := shadowreport.WriteTable(&table, sum); err != nil {
		t.Fatal(err)
	}
	bigLine := ""
	for _, l := range strings.Split(table.String(), "\n") {
		if strings.Contains(l, "Job "+ns+"/big") {
			bigLine = l
		}
	}
	if !strings.Contains(bigLine, "4/12") || !strings.Contains(bigLine, "Waiting/Unschedulable") || !strings.Contains(bigLine, "deadlocked") {
		t.Errorf("report table line of the half-placed gang = %q\n%s", bigLine, table.String())
	}

	// Nothing but reports written.
	for _, w := range rec.list() {
		if !strings.Contains(w, "/namespaces/"+reportNS+"/shadowreports") {
			t.Errorf("the shadow wrote %s", w)
		}
	}
	if n := len(rec.list()); n == 0 {
		t.Error("no report written")
	}
	// The shadow's idle cycles write nothing once reports settle (no running clocks).
	before := len(rec.list())
	time.Sleep(2 * time.Second)
	if after := len(rec.list()); after != before {
		t.Errorf("%d writes in 2 s of a quiet cluster", after-before)
	}

	// A restarted shadow continues the reports it finds: on the same cluster it has nothing
	// to rewrite.
	settled := listReports(ctx, t, dyn, reportNS)
	stopFirst()
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		t.Errorf("shadow run: %v", runErr)
	}
	s2, err := shadow.New(cfg, shadow.Options{Namespace: reportNS, Resolver: res, Period: 200 * time.Millisecond, DeadlockAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx2, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- s2.Run(runCtx2) }()
	defer func() {
		stop2()
		<-done2
	}()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return s2.Cycles() >= 5, nil
	}); err != nil {
		t.Fatalf("restarted shadow ran %d cycles: %v", s2.Cycles(), err)
	}
	if after := rec.list(); len(after) != before {
		t.Errorf("the restarted shadow rewrote its reports: %v", after[before:])
	}
	again := listReports(ctx, t, dyn, reportNS)
	for k, r := range settled {
		if a := again[k]; a == nil || a.ResourceVersion != r.ResourceVersion {
			t.Errorf("report %s changed across the restart", k)
		}
	}
}

// chartIdentity creates the service account, roles and bindings the chart renders with
// scheduler.shadow.enabled in the release namespace ns, and returns a configuration that
// acts as that service account.
func chartIdentity(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns string) *rest.Config {
	t.Helper()
	prefix := framework.UniqueName("shadow")
	r, err := deployments.Render(deployments.Options{Namespace: ns, Values: map[string]any{
		"fullnameOverride": prefix,
		"scheduler":        map[string]any{"shadow": map[string]any{"enabled": true}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	rbac := func(res string) schema.GroupVersionResource { return rbacv1.SchemeGroupVersion.WithResource(res) }
	gvr := map[string]schema.GroupVersionResource{
		"ServiceAccount": v1.SchemeGroupVersion.WithResource("serviceaccounts"),
		"ClusterRole":    rbac("clusterroles"), "ClusterRoleBinding": rbac("clusterrolebindings"),
		"Role": rbac("roles"), "RoleBinding": rbac("rolebindings"),
	}
	for _, obj := range r.Objects {
		g, ok := gvr[obj.GetKind()]
		if !ok || !strings.HasPrefix(obj.GetName(), prefix+"-scheduler") {
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(g)
		if obj.GetNamespace() != "" {
			ri = dyn.Resource(g).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		t.Cleanup(func() { _ = ri.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}) })
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + prefix + "-scheduler",
		Groups: []string{"system:authenticated", "system:serviceaccounts", "system:serviceaccounts:" + ns}}
	// RBAC takes effect once the authorizer's caches have the new roles.
	kube := kubernetes.NewForConfigOrDie(cfg)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the chart's shadow service account cannot list claims: %v", err)
	}
	return cfg
}

func install(ctx context.Context, t *testing.T, cp *framework.ControlPlane, kube kubernetes.Interface, sc *client.Client) {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range []string{"scheduling.tessera.dev_queues.yaml", "scheduling.tessera.dev_podgroups.yaml", "scheduling.tessera.dev_shadowreports.yaml", "scheduling.tessera.dev_topologies.yaml"} {
		files = append(files, filepath.Join(root, "deployments", "crds", f))
	}
	if err := cp.InstallCRDFiles(ctx, files...); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := sc.Queues().List(ctx, metav1.ListOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("queues not served: %v", err)
	}
	for _, c := range fixture.DeviceClasses() {
		if _, err := kube.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func addNode(ctx context.Context, t *testing.T, kube kubernetes.Interface, name string, slices []*resourceapi.ResourceSlice) string {
	t.Helper()
	node := fixture.Node(name, map[string]string{"kubernetes.io/hostname": name})
	node.UID = ""
	created, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	created.Spec.Taints = nil // no node lifecycle controller removes the not-ready taint
	if created, err = kube.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	created.Status = node.Status
	if _, err = kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range slices {
		s.UID = ""
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: created.UID}}
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
	return name
}

func addQueue(ctx context.Context, t *testing.T, sc *client.Client, name, limit string) string {
	t.Helper()
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}}
	q.Spec.Resources.GPU = &v1alpha1.ResourceQuota{OverQuotaWeight: ptr.To[int32](1)}
	if limit != "" {
		q.Spec.Resources.GPU.Limit = ptr.To(resource.MustParse(limit))
	}
	if _, err := sc.Queues().Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Queues().Delete(context.Background(), name) })
	return name
}

func claimTemplate(ns, name string, c *resourceapi.ResourceClaim) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: resourceapi.ResourceClaimTemplateSpec{Spec: c.Spec}}
}

// createJob creates a Job of n pods at once for the kube-scheduler, each with a claim from
// the template, on one node, in a queue.
func createJob(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, name, queue, template, node string, n int32) {
	t.Helper()
	pod := v1.PodSpec{
		SchedulerName: v1.DefaultSchedulerName, RestartPolicy: v1.RestartPolicyNever,
		NodeSelector:   map[string]string{"kubernetes.io/hostname": node},
		ResourceClaims: []v1.PodResourceClaim{{Name: "acc", ResourceClaimTemplateName: ptr.To(template)}},
		Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("100Mi")},
			Claims:   []v1.ResourceClaim{{Name: "acc"}},
		}}},
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.QueueLabel: queue}},
		Spec: batchv1.JobSpec{Parallelism: ptr.To(n), Completions: ptr.To(n),
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}}, Spec: pod}},
	}
	if _, err := kube.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitBound(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, job string, want int) {
	t.Helper()
	bound := 0
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job=" + job})
		if err != nil {
			return false, err
		}
		bound = 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound >= want, nil
	}); err != nil {
		t.Fatalf("job %s: %d pods bound, want %d: %v", job, bound, want, err)
	}
}

// listReports returns the reports by the name of their Job, read as the CLI reads them.
func listReports(ctx context.Context, t *testing.T, dyn dynamic.Interface, ns string) map[string]*shadowv1.ShadowReport {
	t.Helper()
	list, err := shadowreport.Load(ctx, dyn, ns)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*shadowv1.ShadowReport{}
	for i := range list {
		w := list[i].Gang.Workload
		out[w[strings.LastIndex(w, "/")+1:]] = &list[i]
	}
	return out
}

// startKubeScheduler runs bin/k8s/kube-scheduler (v1.37.2) against the control plane until
// the test ends.
func startKubeScheduler(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	logPath := filepath.Join(t.TempDir(), "kube-scheduler.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(cp.BinDir, "kube-scheduler"),
		"--kubeconfig="+cp.KubeconfigPath, "--authentication-kubeconfig="+cp.KubeconfigPath, "--authorization-kubeconfig="+cp.KubeconfigPath,
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--v=2")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kube-scheduler: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			if len(data) > 3000 {
				data = data[len(data)-3000:]
			}
			t.Logf("kube-scheduler log tail:\n%s", data)
		}
	})
}
