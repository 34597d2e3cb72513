package overview

import (
	"context"
	"io/fs"
	"os"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/deployments/crds"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// validSlices splits testSlice as the API server wants it (and the node
// agent publishes it): shared counters in one slice, devices in another, one
// pool of two slices.
func validSlices(node string) []resourceapi.ResourceSlice {
	s := testSlice(node)
	s.Spec.Pool.ResourceSliceCount = 2
	counters, devices := s, *s.DeepCopy()
	counters.Name, devices.Name = node+"-counters", node+"-devices"
	counters.Spec.Devices, devices.Spec.SharedCounters = nil, nil
	return []resourceapi.ResourceSlice{counters, devices}
}

func createSlices(t *testing.T, ctx context.Context, cp *framework.ControlPlane, node string) {
	t.Helper()
	client := cp.Client(t)
	for _, s := range validSlices(node) {
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{})
		})
	}
}

func installCRDs(t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	names, err := fs.Glob(crds.FS, "*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		data, err := fs.ReadFile(crds.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			t.Fatal(err)
		}
		if err := cp.InstallCRD(context.Background(), crd); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWatcherFollowsTheCluster: the Watcher's overview is what Build makes
// of the API objects, and follows them as they change, without lists.
func TestWatcherFollowsTheCluster(t *testing.T) {
	cp := framework.Shared(t)
	installCRDs(t, cp)
	client := cp.Client(t)
	sched, err := schedclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := framework.UniqueName("wn")
	createSlices(t, ctx, cp, node)
	queue := framework.UniqueName("wq")
	if _, err := sched.Queues().Create(ctx, &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: queue},
		Spec: v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse("4")), Limit: ptr.To(resource.MustParse("6"))}}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sched.Queues().Delete(context.Background(), queue) })
	ns := cp.CreateNamespace(t)
	pg, err := sched.PodGroups(ns).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train"}, Spec: v1alpha1.PodGroupSpec{MinMember: 4, Queue: queue}})
	if err != nil {
		t.Fatal(err)
	}

	w, err := NewWatcher(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	w.Start(ctx)
	if err := w.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	eventually := func(what string, cond func(Cluster) bool) {
		t.Helper()
		var last Cluster
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			c, err := w.Overview(ctx, time.Now())
			last = c
			return err == nil && cond(c), err
		})
		if err != nil {
			t.Fatalf("%s: %v; overview %+v", what, err, last)
		}
	}
	findNode := func(c Cluster) *Node {
		for i := range c.Nodes {
			if c.Nodes[i].Name == node {
				return &c.Nodes[i]
			}
		}
		return nil
	}
	eventually("the node, the queue and the gang", func(c Cluster) bool {
		n := findNode(c)
		var q *Queue
		for i := range c.Queues {
			if c.Queues[i].Name == queue {
				q = &c.Queues[i]
			}
		}
		var g *Gang
		for i := range c.Gangs {
			if c.Gangs[i].Namespace == ns {
				g = &c.Gangs[i]
			}
		}
		return n != nil && len(n.GPUs) == 3 && n.GPUs[2].Tainted && q != nil && *q.Limit == 6 && g != nil && g.Phase == "Pending"
	})

	// A claim allocated on GPU 0, and the gang's reason: the overview follows.
	cl, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "any"}}}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cl.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: Driver, Pool: node, Device: "gpu-0"}}}}
	if _, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&pg.Status.Conditions, metav1.Condition{Type: v1alpha1.PodGroupConditionScheduled, Status: metav1.ConditionFalse,
		Reason: v1alpha1.ReasonQuotaExceeded, Message: "over the limit"})
	if _, err := sched.PodGroups(ns).UpdateStatus(ctx, pg); err != nil {
		t.Fatal(err)
	}
	eventually("GPU 0 allocated and the gang's reason", func(c Cluster) bool {
		n := findNode(c)
		for _, g := range c.Gangs {
			if g.Namespace == ns && g.ReasonCode == v1alpha1.ReasonQuotaExceeded && g.Reason == "over the limit" {
				return n != nil && n.GPUs[0].Used == 1 && n.GPUs[0].Detail == "whole"
			}
		}
		return false
	})
}

// TestWatcherWithoutTesseraCRDs: on a cluster without tessera's CRDs the
// overview has nodes but no queues or gangs, as Fetch's has.
func TestWatcherWithoutTesseraCRDs(t *testing.T) {
	cp := framework.StartForTest(t, framework.Options{NoControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createSlices(t, ctx, cp, "bare")
	w, err := NewWatcher(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	w.Start(ctx)
	if err := w.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := w.Overview(ctx, time.Now())
	if err != nil || len(c.Nodes) != 1 || len(c.Queues) != 0 || len(c.Gangs) != 0 {
		t.Errorf("overview = %+v, %v; want the node alone", c, err)
	}
}
