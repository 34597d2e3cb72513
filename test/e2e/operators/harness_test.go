// Package operators holds end-to-end tests with the real workload operators:
// a sandbox (real API server and controllers, simulated GPU nodes with
// tessera's node agent and DRA plugin, tessera-scheduler with the built-in
// catalog) runs JobSet, LeaderWorkerSet, KubeRay, the MPI Operator, Kubeflow
// Trainer v2 and the training-operator; the tests create upstream example
// workloads with GPUs, the operators create the pods, and tessera places them.
package operators

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

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/contract"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/sandbox"
	"github.com/tessera-gpu/tessera/sandbox/operators"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
	"github.com/tessera-gpu/tessera/test/framework"
)

const (
	schedulerName = "tessera-scheduler"
	queueName     = "operators-e2e"
	claimTemplate = "gpu"
	// Nodes of the sandbox: 4 simulated DGX H100, 32 GPUs.
	nodes = 4
)

var env struct {
	once   sync.Once
	sb     *sandbox.Sandbox
	out    strings.Builder
	err    error
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func TestMain(m *testing.M) {
	code := m.Run()
	if env.sb != nil {
		if err := env.sb.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop sandbox:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// harness is one test's view of the shared sandbox: its own namespace, charged
// to a queue large enough for every test, with a one-GPU claim template.
type harness struct {
	t      *testing.T
	ctx    context.Context
	ns     string
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func setup(t *testing.T) *harness {
	t.Helper()
	env.once.Do(func() {
		// The sandbox runs its scheduler, nodes and operators under this
		// context until TestMain stops it: not a timeout.
		ctx := context.Background()
		dir, err := os.MkdirTemp("", "tessera-ops-")
		if err != nil {
			env.err = err
			return
		}
		env.sb, env.err = sandbox.Start(ctx, sandbox.Options{
			StateDir:  dir,
			Out:       &env.out,
			Nodes:     nodes,
			Operators: operators.Known(),
		})
		if env.err != nil {
			return
		}
		cfg := env.sb.Config()
		if env.client, env.err = kubernetes.NewForConfig(cfg); env.err != nil {
			return
		}
		if env.dyn, env.err = dynamic.NewForConfig(cfg); env.err != nil {
			return
		}
		disc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			env.err = err
			return
		}
		env.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
		queue := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "Queue",
			"metadata": map[string]any{"name": queueName},
			"spec":     map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "64", "limit": "64"}}},
		}}
		_, env.err = env.dyn.Resource(v1alpha1.SchemeGroupVersion.WithResource("queues")).Create(ctx, queue, metav1.CreateOptions{})
	})
	if env.err != nil {
		t.Fatalf("sandbox with operators: %v\n%s", env.err, env.out.String())
	}
	h := &harness{t: t, client: env.client, dyn: env.dyn, mapper: env.mapper}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	h.ctx = ctx
	h.ns = "op-" + strings.ToLower(strings.ReplaceAll(framework.UniqueName(""), "-", ""))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns, Labels: map[string]string{v1alpha1.QueueLabel: queueName}}}
	if _, err := h.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			h.dumpState()
		}
		h.deleteNamespace()
	})
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := h.client.CoreV1().ServiceAccounts(h.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("default service account of %s: %v", h.ns, err)
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: claimTemplate, Namespace: h.ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: contract.ClassGPU},
			}}},
		}},
	}
	if _, err := h.client.ResourceV1().ResourceClaimTemplates(h.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return h
}

// deleteNamespace removes the test's objects. It does not wait for them to go:
// every test fits in the sandbox beside the others (each takes at most 8 of its
// 32 GPUs, and the one gang that does not fit never binds).
func (h *harness) deleteNamespace() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.client.CoreV1().Namespaces().Delete(ctx, h.ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		h.t.Errorf("delete namespace %s: %v", h.ns, err)
	}
}

// load reads an upstream example from test/testdata/workloads and prepares it
// for the sandbox (see gpuify).
func (h *harness) load(rel string, gpuPods func(path []string) bool) *unstructured.Unstructured {
	h.t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "workloads", rel))
	if err != nil {
		h.t.Fatal(err)
	}
	return h.parse(string(firstDoc(data)), gpuPods)
}

func firstDoc(data []byte) []byte {
	s := string(data)
	if i := strings.Index(s, "\n---"); i >= 0 {
		s = s[:i]
	}
	return []byte(s)
}

func (h *harness) parse(doc string, gpuPods func(path []string) bool) *unstructured.Unstructured {
	h.t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		h.t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetNamespace(h.ns)
	gpuify(u.Object, nil, gpuPods)
	return u
}

// gpuify makes every pod template of a workload one for the sandbox:
// spec.schedulerName tessera-scheduler, and, where gpuPods says so (by the
// template's path in the object), a one-GPU DRA claim from the "gpu" template
// in place of any nvidia.com/gpu extended resource (the simulated nodes offer
// their GPUs through tessera's DRA driver only).
func gpuify(obj map[string]any, path []string, gpuPods func(path []string) bool) {
	if spec, ok := obj["spec"].(map[string]any); ok {
		if cs, ok := spec["containers"].([]any); ok && len(cs) > 0 {
			spec["schedulerName"] = schedulerName
			for _, c := range cs {
				if cm, ok := c.(map[string]any); ok {
					if res, ok := cm["resources"].(map[string]any); ok {
						for _, k := range []string{"limits", "requests"} {
							if l, ok := res[k].(map[string]any); ok {
								delete(l, "nvidia.com/gpu")
							}
						}
					}
				}
			}
			if gpuPods == nil || gpuPods(path) {
				spec["resourceClaims"] = []any{map[string]any{"name": "gpu", "resourceClaimTemplateName": claimTemplate}}
				main := cs[0].(map[string]any)
				res, _ := main["resources"].(map[string]any)
				if res == nil {
					res = map[string]any{}
					main["resources"] = res
				}
				res["claims"] = []any{map[string]any{"name": "gpu"}}
			}
		}
	}
	for k, v := range obj {
		switch x := v.(type) {
		case map[string]any:
			gpuify(x, append(append([]string{}, path...), k), gpuPods)
		case []any:
			for i, e := range x {
				if em, ok := e.(map[string]any); ok {
					gpuify(em, append(append([]string{}, path...), fmt.Sprintf("%s[%d]", k, i)), gpuPods)
				}
			}
		}
	}
}

// annotateTemplates sets an annotation on every pod template for which match
// says yes (e.g. the simulated run time of pods that must complete).
func annotateTemplates(obj map[string]any, path []string, match func(path []string) bool, key, value string) {
	if spec, ok := obj["spec"].(map[string]any); ok {
		if _, ok := spec["containers"].([]any); ok && match(path) {
			md, _ := obj["metadata"].(map[string]any)
			if md == nil {
				md = map[string]any{}
				obj["metadata"] = md
			}
			ann, _ := md["annotations"].(map[string]any)
			if ann == nil {
				ann = map[string]any{}
				md["annotations"] = ann
			}
			ann[key] = value
		}
	}
	for k, v := range obj {
		switch x := v.(type) {
		case map[string]any:
			annotateTemplates(x, append(append([]string{}, path...), k), match, key, value)
		case []any:
			for i, e := range x {
				if em, ok := e.(map[string]any); ok {
					annotateTemplates(em, append(append([]string{}, path...), fmt.Sprintf("%s[%d]", k, i)), match, key, value)
				}
			}
		}
	}
}

func pathHas(path []string, part string) bool {
	for _, p := range path {
		if strings.Contains(p, part) {
			return true
		}
	}
	return false
}

func (h *harness) create(u *unstructured.Unstructured) *unstructured.Unstructured {
	h.t.Helper()
	gvk := u.GroupVersionKind()
	m, err := h.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		// A CRD the test installed after the mapper last looked.
		if rs, ok := h.mapper.(meta.ResettableRESTMapper); ok {
			rs.Reset()
		}
		m, err = h.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		h.t.Fatalf("%s: %v", gvk, err)
	}
	out, err := h.dyn.Resource(m.Resource).Namespace(h.ns).Create(h.ctx, u, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatalf("create %s %s: %v", gvk.Kind, u.GetName(), err)
	}
	return out
}

// createAdmitted is create for an object whose operator's admission webhook may deny it
// while the operator's cache has not yet seen an object it refers to (Trainer's webhook
// looks a TrainJob's runtime up in its informer cache, so a TrainJob created right after
// its TrainingRuntime can be denied with "must be created before"): it retries while the
// denial contains notYet, for at most a minute, and fails on any other error.
func (h *harness) createAdmitted(u *unstructured.Unstructured, notYet string) *unstructured.Unstructured {
	h.t.Helper()
	gvk := u.GroupVersionKind()
	m, err := h.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		h.t.Fatalf("%s: %v", gvk, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := h.dyn.Resource(m.Resource).Namespace(h.ns).Create(h.ctx, u, metav1.CreateOptions{})
		if err == nil {
			return out
		}
		if !strings.Contains(err.Error(), notYet) || time.Now().After(deadline) {
			h.t.Fatalf("create %s %s: %v", gvk.Kind, u.GetName(), err)
		}
		select {
		case <-h.ctx.Done():
			h.t.Fatalf("create %s %s: %v", gvk.Kind, u.GetName(), h.ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// gang is what a test expects of one PodGroup: its minMember, and how many pods
// the real operator creates for it.
type gang struct {
	minMember, pods int32
}

// waitGangs waits until the namespace's PodGroups are exactly want (by name,
// with that minMember) plus singles one-pod gangs of pods the catalog puts in
// no gang, and every gang has had its pods bound; all the while it checks that
// no gang stays bound in part (0 < bound < minMember) for longer than a few
// scheduling periods and that no pod is bound before its claims are allocated
// and reserved for it.
func (h *harness) waitGangs(want map[string]gang, singles int, timeout time.Duration) {
	h.t.Helper()
	var last string
	partial := map[string]time.Time{}
	err := wait.PollUntilContextTimeout(h.ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := h.checkAlive(); err != nil {
			return false, err
		}
		pods, groups, err := h.state(ctx)
		if err != nil {
			return false, err
		}
		if err := h.checkClaims(ctx, pods); err != nil {
			return false, err
		}
		var parts []string
		done := true
		gotSingles := 0
		for name, g := range groups {
			if w := g.Spec.Workload; w != nil && w.Kind == "Pod" && w.APIVersion == "v1" {
				gotSingles++
				done = done && g.Status.Scheduled+g.Status.Succeeded >= 1
				continue
			}
			placed := g.Status.Scheduled + g.Status.Succeeded + g.Status.Failed
			parts = append(parts, fmt.Sprintf("%s minMember=%d (placed %d of %d)", name, g.Spec.MinMember, placed, g.Status.Members))
			w, ok := want[name]
			if !ok || w.minMember != g.Spec.MinMember || placed < w.pods {
				done = false
			}
			// All-or-nothing: the scheduler binds a gang in one commit and
			// writes the status after it, so a part-bound gang is a bug.
			if b := g.Status.Scheduled; b > 0 && b < g.Spec.MinMember && g.Status.Succeeded == 0 {
				if since, ok := partial[name]; !ok {
					partial[name] = time.Now()
				} else if time.Since(since) > 10*time.Second {
					return false, fmt.Errorf("gang %s has %d of minMember %d pods bound for %s", name, b, g.Spec.MinMember, time.Since(since).Round(time.Second))
				}
			} else {
				delete(partial, name)
			}
		}
		sort.Strings(parts)
		last = fmt.Sprintf("%s; %d one-pod gangs", strings.Join(parts, "; "), gotSingles)
		return done && len(groups) == len(want)+singles && gotSingles == singles, nil
	})
	if err != nil {
		h.t.Fatalf("gangs: %v\n got: %s\nwant: %s; %d one-pod gangs", err, last, describe(want), singles)
	}
}

func describe(gs map[string]gang) string {
	var parts []string
	for name, g := range gs {
		parts = append(parts, fmt.Sprintf("%s minMember=%d (placed %d)", name, g.minMember, g.pods))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

type podInfo struct {
	pod   *corev1.Pod
	bound bool
}

// state lists the namespace's pods for tessera-scheduler and its PodGroups.
func (h *harness) state(ctx context.Context) ([]podInfo, map[string]*v1alpha1.PodGroup, error) {
	pl, err := h.client.CoreV1().Pods(h.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	ul, err := h.dyn.Resource(v1alpha1.SchemeGroupVersion.WithResource("podgroups")).Namespace(h.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	groups := map[string]*v1alpha1.PodGroup{}
	for i := range ul.Items {
		var pg v1alpha1.PodGroup
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ul.Items[i].Object, &pg); err != nil {
			return nil, nil, err
		}
		groups[pg.Name] = &pg
	}
	var pods []podInfo
	for i := range pl.Items {
		p := &pl.Items[i]
		if p.Spec.SchedulerName != schedulerName {
			continue
		}
		pods = append(pods, podInfo{pod: p, bound: p.Spec.NodeName != ""})
	}
	return pods, groups, nil
}

// checkClaims fails when a bound pod's claim is not allocated or not reserved
// for it: tessera must allocate before it binds.
func (h *harness) checkClaims(ctx context.Context, pods []podInfo) error {
	for _, p := range pods {
		if !p.bound || len(p.pod.Spec.ResourceClaims) == 0 {
			continue
		}
		if p.pod.Status.Phase == corev1.PodSucceeded || p.pod.Status.Phase == corev1.PodFailed {
			continue // its claims are released and deleted once it ends
		}
		for _, st := range p.pod.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				return fmt.Errorf("pod %s is bound but its claim %s has no ResourceClaim", p.pod.Name, st.Name)
			}
			c, err := h.client.ResourceV1().ResourceClaims(h.ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) && h.podEnded(ctx, p.pod) {
				continue // it ended after it was listed, and its claim was deleted since
			}
			if err != nil {
				return fmt.Errorf("claim of bound pod %s: %w", p.pod.Name, err)
			}
			reserved := false
			for _, r := range c.Status.ReservedFor {
				reserved = reserved || r.UID == p.pod.UID
			}
			if (c.Status.Allocation == nil || !reserved) && h.podEnded(ctx, p.pod) {
				continue // it ended after it was listed, and its claim was released since
			}
			if c.Status.Allocation == nil {
				return fmt.Errorf("pod %s is bound to %s but claim %s is not allocated", p.pod.Name, p.pod.Spec.NodeName, c.Name)
			}
			if !reserved {
				return fmt.Errorf("pod %s is bound but claim %s is not reserved for it", p.pod.Name, c.Name)
			}
		}
		if len(p.pod.Status.ResourceClaimStatuses) == 0 {
			return fmt.Errorf("pod %s is bound but has no claim status", p.pod.Name)
		}
	}
	return nil
}

// podEnded reports whether the pod has finished, is being deleted or is gone now: a stage's
// pods can end between the listing and the claim's read (a dependsOn stage that completes).
func (h *harness) podEnded(ctx context.Context, pod *corev1.Pod) bool {
	cur, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return apierrors.IsNotFound(err)
	}
	return cur.UID != pod.UID || cur.DeletionTimestamp != nil || cur.Status.Phase == corev1.PodSucceeded || cur.Status.Phase == corev1.PodFailed
}

func (h *harness) checkAlive() error {
	for _, r := range env.sb.Operators().Running() {
		if err := r.Alive(); err != nil {
			return fmt.Errorf("%w; log:\n%s", err, r.LogTail(20))
		}
	}
	return nil
}

// pods returns the namespace's tessera pods, by name.
func (h *harness) pods() map[string]*corev1.Pod {
	h.t.Helper()
	pl, err := h.client.CoreV1().Pods(h.ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range pl.Items {
		if pl.Items[i].Spec.SchedulerName == schedulerName {
			out[pl.Items[i].Name] = &pl.Items[i]
		}
	}
	return out
}

func (h *harness) dumpState() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, groups, err := h.state(ctx)
	if err != nil {
		h.t.Logf("state: %v", err)
		return
	}
	for _, p := range pods {
		h.t.Logf("pod %s node=%q phase=%s labels=%v", p.pod.Name, p.pod.Spec.NodeName, p.pod.Status.Phase, p.pod.Labels)
	}
	for name, g := range groups {
		var conds []string
		for _, c := range g.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
		h.t.Logf("podgroup %s minMember=%d members=%d scheduled=%d phase=%s %s", name, g.Spec.MinMember, g.Status.Members, g.Status.Scheduled, g.Status.Phase, strings.Join(conds, "; "))
	}
	for _, r := range env.sb.Operators().Running() {
		h.t.Logf("%s log tail:\n%s", r.Name, r.LogTail(8))
	}
}

// simDuration makes the matched pods succeed after d.
func simDuration(obj *unstructured.Unstructured, match func(path []string) bool, d time.Duration) {
	annotateTemplates(obj.Object, nil, match, simkubelet.AnnotationDuration, d.String())
}

// trainingRuntime installs one of Trainer's own runtimes (as built beside the
// operator, from its module) as a TrainingRuntime of the test's namespace, with
// tessera-scheduler and a GPU claim per pod; it returns its name.
func (h *harness) trainingRuntime(name string) string {
	h.t.Helper()
	dir, err := operators.BuildDir(h.ctx, "trainer")
	if err != nil {
		h.t.Fatal(err)
	}
	// torch-distributed is in torch_distributed.yaml, and so on.
	data, err := os.ReadFile(filepath.Join(dir, "runtimes", strings.ReplaceAll(name, "-", "_")+".yaml"))
	if err != nil {
		h.t.Fatal(err)
	}
	u := h.parse(string(firstDoc(data)), nil)
	u.SetKind("TrainingRuntime")
	h.create(u)
	return u.GetName()
}
