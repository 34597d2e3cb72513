package shadow_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/catalog"
	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
	"github.com/tessera-gpu/tessera/controlplane/shadow"
	"github.com/tessera-gpu/tessera/test/framework"
)

// TestShadowReadsTopologyAndPriorityClasses: two decisions of the shadow that depend on
// cluster objects other than the pods, against what the stock kube-scheduler (v1.37.2) did.
//
// Topology: 4 nodes of 4 GPUs in 2 blocks of 2 racks, and a Topology object (block > rack)
// that a 6-pod Job names with KAI Scheduler's annotations, preferring one rack. No rack
// holds 6 GPUs; tessera would use as few racks as it can, ordered by the Topology's levels:
// two racks of one block. (Without the Topology's levels the racks are ordered by rack
// alone, and the freest racks, r-a and r-b, are in different blocks.)
//
// PriorityClass: on 2 more nodes of 4 GPUs, a low-priority gang and, a moment later, a
// gang of the same priority whose PriorityClass carries scheduling.tessera.dev/preemptible=
// false fill both nodes; then a high-priority gang of the same queue needs a node. The
// kube-scheduler leaves it pending (its preemption cannot free devices held through
// ResourceClaims); tessera would evict the preemptible low gang, not the protected one —
// though that one is younger, which tessera evicts first among equals.
func TestShadowReadsTopologyAndPriorityClasses(t *testing.T) {
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
	id := framework.UniqueName("tp")
	const blockKey, rackKey, poolKey = "example.com/block", "example.com/rack", "example.com/pool"

	// Pool T: 2 blocks × 2 racks × 1 node. Rack names interleave the blocks.
	for _, n := range []struct{ name, block, rack string }{
		{"t0", "b0", "r-a"}, {"t1", "b0", "r-c"}, {"t2", "b1", "r-b"}, {"t3", "b1", "r-d"},
	} {
		name := addNode(ctx, t, kube, id+"-"+n.name, fixture.WholeGPUSlices(id+"-"+n.name, 4))
		labelNode(ctx, t, kube, name, map[string]string{blockKey: n.block, rackKey: n.rack, poolKey: id + "-t"})
	}
	// Pool P: 2 nodes.
	for _, n := range []string{"p0", "p1"} {
		name := addNode(ctx, t, kube, id+"-"+n, fixture.WholeGPUSlices(id+"-"+n, 4))
		labelNode(ctx, t, kube, name, map[string]string{poolKey: id + "-p"})
	}
	topo := &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: id + "-blocks"},
		Spec: v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{{NodeLabel: blockKey}, {NodeLabel: rackKey}}}}
	if _, err := sc.Topologies().Create(ctx, topo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Topologies().Delete(context.Background(), topo.Name) })
	classes := map[string]*schedulingv1.PriorityClass{
		"low":  {ObjectMeta: metav1.ObjectMeta{Name: id + "-low"}, Value: 100},
		"kept": {ObjectMeta: metav1.ObjectMeta{Name: id + "-kept", Labels: map[string]string{v1alpha1.PreemptibleLabel: "false"}}, Value: 100},
		"high": {ObjectMeta: metav1.ObjectMeta{Name: id + "-high"}, Value: 1000},
	}
	for _, pc := range classes {
		if _, err := kube.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.SchedulingV1().PriorityClasses().Delete(context.Background(), pc.Name, metav1.DeleteOptions{})
		})
	}
	// A queue with quota for everything here: a non-preemptible gang may not borrow.
	queue := id + "-q"
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: queue}}
	q.Spec.Resources.GPU = &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse("32"))}
	if _, err := sc.Queues().Create(ctx, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Queues().Delete(context.Background(), queue) })
	for _, tmpl := range []*resourceapi.ResourceClaimTemplate{
		claimTemplate(ns, "gpu", fixture.GPUClaim(ns, "gpu", 1)),
		claimTemplate(ns, "gpu4", fixture.GPUClaim(ns, "gpu4", 4)),
	} {
		if _, err := kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The shadow, as the chart's shadow-mode service account, with its writes recorded.
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
	s, err := shadow.New(cfg, shadow.Options{Namespace: reportNS, Resolver: res, Period: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		res.Resolver.Shutdown()
	}()
	startKubeScheduler(t, cp)

	inPool := func(pool string) func(*v1.PodSpec, *metav1.ObjectMeta) {
		return func(spec *v1.PodSpec, _ *metav1.ObjectMeta) {
			spec.NodeSelector = map[string]string{poolKey: id + "-" + pool}
		}
	}
	withClass := func(class string) func(*v1.PodSpec, *metav1.ObjectMeta) {
		return func(spec *v1.PodSpec, meta *metav1.ObjectMeta) {
			inPool("p")(spec, meta)
			spec.PriorityClassName = classes[class].Name
		}
	}
	createJobWith(ctx, t, kube, ns, "spread", queue, "gpu", 6, func(spec *v1.PodSpec, meta *metav1.ObjectMeta) {
		inPool("t")(spec, meta)
		meta.Annotations = map[string]string{"kai.scheduler/topology": topo.Name, "kai.scheduler/topology-preferred-placement": rackKey}
	})
	createJobWith(ctx, t, kube, ns, "low", queue, "gpu4", 1, withClass("low"))
	waitBound(ctx, t, kube, ns, "spread", 6)
	waitBound(ctx, t, kube, ns, "low", 1)
	time.Sleep(1100 * time.Millisecond) // kept is younger than low (timestamps have seconds)
	createJobWith(ctx, t, kube, ns, "kept", queue, "gpu4", 1, withClass("kept"))
	waitBound(ctx, t, kube, ns, "kept", 1)

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	waitReports := func(what string, done func(map[string]*shadowv1.ShadowReport) bool) map[string]*shadowv1.ShadowReport {
		t.Helper()
		var reports map[string]*shadowv1.ShadowReport
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			reports = listReports(ctx, t, dyn, reportNS)
			return done(reports), nil
		}); err != nil {
			for k, r := range reports {
				t.Logf("report %s: gang %+v actual %+v tessera %+v", k, r.Gang, r.Actual, r.Tessera)
			}
			t.Fatalf("%s: %v", what, err)
		}
		return reports
	}
	placed := func(r *shadowv1.ShadowReport) bool { return r != nil && r.Tessera.Decision == shadowv1.DecisionPlaced }
	reports := waitReports("reports of spread, low and kept", func(r map[string]*shadowv1.ShadowReport) bool {
		return placed(r["spread"]) && placed(r["low"]) && placed(r["kept"])
	})

	// Topology: tessera keeps the gang in one block (two racks of it).
	block := map[string]string{id + "-t0": "b0", id + "-t1": "b0", id + "-t2": "b1", id + "-t3": "b1"}
	spread := reports["spread"]
	blocks := map[string]bool{}
	for _, n := range spread.Tessera.Nodes {
		blocks[block[n]] = true
	}
	if len(spread.Tessera.Pods) != 6 || len(spread.Tessera.Nodes) != 2 || len(blocks) != 1 {
		t.Errorf("spread: tessera would place %d pods on %v (blocks %v), want 6 on the two nodes of one block", len(spread.Tessera.Pods), spread.Tessera.Nodes, blocks)
	}
	actualBlocks := map[string]bool{}
	for _, n := range spread.Actual.Nodes {
		actualBlocks[block[n]] = true
	}
	if spread.Actual.Bound != 6 || len(spread.Actual.Nodes) == 0 {
		t.Errorf("spread actual = %+v, want 6 pods bound", spread.Actual)
	}
	t.Logf("spread: the kube-scheduler used %v (%d blocks), tessera would use %v", spread.Actual.Nodes, len(actualBlocks), spread.Tessera.Nodes)

	// PriorityClass: the high gang of the same queue.
	createJobWith(ctx, t, kube, ns, "high", queue, "gpu4", 1, withClass("high"))
	reports = waitReports("the high gang's report with its victims", func(r map[string]*shadowv1.ShadowReport) bool {
		h := r["high"]
		return h != nil && h.Gang.ReadyTime != nil && len(h.Tessera.Reclaim) > 0
	})
	high := reports["high"]
	if tt := high.Tessera; tt.Decision != shadowv1.DecisionWaiting || len(tt.Reclaim) != 1 || tt.Reclaim[0] != ns+"/"+reports["low"].Gang.Name {
		t.Errorf("high: tessera = %+v, want Waiting while it evicts the preemptible low gang %s/%s only", tt, ns, reports["low"].Gang.Name)
	}
	if a := high.Actual; a.Bound != 0 || a.FirstBoundTime != nil {
		t.Errorf("high: actual = %+v, want left pending by the kube-scheduler", a)
	}
	for _, name := range []string{"low", "kept"} {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job=" + name})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Spec.NodeName == "" || pods.Items[0].DeletionTimestamp != nil {
			t.Errorf("%s: pods %v (%v), want its one pod still bound (the shadow evicts nothing)", name, podNames(pods), err)
		}
	}
	for _, w := range rec.list() {
		if !strings.Contains(w, "/namespaces/"+reportNS+"/shadowreports") {
			t.Errorf("the shadow wrote %s", w)
		}
	}
	out, _ := json.Marshal(high.Tessera)
	t.Logf("high: tessera %s", out)
}

// createJobWith creates a Job of n pods for the kube-scheduler, each with a claim from the
// template, in a queue; set adjusts the pod template.
func createJobWith(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, name, queue, template string, n int32, set func(*v1.PodSpec, *metav1.ObjectMeta)) {
	t.Helper()
	tmpl := v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}}, Spec: v1.PodSpec{
		SchedulerName: v1.DefaultSchedulerName, RestartPolicy: v1.RestartPolicyNever,
		ResourceClaims: []v1.PodResourceClaim{{Name: "acc", ResourceClaimTemplateName: ptr.To(template)}},
		Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("100Mi")},
			Claims:   []v1.ResourceClaim{{Name: "acc"}},
		}}},
	}}
	set(&tmpl.Spec, &tmpl.ObjectMeta)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{v1alpha1.QueueLabel: queue}},
		Spec:       batchv1.JobSpec{Parallelism: ptr.To(n), Completions: ptr.To(n), Template: tmpl},
	}
	if _, err := kube.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func labelNode(ctx context.Context, t *testing.T, kube kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func podNames(pods *v1.PodList) []string {
	if pods == nil {
		return nil
	}
	var out []string
	for _, p := range pods.Items {
		out = append(out, p.Name+"@"+p.Spec.NodeName)
	}
	slices.Sort(out)
	return out
}
