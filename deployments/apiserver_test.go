package deployments_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/catalog"
	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/test/framework"
)

// nodeNameExtra is the user-info extra that the API server fills from a
// node-bound service-account token (the kubelet's tokens for pods).
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// cluster is the shared control plane with the CRDs the tests need: the
// chart's own and minimal stand-ins for the third-party kinds (testdata).
type cluster struct {
	cp     *framework.ControlPlane
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

var (
	clusterOnce sync.Once
	theCluster  *cluster
	clusterErr  error
)

func getCluster(t *testing.T) *cluster {
	t.Helper()
	cp := framework.Shared(t)
	clusterOnce.Do(func() { theCluster, clusterErr = setUpCluster(t, cp) })
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return theCluster
}

func setUpCluster(t *testing.T, cp *framework.ControlPlane) (*cluster, error) {
	ctx := context.Background()
	r, err := deployments.Render(deployments.Options{})
	if err != nil {
		return nil, err
	}
	crds := r.CRDs
	files, err := filepath.Glob(filepath.Join(deployments.Dir(), "testdata", "crds", "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := deployments.DecodeAll(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		crds = append(crds, objs...)
	}
	for _, u := range crds {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
			return nil, fmt.Errorf("CRD %s: %w", u.GetName(), err)
		}
		if err := cp.InstallCRD(ctx, crd); err != nil {
			return nil, err
		}
	}
	// The NVIDIA container toolkit's RuntimeClass, as the GPU operator
	// creates it: pods of the chart's DaemonSet name it.
	client := cp.Client(t)
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"}
	if _, err := client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create RuntimeClass nvidia: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	return &cluster{cp: cp, client: client, dyn: dyn, mapper: mapper}, nil
}

// resource finds where an object lives; namespaced objects without a
// namespace go to ns.
func (c *cluster) resource(t *testing.T, dyn dynamic.Interface, obj *unstructured.Unstructured, ns string) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s %s: no such kind on the API server: %v", gvk, obj.GetName(), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameRoot {
		return dyn.Resource(m.Resource)
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(ns)
	}
	return dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
}

// dryRun creates obj with server-side dry run and strict field validation:
// admission, defaulting, validation (CEL included) and unknown fields are
// all checked, nothing is stored.
func (c *cluster) dryRun(t *testing.T, obj *unstructured.Unstructured, ns string) error {
	t.Helper()
	obj = obj.DeepCopy()
	_, err := c.resource(t, c.dyn, obj, ns).Create(context.Background(), obj, metav1.CreateOptions{
		DryRun:          []string{metav1.DryRunAll},
		FieldValidation: metav1.FieldValidationStrict,
	})
	return err
}

// create stores obj for real and deletes it at the end of the test.
func (c *cluster) create(t *testing.T, obj *unstructured.Unstructured, ns string) {
	t.Helper()
	obj = obj.DeepCopy()
	res := c.resource(t, c.dyn, obj, ns)
	if _, err := res.Create(context.Background(), obj, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
	t.Cleanup(func() { _ = res.Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}) })
}

func TestChartDryRun(t *testing.T) {
	c := getCluster(t)
	cases := append([]struct{ name, values string }{{"defaults", ""}}, func() (out []struct{ name, values string }) {
		for _, tc := range combinations {
			out = append(out, struct{ name, values string }{tc.name, tc.values})
		}
		return out
	}()...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := c.cp.CreateNamespace(t)
			r := render(t, ns, tc.values)
			if len(r.Objects) == 0 {
				t.Fatal("nothing rendered")
			}
			for _, obj := range r.Objects {
				if obj.GetKind() == "Namespace" {
					// The node namespace: objects in it are refused unless
					// it exists.
					c.create(t, obj, "")
					continue
				}
				if err := c.dryRun(t, obj, ns); err != nil {
					t.Errorf("%s %s refused: %v", obj.GetKind(), obj.GetName(), err)
				}
			}
		})
	}
}

// TestPlainManifestsDryRun applies deployments/manifests/ as a user without
// Helm would (the namespace is the first object of tessera.yaml).
func TestPlainManifestsDryRun(t *testing.T) {
	c := getCluster(t)
	data, err := os.ReadFile(filepath.Join(deployments.Dir(), "manifests", "tessera.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deployments.DecodeAll(data)
	if err != nil {
		t.Fatal(err)
	}
	if objs[0].GetKind() != "Namespace" || objs[0].GetName() != deployments.DefaultNamespace {
		t.Fatalf("tessera.yaml starts with %s %s, want its namespace", objs[0].GetKind(), objs[0].GetName())
	}
	// Dry-run objects in a namespace that does not exist are refused, so
	// the namespaces (the release one, labelled restricted, and the node
	// namespace) are created for real.
	if objs[0].GetLabels()["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the release namespace has labels %v, want Pod Security restricted enforced", objs[0].GetLabels())
	}
	c.create(t, objs[0], "")
	for _, obj := range objs[1:] {
		if obj.GetKind() == "Namespace" {
			c.create(t, obj, "")
			continue
		}
		if err := c.dryRun(t, obj, ""); err != nil {
			t.Errorf("%s %s refused: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

func exampleObjects(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployments.Dir(), "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 9 {
		t.Fatalf("found %d examples, want at least 9", len(files))
	}
	out := map[string][]*unstructured.Unstructured{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := deployments.DecodeAll(data)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		out[filepath.Base(f)] = objs
	}
	return out
}

func TestExamplesDryRun(t *testing.T) {
	c := getCluster(t)
	ns := c.cp.CreateNamespace(t)
	kinds := map[string]bool{}
	for file, objs := range exampleObjects(t) {
		for _, obj := range objs {
			kinds[obj.GetKind()] = true
			if err := c.dryRun(t, obj, ns); err != nil {
				t.Errorf("%s: %s %s refused: %v", file, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	for _, k := range []string{"ResourceClaimTemplate", "ResourceClaim", "Pod", "Deployment", "PyTorchJob", "JobSet", "Queue"} {
		if !kinds[k] {
			t.Errorf("no example has a %s", k)
		}
	}
}

// impersonate returns a client acting as user, with the groups every
// service account has and the given extras.
func impersonate(t *testing.T, cp *framework.ControlPlane, user string, extra map[string][]string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	groups := []string{"system:authenticated"}
	if parts := strings.Split(user, ":"); len(parts) == 4 && parts[1] == "serviceaccount" {
		groups = append(groups, "system:serviceaccounts", "system:serviceaccounts:"+parts[2])
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups, Extra: extra}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// nodeNamespace is the chart's default namespace of the node agents for the
// release namespace ns (node.namespace empty; TestDefaultRender checks it).
func nodeNamespace(ns string) string { return ns + "-node" }

// install creates the chart's access-control objects for real (service
// accounts, roles, bindings, admission policies) in a fresh namespace under a
// unique name, with the node namespace the chart creates, and returns the
// release namespace and name prefix.
func install(t *testing.T, c *cluster, extraValues string) (ns, prefix string) {
	t.Helper()
	ns = c.cp.CreateNamespace(t)
	prefix = framework.UniqueName("t")
	r := render(t, ns, fmt.Sprintf("{fullnameOverride: %s, %s}", prefix, extraValues))
	for _, obj := range r.Objects {
		switch obj.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			c.create(t, obj, ns)
		}
	}
	return ns, prefix
}

func slice(name, node string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:  contract.DriverName,
			Pool:    resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
	if node == "" {
		s.Spec.AllNodes = ptr.To(true)
	} else {
		s.Spec.NodeName = ptr.To(node)
	}
	return s
}

// waitForPolicy waits until the admission policy is in force: policies are
// loaded asynchronously, a second or so after they are created.
func waitForPolicy(t *testing.T, probe func() error, message string) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = probe()
		return last != nil && strings.Contains(last.Error(), message), nil
	})
	if err != nil {
		t.Fatalf("admission policy not in force after 30s; last probe: %v", last)
	}
}

func wantForbidden(t *testing.T, what string, err error, message string) {
	t.Helper()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: err = %v, want it refused", what, err)
		return
	}
	if !strings.Contains(err.Error(), message) {
		t.Errorf("%s: refused with %q, want a message containing %q", what, err, message)
	}
}

func wantAllowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// TestNodeAgentWritesOnlyItsOwnSlices proves the ValidatingAdmissionPolicy
// with requests as the node agent's service account carrying a node-bound
// token's node name (impersonation sets the same user-info extra).
func TestNodeAgentWritesOnlyItsOwnSlices(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	user := "system:serviceaccount:" + nodeNamespace(ns) + ":" + prefix + "-node"
	onA := impersonate(t, c.cp, user, map[string][]string{nodeNameExtra: {"node-a"}}).ResourceV1().ResourceSlices()
	noNode := impersonate(t, c.cp, user, nil).ResourceV1().ResourceSlices()
	admin := c.client.ResourceV1().ResourceSlices()
	name := func(s string) string { return prefix + "-" + s }
	t.Cleanup(func() {
		for _, n := range []string{"a", "b", "probe"} {
			_ = admin.Delete(context.Background(), name(n), metav1.DeleteOptions{})
		}
	})

	waitForPolicy(t, func() error {
		_, err := onA.Create(ctx, slice(name("b"), "node-b"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}, "may only write ResourceSlices with spec.nodeName node-a")

	_, err := onA.Create(ctx, slice(name("b"), "node-b"), metav1.CreateOptions{})
	wantForbidden(t, "node-a agent creates a slice for node-b", err, "not node-b")
	_, err = onA.Create(ctx, slice(name("all"), ""), metav1.CreateOptions{})
	wantForbidden(t, "node-a agent creates a slice for all nodes", err, "not a slice without spec.nodeName")
	_, err = noNode.Create(ctx, slice(name("a"), "node-a"), metav1.CreateOptions{})
	wantForbidden(t, "agent token without a node creates a slice", err, "names no node")

	// Its own node: create (also as the dry-run feature probe), update, delete.
	_, err = onA.Create(ctx, slice(name("probe"), "node-a"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	wantAllowed(t, "node-a agent's dry-run feature probe", err)
	own, err := onA.Create(ctx, slice(name("a"), "node-a"), metav1.CreateOptions{})
	wantAllowed(t, "node-a agent creates its own slice", err)
	if own != nil {
		own.Spec.Devices = append(own.Spec.Devices, resourceapi.Device{Name: "gpu-1"})
		own, err = onA.Update(ctx, own, metav1.UpdateOptions{})
		wantAllowed(t, "node-a agent updates its own slice", err)
	}

	// Another node's slice, written by someone else: no change, no delete.
	other, err := admin.Create(ctx, slice(name("b"), "node-b"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("admin creates node-b's slice (the policy must not apply to others): %v", err)
	}
	other.Spec.Devices = nil
	other.Spec.Devices = []resourceapi.Device{{Name: "gpu-7"}}
	_, err = onA.Update(ctx, other, metav1.UpdateOptions{})
	wantForbidden(t, "node-a agent updates node-b's slice", err, "not node-b")
	err = onA.Delete(ctx, other.Name, metav1.DeleteOptions{})
	wantForbidden(t, "node-a agent deletes node-b's slice", err, "may not change or delete ResourceSlices of node node-b")
	if _, err := admin.Get(ctx, other.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("node-b's slice is gone: %v", err)
	}
	if own != nil {
		wantAllowed(t, "node-a agent deletes its own slice", onA.Delete(ctx, own.Name, metav1.DeleteOptions{}))
	}
}

// TestSchedulerWritesAreNarrowed: the scheduler's create permission on slices
// and claims serves dry-run feature probes only, and its claim updates may
// only touch finalizers; claim status (allocation) is its job.
func TestSchedulerWritesAreNarrowed(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	sched := impersonate(t, c.cp, "system:serviceaccount:"+ns+":"+prefix+"-scheduler", nil)
	claims := sched.ResourceV1().ResourceClaims(ns)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: contract.ClassGPU},
		}}}},
	}
	waitForPolicy(t, func() error {
		probe := claim.DeepCopy()
		probe.Name = ""
		probe.GenerateName = "probe-"
		got, err := claims.Create(ctx, probe, metav1.CreateOptions{})
		if err == nil {
			// Created before the policy was in force.
			_ = c.client.ResourceV1().ResourceClaims(ns).Delete(ctx, got.Name, metav1.DeleteOptions{})
		}
		return err
	}, "only as a dry run")

	_, err := claims.Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	wantAllowed(t, "scheduler's dry-run claim probe", err)
	_, err = sched.ResourceV1().ResourceSlices().Create(ctx, slice(prefix+"-probe", ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	wantAllowed(t, "scheduler's dry-run slice probe", err)
	_, err = sched.ResourceV1().ResourceSlices().Create(ctx, slice(prefix+"-probe", ""), metav1.CreateOptions{})
	wantForbidden(t, "scheduler publishes a slice", err, "only as a dry run")

	// A user's claim: the scheduler adds its finalizer and writes the
	// allocation, but cannot relabel the claim.
	stored, err := c.client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored.Finalizers = append(stored.Finalizers, resourceapi.Finalizer)
	withFinalizer, err := claims.Update(ctx, stored, metav1.UpdateOptions{})
	wantAllowed(t, "scheduler adds the claim finalizer", err)
	if err != nil {
		t.FailNow()
	}
	stored = withFinalizer
	stored.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: contract.DriverName, Pool: "node-a", Device: "gpu-0"}},
	}}
	allocated, err := claims.UpdateStatus(ctx, stored, metav1.UpdateOptions{})
	wantAllowed(t, "scheduler writes the allocation", err)
	if err != nil {
		t.FailNow()
	}
	stored = allocated
	stored.Labels = map[string]string{"owner": "scheduler"}
	_, err = claims.Update(ctx, stored, metav1.UpdateOptions{})
	wantForbidden(t, "scheduler relabels a claim", err, "may change only the finalizers")
	stored.Labels = nil
	stored.Finalizers = nil
	_, err = claims.Update(ctx, stored, metav1.UpdateOptions{})
	wantAllowed(t, "scheduler removes the claim finalizer", err)
}

// can asks the API server's authorizer whether user may do verb on
// group/resource[/subresource] in ns (a SubjectAccessReview).
func can(t *testing.T, c *cluster, user, verb, group, resource, ns, name string) bool {
	t.Helper()
	groups := []string{"system:authenticated"}
	if parts := strings.Split(user, ":"); len(parts) == 4 && parts[1] == "serviceaccount" {
		groups = append(groups, "system:serviceaccounts", "system:serviceaccounts:"+parts[2])
	}
	res, sub, _ := strings.Cut(resource, "/")
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: verb, Group: group, Resource: res, Subresource: sub, Name: name,
		},
	}}
	got, err := c.client.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return got.Status.Allowed
}

type access struct {
	verb, group, resource, ns, name string
	allowed                         bool
}

func checkAccess(t *testing.T, c *cluster, who, user string, want []access) {
	t.Helper()
	for _, a := range want {
		if got := can(t, c, user, a.verb, a.group, a.resource, a.ns, a.name); got != a.allowed {
			t.Errorf("%s may %s %s.%s (ns %q, name %q): %v, want %v", who, a.verb, a.resource, a.group, a.ns, a.name, got, a.allowed)
		}
	}
}

func TestRBAC(t *testing.T) {
	c := getCluster(t)
	ns, prefix := install(t, c, "rbac: {queueAdmin: {enabled: false}}")
	node := "system:serviceaccount:" + nodeNamespace(ns) + ":" + prefix + "-node"
	sched := "system:serviceaccount:" + ns + ":" + prefix + "-scheduler"
	const other = "some-namespace"
	const rs = "resource.k8s.io"
	const sg = "scheduling.tessera.dev"

	checkAccess(t, c, "node agent", node, []access{
		{"create", rs, "resourceslices", "", "", true},
		{"update", rs, "resourceslices", "", "", true},
		{"delete", rs, "resourceslices", "", "", true},
		{"get", rs, "resourceclaims", other, "x", true},
		// It cannot enumerate claims, nor touch them.
		{"list", rs, "resourceclaims", other, "", false},
		{"watch", rs, "resourceclaims", other, "", false},
		{"update", rs, "resourceclaims", other, "x", false},
		// status.devices only (the API server checks the driver verb and
		// the node; allocation takes resourceclaims/binding).
		{"update", rs, "resourceclaims/status", other, "x", true},
		{"associated-node:update", rs, "resourceclaims/driver", other, "gpu.tessera.dev", true},
		{"associated-node:update", rs, "resourceclaims/driver", other, "gpu.nvidia.com", false},
		{"arbitrary-node:update", rs, "resourceclaims/driver", other, "gpu.tessera.dev", false},
		{"update", rs, "resourceclaims/binding", other, "x", false},
		// Pods: only its MPS daemon pods, in its own namespace (the
		// admission policy narrows them further), and nothing else: not in
		// the release namespace, which enforces Pod Security "restricted".
		{"create", "", "pods", nodeNamespace(ns), "", true},
		{"delete", "", "pods", nodeNamespace(ns), "x", true},
		{"update", "", "pods", nodeNamespace(ns), "x", false},
		{"create", "", "pods", ns, "", false},
		{"delete", "", "pods", ns, "x", false},
		{"create", "", "pods", other, "", false},
		{"update", "", "pods", other, "x", false},
		{"patch", "", "pods", other, "x", false},
		{"delete", "", "pods", other, "x", false},
		{"create", "", "pods/binding", other, "x", false},
		{"update", "", "pods/status", other, "x", false},
		{"create", "", "pods/eviction", other, "x", false},
		{"get", "", "secrets", other, "x", false},
		{"update", "", "nodes", "", "x", false},
		{"create", rs, "deviceclasses", "", "", false},
		{"create", sg, "queues", "", "", false},
	})

	leaseName := prefix + "-scheduler"
	want := []access{
		{"create", "", "pods/binding", other, "x", true},
		{"create", "", "pods/eviction", other, "x", true}, // reclaim, through the Eviction API
		{"patch", "", "pods/status", other, "x", true},
		{"update", rs, "resourceclaims/status", other, "x", true},
		{"update", rs, "resourceclaims/binding", other, "x", true},
		{"create", sg, "podgroups", other, "", true},
		{"update", sg, "queues/status", "", "x", true},
		// The kube-scheduler's volume binder and filters; the Kubernetes gang API.
		{"update", "", "persistentvolumeclaims", other, "x", true},
		{"update", "", "persistentvolumes", "", "x", true},
		{"watch", "storage.k8s.io", "csistoragecapacities", other, "", true},
		{"watch", rs, "devicetaintrules", "", "", true},
		{"watch", "scheduling.k8s.io", "podgroups", other, "", true},
		{"update", "scheduling.k8s.io", "podgroups/status", other, "x", true},
		{"update", "scheduling.k8s.io", "podgroups", other, "x", false},
		{"create", "coordination.k8s.io", "leases", ns, "", true},
		{"update", "coordination.k8s.io", "leases", ns, leaseName, true},
		// It never deletes or edits pods, never writes queues, leases of
		// others, secrets, or slices.
		{"delete", "", "pods", other, "x", false},
		{"deletecollection", "", "pods", other, "", false},
		{"update", "", "pods", other, "x", false},
		{"patch", "", "pods", other, "x", false},
		{"create", "", "pods", other, "", false},
		// Claims: deleting one is allowed by RBAC for the claims of pods' DRA extended
		// resources, which the admission policy alone lets through
		// (TestSchedulerVolumeAndClaimWritesAreNarrowed).
		{"delete", rs, "resourceclaims", other, "x", true},
		{"update", rs, "resourceslices", "", "x", false},
		{"delete", rs, "resourceslices", "", "x", false},
		{"create", sg, "queues", "", "", false},
		{"update", sg, "queues", "", "x", false},
		{"update", "coordination.k8s.io", "leases", ns, "kube-scheduler", false},
		{"update", "coordination.k8s.io", "leases", other, leaseName, false},
		{"get", "", "secrets", other, "x", false},
	}
	// The scheduler reads every kind that a built-in catalog definition
	// names, or the catalog could not map those workloads.
	for _, gvk := range catalogKinds(t) {
		plural, _ := meta.UnsafeGuessKindToResource(gvk)
		want = append(want, access{"watch", gvk.Group, plural.Resource, other, "", true})
	}
	checkAccess(t, c, "scheduler", sched, want)

	// Real requests, not only reviews: a pod that exists cannot be deleted
	// or edited by the scheduler, nor created by the node agent.
	ctx := context.Background()
	podNS := c.cp.CreateNamespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "victim"},
		Spec:       corev1.PodSpec{SchedulerName: "tessera-scheduler", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	stored, err := c.client.CoreV1().Pods(podNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	schedClient := impersonate(t, c.cp, sched, nil)
	err = schedClient.CoreV1().Pods(podNS).Delete(ctx, "victim", metav1.DeleteOptions{})
	wantForbidden(t, "scheduler deletes a pod", err, "cannot delete resource")
	stored.Spec.Containers[0].Image = "evil"
	_, err = schedClient.CoreV1().Pods(podNS).Update(ctx, stored, metav1.UpdateOptions{})
	wantForbidden(t, "scheduler edits a pod", err, "cannot update resource")
	_, err = impersonate(t, c.cp, node, map[string][]string{nodeNameExtra: {"node-a"}}).CoreV1().Pods(podNS).Create(ctx, pod, metav1.CreateOptions{})
	wantForbidden(t, "node agent creates a pod", err, "cannot create resource")
	err = schedClient.CoreV1().Pods(podNS).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: "victim", UID: stored.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: "node-a"},
	}, metav1.CreateOptions{})
	wantAllowed(t, "scheduler binds a pod", err)
}

// TestQueueAdminRole: creating and changing Queues takes tessera-queue-admin;
// the view role (aggregated into view/edit/admin) only reads them.
func TestQueueAdminRole(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	r := render(t, deployments.DefaultNamespace, "{rbac: {queueAdmin: {enabled: true}, aggregateToView: true}}")
	var admin, view *unstructured.Unstructured
	for _, o := range ofKind(r, "ClusterRole") {
		switch o.GetName() {
		case "tessera-queue-admin":
			admin = o
		case "tessera-view":
			view = o
		}
	}
	if admin == nil || view == nil {
		t.Fatal("queue admin or view role not rendered")
	}
	if view.GetLabels()["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
		t.Error("the view role does not aggregate into view")
	}
	c.create(t, admin, "")
	view = view.DeepCopy()
	view.SetName(framework.UniqueName("tessera-view"))
	c.create(t, view, "")
	bind := func(role, user string) {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: framework.UniqueName("bind")},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
		}
		if _, err := c.client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.client.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
		})
	}
	bind("tessera-queue-admin", "alice")
	bind(view.GetName(), "bob")
	const sg = "scheduling.tessera.dev"
	checkAccess(t, c, "queue admin", "alice", []access{
		{"create", sg, "queues", "", "", true},
		{"update", sg, "queues", "", "x", true},
		{"delete", sg, "queues", "", "x", true},
		{"update", sg, "queues/status", "", "x", false},
		{"create", sg, "podgroups", "ns", "", false},
		{"create", "", "pods", "ns", "", false},
	})
	checkAccess(t, c, "viewer", "bob", []access{
		{"list", sg, "queues", "", "", true},
		{"list", sg, "podgroups", "ns", "", true},
		{"create", sg, "queues", "", "", false},
		{"update", sg, "queues", "", "x", false},
	})

	// Alice really creates the example queue hierarchy.
	aliceDyn, err := dynamic.NewForConfig(func() *rest.Config {
		cfg := rest.CopyConfig(c.cp.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"system:authenticated"}}
		return cfg
	}())
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range exampleObjects(t)["08-queues.yaml"] {
		if obj.GetKind() != "Queue" {
			continue
		}
		obj = obj.DeepCopy()
		_, err := c.resource(t, aliceDyn, obj, "").Create(ctx, obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		wantAllowed(t, "queue admin creates Queue "+obj.GetName(), err)
	}
}

// catalogKinds are the kinds the scheduler's catalog resolver watches with
// the built-in definitions: every mapped kind and every kind on an owner
// chain.
func catalogKinds(t *testing.T) []schema.GroupVersionKind {
	t.Helper()
	cat, err := catalog.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	kinds := append(cat.RootKinds(), cat.IntermediateKinds()...)
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].String() < kinds[j].String() })
	if len(kinds) < 10 {
		t.Fatalf("the catalog names only %d kinds", len(kinds))
	}
	return kinds
}
