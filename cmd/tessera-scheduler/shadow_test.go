package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/shadowreport"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// TestShadowFlag runs the binary's run() with --shadow on a cluster where nothing places the
// pods of a 2-pod Job for the default scheduler: the Job's gang gets a report (mapped through
// the catalog) saying tessera would have placed it, and the metrics say so.
func TestShadowFlag(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cp := framework.Shared(t)
	kube := cp.Client(t)
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range []string{"queues", "podgroups", "shadowreports", "topologies"} {
		files = append(files, filepath.Join(root, "deployments", "crds", "scheduling.tessera.dev_"+f+".yaml"))
	}
	if err := cp.InstallCRDFiles(ctx, files...); err != nil {
		t.Fatal(err)
	}
	for _, c := range fixture.DeviceClasses() {
		if _, err := kube.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sc, err := client.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns, reportNS := cp.CreateNamespace(t), cp.CreateNamespace(t)
	node := framework.UniqueName("n")
	created, err := kube.CoreV1().Nodes().Create(ctx, func() *v1.Node { n := fixture.Node(node, nil); n.UID = ""; return n }(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	created.Spec.Taints = nil
	if created, err = kube.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	created.Status = fixture.Node(node, nil).Status
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range fixture.WholeGPUSlices(node, 2) {
		s.UID = ""
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
	queue := framework.UniqueName("q")
	if _, err := sc.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: queue}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Queues().Delete(context.Background(), queue) })
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: fixture.GPUClaim(ns, "gpu", 1).Spec}}
	if _, err := kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "train", Labels: map[string]string{v1alpha1.QueueLabel: queue}},
		Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](2), Completions: ptr.To[int32](2), Template: v1.PodTemplateSpec{Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever, ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}},
			Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}, Claims: []v1.ResourceClaim{{Name: "gpu"}}}}},
		}}},
	}
	if _, err := kube.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	o := newOptions()
	o.kubeconfig, o.shadow, o.shadowNamespace, o.serving.InsecureAddress, o.period = cp.KubeconfigPath, true, reportNS, addr, 200*time.Millisecond
	o.serving.SecureServing.BindPort = 0 // plain HTTP only, on a free port
	done := make(chan error, 1)
	go func() { done <- run(ctx, o) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	var got []shadowv1.ShadowReport
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = shadowreport.Load(ctx, dyn, reportNS)
		return err == nil && len(got) == 1 && got[0].Tessera.Decision == shadowv1.DecisionPlaced, nil
	}); err != nil {
		t.Fatalf("reports %+v: %v", got, err)
	}
	r := got[0]
	if r.Gang.Workload != "Job "+ns+"/train" || r.Gang.MinMember != 2 || r.Gang.SchedulerName != v1.DefaultSchedulerName || r.Actual.Bound != 0 || len(r.Tessera.Pods) != 2 || r.Tessera.Nodes[0] != node {
		t.Errorf("report = %+v", r)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", addr))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `tessera_shadow_gangs{placed_by="tessera_only"} 1`) {
		t.Errorf("/metrics lacks the tessera-only gang:\n%s", grepLines(string(body), "tessera_shadow_gangs"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
