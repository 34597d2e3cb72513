package deployments_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/deployments"
	"github.com/tessera-gpu/tessera/nodeagent/deviceplugin"
	"github.com/tessera-gpu/tessera/nodeagent/partition"
)

const testNamespace = "tessera-test"

// values parses a values document as `helm -f` would.
func values(t testing.TB, doc string) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatalf("values %q: %v", doc, err)
	}
	return v
}

func render(t testing.TB, namespace, doc string) *deployments.Rendered {
	t.Helper()
	r, err := deployments.Render(deployments.Options{Namespace: namespace, Values: values(t, doc)})
	if err != nil {
		t.Fatalf("render with values %q: %v", doc, err)
	}
	return r
}

func ofKind(r *deployments.Rendered, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.Objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func names(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	sort.Strings(out)
	return out
}

// typed converts the only object of a kind (with that name, if given) into
// its Go type.
func typed[T any](t testing.TB, r *deployments.Rendered, kind, name string, into *T) *T {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range ofKind(r, kind) {
		if name == "" || o.GetName() == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %q, found %v", kind, name, names(found))
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(found[0].Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", kind, found[0].GetName(), err)
	}
	return into
}

func hostPaths(spec corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			out = append(out, v.HostPath.Path)
		}
	}
	sort.Strings(out)
	return out
}

func hasRule(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
			(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*")) &&
			(slices.Contains(r.Verbs, verb) || slices.Contains(r.Verbs, "*")) {
			return true
		}
	}
	return false
}

func sourceNames(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	entries, err := os.ReadDir(filepath.Join(deployments.Dir(), dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(deployments.Dir(), dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := deployments.DecodeAll(data)
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		out = append(out, names(objs)...)
	}
	sort.Strings(out)
	return out
}

func TestDefaultRender(t *testing.T) {
	r := render(t, testNamespace, "")

	if got, want := names(r.CRDs), sourceNames(t, "crds"); !slices.Equal(got, want) || len(got) != 5 {
		t.Errorf("CRDs = %v, want the five of deployments/crds %v", got, want)
	}
	if got, want := names(ofKind(r, "DeviceClass")), sourceNames(t, "deviceclasses"); !slices.Equal(got, want) || len(got) != 3 {
		t.Errorf("DeviceClasses = %v, want the three of deployments/deviceclasses %v", got, want)
	}

	ds := typed(t, r, "DaemonSet", "tessera-node", &appsv1.DaemonSet{})
	pod := ds.Spec.Template.Spec
	if pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("node selector = %v, want GPU nodes only", pod.NodeSelector)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "nvidia.com/gpu" }) {
		t.Errorf("tolerations = %v, want the nvidia.com/gpu taint tolerated", pod.Tolerations)
	}
	// "/" is the driver root (node.driverRoot), mounted read-only at /driver-root.
	wantPaths := []string{"/", "/dev/nvidia-caps", "/run/tessera/mps", "/var/lib/kubelet/plugins/gpu.tessera.dev", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}
	if got := hostPaths(pod); !slices.Equal(got, wantPaths) {
		t.Errorf("host paths = %v, want exactly %v (no device-plugin dir while it is off)", got, wantPaths)
	}
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName = %v, want nvidia (it brings NVML and the driver's tools)", pod.RuntimeClassName)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the node agent must not share host network, PID or IPC namespaces")
	}
	c := pod.Containers[0]
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("node security context = %+v, want privileged (default profile) with a read-only root", c.SecurityContext)
	}
	for _, arg := range []string{"--node-name=$(NODE_NAME)", "--backend=nvml", "--config=/etc/tessera/partition.yaml"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("node args %v lack %s", c.Args, arg)
		}
	}

	dep := typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{})
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("scheduler replicas = %v, want 2", dep.Spec.Replicas)
	}
	sc := dep.Spec.Template.Spec.Containers[0]
	for _, arg := range []string{"--leader-elect=true", "--leader-elect-resource-namespace=" + testNamespace, "--leader-elect-resource-name=tessera-scheduler", "--scheduler-name=tessera-scheduler"} {
		if !slices.Contains(sc.Args, arg) {
			t.Errorf("scheduler args %v lack %s", sc.Args, arg)
		}
	}
	if psc := dep.Spec.Template.Spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("the scheduler must run as non-root")
	}
	if csc := sc.SecurityContext; csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || !slices.Contains(csc.Capabilities.Drop, "ALL") {
		t.Errorf("scheduler container security context = %+v, want no escalation and all capabilities dropped", csc)
	}

	pdb := typed(t, r, "PodDisruptionBudget", "tessera-scheduler", &policyv1.PodDisruptionBudget{})
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PDB minAvailable = %v, want 1", pdb.Spec.MinAvailable)
	}
	sel, err := labels.ValidatedSelectorFromSet(pdb.Spec.Selector.MatchLabels)
	if err != nil || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("PDB selector %v does not select the scheduler pods %v", pdb.Spec.Selector, dep.Spec.Template.Labels)
	}

	wantPolicies := []string{"tessera-node-mps-daemons", "tessera-node-own-slices", "tessera-scheduler-writes"}
	if got := names(ofKind(r, "ValidatingAdmissionPolicy")); !slices.Equal(got, wantPolicies) {
		t.Errorf("admission policies = %v", got)
	}
	if got := names(ofKind(r, "ValidatingAdmissionPolicyBinding")); !slices.Equal(got, wantPolicies) {
		t.Errorf("admission policy bindings = %v", got)
	}
	// Admission policies come before anything that could write a slice.
	if k := r.Objects[0].GetKind(); k != "ValidatingAdmissionPolicy" {
		t.Errorf("first object is a %s, want the admission policies first", k)
	}
	// The roles as rendered (the API-server tests prove them with reviews).
	node := typed(t, r, "ClusterRole", "tessera-node", &rbacv1.ClusterRole{})
	for _, v := range []string{"get", "list", "create", "update", "patch", "delete"} {
		if hasRule(node.Rules, "", "pods", v) {
			t.Errorf("the node agent may %s pods cluster-wide", v)
		}
	}
	// Its claims' MPS daemon pods, in its own namespace only.
	daemons := typed(t, r, "Role", "tessera-node-mps-daemons", &rbacv1.Role{})
	if daemons.Namespace != nodeNamespace(testNamespace) || !hasRule(daemons.Rules, "", "pods", "create") || !hasRule(daemons.Rules, "", "pods", "delete") || hasRule(daemons.Rules, "", "pods", "update") {
		t.Errorf("MPS daemon role %+v", daemons)
	}
	for _, arg := range []string{"--mps-daemon=pod", "--mps-daemon-namespace=$(POD_NAMESPACE)", "--mps-daemon-runtime-class=nvidia", "--mps-daemon-image=" + c.Image} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("node args %v lack %s", c.Args, arg)
		}
	}
	if !hasRule(node.Rules, "resource.k8s.io", "resourceclaims/status", "update") || !hasRule(node.Rules, "resource.k8s.io", "resourceclaims/driver", "associated-node:update") {
		t.Error("the node plugin must be able to write its claims' status.devices")
	}
	if !hasRule(node.Rules, "resource.k8s.io", "resourceclaims", "get") || hasRule(node.Rules, "resource.k8s.io", "resourceclaims", "list") {
		t.Error("the node agent must get claims by name and never list them")
	}
	sched := typed(t, r, "ClusterRole", "tessera-scheduler", &rbacv1.ClusterRole{})
	for _, v := range []string{"update", "patch", "delete", "deletecollection"} {
		if hasRule(sched.Rules, "", "pods", v) {
			t.Errorf("the scheduler may %s pods", v)
		}
	}
	if !hasRule(sched.Rules, "", "pods/binding", "create") || !hasRule(sched.Rules, "resource.k8s.io", "resourceclaims/binding", "update") {
		t.Error("the scheduler must bind pods and write claim allocations")
	}
	typed(t, r, "ClusterRole", "tessera-queue-admin", &rbacv1.ClusterRole{})
	// The overview only reads, and runs once (two would export every
	// cluster metric twice).
	ov := typed(t, r, "Deployment", "tessera-overview", &appsv1.Deployment{})
	if ov.Spec.Replicas == nil || *ov.Spec.Replicas != 1 {
		t.Errorf("overview replicas = %v, want 1", ov.Spec.Replicas)
	}
	if oc := ov.Spec.Template.Spec.Containers[0]; !slices.Equal(oc.Command, []string{"/usr/bin/tessera"}) || !slices.Equal(oc.Args, []string{"top", "--secure-port=8080", "--interval=1s"}) {
		t.Errorf("overview runs %v %v, want tessera top serving HTTPS only", oc.Command, oc.Args)
	}
	// Its page over HTTPS needs a role of its own; nobody is bound by default.
	viewer := typed(t, r, "ClusterRole", "tessera-overview-viewer", &rbacv1.ClusterRole{})
	if len(viewer.Rules) != 1 || !slices.Equal(viewer.Rules[0].NonResourceURLs, []string{"/", "/overview.json"}) || !slices.Equal(viewer.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("overview viewer role = %+v, want get on / and /overview.json only", viewer.Rules)
	}
	if slices.Contains(names(ofKind(r, "ClusterRoleBinding")), "tessera-overview-viewer") {
		t.Error("overview.viewers is empty by default, yet a binding is rendered")
	}
	if psc := ov.Spec.Template.Spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("the overview must run as non-root")
	}
	ovRole := typed(t, r, "ClusterRole", "tessera-overview", &rbacv1.ClusterRole{})
	for _, rule := range ovRole.Rules {
		for _, v := range rule.Verbs {
			if v != "list" && v != "watch" {
				t.Errorf("the overview may %s %v: it only lists and watches", v, rule.Resources)
			}
		}
	}
	if !hasRule(ovRole.Rules, "resource.k8s.io", "resourceclaims", "watch") || !hasRule(ovRole.Rules, "scheduling.tessera.dev", "podgroups", "list") {
		t.Errorf("the overview cannot read what tessera top reads: %v", ovRole.Rules)
	}
	if n := len(ofKind(r, "PrometheusRule")); n != 0 || slices.Contains(names(ofKind(r, "ConfigMap")), "tessera-dashboards") {
		t.Error("the dashboard ConfigMap and the PrometheusRule are off by default")
	}
	if n := len(ofKind(r, "ServiceMonitor")) + len(ofKind(r, "Queue")); n != 0 {
		t.Errorf("ServiceMonitors and example Queues are off by default, found %d", n)
	}

	// The partition ConfigMap is what the node agent's own parser accepts.
	cm := typed(t, r, "ConfigMap", "tessera-node-config", &corev1.ConfigMap{})
	cfg, err := partition.Parse([]byte(cm.Data["partition.yaml"]))
	if err != nil {
		t.Fatalf("default partition config rejected by the node agent: %v", err)
	}
	if cfg.Default == nil || len(cfg.Default.GPUs) != 1 || cfg.Default.GPUs[0].Mode != partition.ModeWhole {
		t.Errorf("default partition config = %+v, want every GPU whole", cfg)
	}
}

// TestNodeNamespace: the node-side objects (the DaemonSet, its service
// account, config, MPS daemon Role and metrics Service) render into the node
// namespace, which the chart creates labelled Pod Security "privileged" and
// keeps on uninstall; everything else stays in the release namespace; every
// reference to the node agent's service account names the node namespace.
func TestNodeNamespace(t *testing.T) {
	nodeSide := func(obj *unstructured.Unstructured) bool {
		return obj.GetLabels()["app.kubernetes.io/component"] == "node" && obj.GetNamespace() != "" && obj.GetNamespace() != "kube-system"
	}
	check := func(t *testing.T, r *deployments.Rendered, releaseNS, nodeNS string, created bool) {
		t.Helper()
		var nodeObjs []string
		for _, obj := range r.Objects {
			ns := obj.GetNamespace()
			switch {
			case obj.GetKind() == "Namespace" || ns == "" || ns == "kube-system":
			case nodeSide(obj):
				nodeObjs = append(nodeObjs, obj.GetKind()+"/"+obj.GetName())
				if ns != nodeNS {
					t.Errorf("%s %s in %s, want the node namespace %s", obj.GetKind(), obj.GetName(), ns, nodeNS)
				}
			case ns != releaseNS:
				t.Errorf("%s %s in %s, want the release namespace %s", obj.GetKind(), obj.GetName(), ns, releaseNS)
			}
			// Every binding of the node agent's service account names it where it is.
			if subjects, ok := obj.Object["subjects"].([]any); ok {
				for _, s := range subjects {
					sub := s.(map[string]any)
					if sub["name"] == "tessera-node" && sub["namespace"] != nodeNS {
						t.Errorf("%s %s binds tessera-node of %v, want %s", obj.GetKind(), obj.GetName(), sub["namespace"], nodeNS)
					}
				}
			}
		}
		slices.Sort(nodeObjs)
		want := []string{"ConfigMap/tessera-node-config", "DaemonSet/tessera-node", "Role/tessera-node-mps-daemons", "RoleBinding/tessera-node-mps-daemons", "Service/tessera-node-metrics", "ServiceAccount/tessera-node"}
		if !slices.Equal(nodeObjs, want) {
			t.Errorf("node-side objects = %v, want %v", nodeObjs, want)
		}
		for _, p := range ofKind(r, "ValidatingAdmissionPolicy") {
			if doc := mustYAML(t, p.Object); strings.Contains(doc, "system:serviceaccount:") && strings.Contains(doc, "tessera-node") && !strings.Contains(doc, "system:serviceaccount:"+nodeNS+":tessera-node") {
				t.Errorf("admission policy %s does not name the node agent as system:serviceaccount:%s:tessera-node", p.GetName(), nodeNS)
			}
		}
		namespaces := ofKind(r, "Namespace")
		if !created {
			if len(namespaces) != 0 {
				t.Errorf("Namespaces rendered: %v, want none", names(namespaces))
			}
			return
		}
		if len(namespaces) != 1 || namespaces[0].GetName() != nodeNS {
			t.Fatalf("Namespaces rendered: %v, want %s only", names(namespaces), nodeNS)
		}
		n := namespaces[0]
		for _, mode := range []string{"enforce", "audit", "warn"} {
			if got := n.GetLabels()["pod-security.kubernetes.io/"+mode]; got != "privileged" {
				t.Errorf("node namespace label pod-security.kubernetes.io/%s = %q, want privileged", mode, got)
			}
		}
		if n.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("node namespace annotations %v: want helm.sh/resource-policy: keep (uninstall must not delete the MPS daemon pods)", n.GetAnnotations())
		}
		// Helm installs namespaces first (InstallOrder); the admission
		// policies come before them only because they are cluster-scoped.
		for i, obj := range r.Objects {
			if obj.GetNamespace() == nodeNS {
				t.Errorf("%s %s (object %d) comes before its namespace", obj.GetKind(), obj.GetName(), i)
			}
			if obj.GetKind() == "Namespace" {
				break
			}
		}
	}
	t.Run("default", func(t *testing.T) {
		check(t, render(t, testNamespace, ""), testNamespace, testNamespace+"-node", true)
		if nodeNamespace(testNamespace) != testNamespace+"-node" {
			t.Error("the tests' nodeNamespace differs from the chart's default")
		}
	})
	t.Run("node.namespace", func(t *testing.T) {
		check(t, render(t, testNamespace, `node: {namespace: gpu-agents}`), testNamespace, "gpu-agents", true)
	})
	t.Run("node.createNamespace=false", func(t *testing.T) {
		check(t, render(t, testNamespace, `node: {createNamespace: false}`), testNamespace, testNamespace+"-node", false)
	})
	t.Run("one namespace", func(t *testing.T) {
		check(t, render(t, testNamespace, `node: {namespace: `+testNamespace+`}`), testNamespace, testNamespace, false)
	})
	t.Run("node disabled", func(t *testing.T) {
		if r := render(t, testNamespace, `node: {enabled: false}`); len(ofKind(r, "Namespace")) != 0 {
			t.Error("node.enabled=false still creates the node namespace")
		}
	})
	t.Run("release namespace too long for the default", func(t *testing.T) {
		long := strings.Repeat("n", 60)
		_, err := deployments.Render(deployments.Options{Namespace: long})
		if !errors.Is(err, deployments.ErrInvalidValues) || !strings.Contains(err.Error(), "longer than 63 characters") || !strings.Contains(err.Error(), "node.namespace") {
			t.Errorf("render in a 60-character namespace: %v, want a clear error naming node.namespace", err)
		}
		if _, err := deployments.Render(deployments.Options{Namespace: long, Values: values(t, `node: {namespace: gpu-agents}`)}); err != nil {
			t.Errorf("with node.namespace set: %v", err)
		}
	})
}

func TestRenderCombinations(t *testing.T) {
	for _, tc := range combinations {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, testNamespace, tc.values)
			tc.check(t, r)
		})
	}
}

// combinations are rendered here and applied (dry-run) to the API server in
// TestChartDryRun.
var combinations = []struct {
	name   string
	values string
	check  func(t *testing.T, r *deployments.Rendered)
}{
	{
		name:   "secure serving (the default) with ServiceMonitors",
		values: `{serviceMonitor: {enabled: true}, secureServing: {scrapers: [{kind: ServiceAccount, name: prometheus-k8s, namespace: monitoring}]}, overview: {viewers: [{kind: Group, name: platform-admins, apiGroup: rbac.authorization.k8s.io}]}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			checkServing(t, r, true)
			if n := len(ofKind(r, "ServiceMonitor")); n != 3 {
				t.Fatalf("%d ServiceMonitors, want 3", n)
			}
			for _, sm := range ofKind(r, "ServiceMonitor") {
				ep, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
				e := ep[0].(map[string]any)
				secure := true // the overview's too
				if got := e["scheme"] == "https" && e["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"; got != secure {
					t.Errorf("ServiceMonitor %s endpoint %v: HTTPS with the token = %v, want %v", sm.GetName(), e, got, secure)
				}
			}
			viewers := typed(t, r, "ClusterRoleBinding", "tessera-overview-viewer", &rbacv1.ClusterRoleBinding{})
			if viewers.RoleRef.Name != "tessera-overview-viewer" || len(viewers.Subjects) != 1 || viewers.Subjects[0].Name != "platform-admins" {
				t.Errorf("overview viewer binding = %+v", viewers)
			}
			crb := typed(t, r, "ClusterRoleBinding", "tessera-metrics-reader", &rbacv1.ClusterRoleBinding{})
			if crb.RoleRef.Name != "tessera-metrics-reader" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "prometheus-k8s" {
				t.Errorf("scraper binding = %+v", crb)
			}
		},
	},
	{
		name:   "plain HTTP (secureServing.enabled=false)",
		values: `secureServing: {enabled: false}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			checkServing(t, r, false)
			for _, kind := range []string{"ClusterRoleBinding", "RoleBinding", "ClusterRole"} {
				for _, n := range names(ofKind(r, kind)) {
					if strings.Contains(n, "auth-delegator") || strings.Contains(n, "authentication-reader") || strings.Contains(n, "metrics-reader") || strings.Contains(n, "overview-viewer") {
						t.Errorf("%s %s rendered for plain HTTP", kind, n)
					}
				}
			}
		},
	},
	{
		name:   "device plugin for every GPU",
		values: `node: {devicePlugin: {enabled: true, config: {resourceName: nvidia.com/gpu, migStrategy: mixed, timeSlicing: {replicas: 4, renameByDefault: true}}}, partition: {default: {gpus: [{mode: devicePlugin}]}}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			ds := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{})
			wantPaths := []string{"/", "/dev/nvidia-caps", "/run/tessera/mps", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins/gpu.tessera.dev", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}
			if got := hostPaths(ds.Spec.Template.Spec); !slices.Equal(got, wantPaths) {
				t.Errorf("host paths = %v, want %v (the DRA plugin runs anyway)", got, wantPaths)
			}
			if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--device-plugin-config=/etc/tessera/device-plugin.yaml") {
				t.Errorf("args %v do not pass the device plugin config", args)
			}
			cm := &corev1.ConfigMap{}
			typed(t, r, "ConfigMap", "", cm)
			cfg, err := deviceplugin.ParseConfig([]byte(cm.Data["device-plugin.yaml"]))
			if err != nil {
				t.Fatalf("device plugin config rejected by the plugin: %v", err)
			}
			if cfg.ResourceName != "nvidia.com/gpu" || cfg.MIGStrategy != "mixed" || cfg.TimeSlicing == nil || cfg.TimeSlicing.Replicas != 4 {
				t.Errorf("device plugin config = %+v, not what the values say", cfg)
			}
			checkPartition(t, r, func(cfg *partition.Config) bool {
				return cfg.Default.GPUs[0].Mode == partition.ModeDevicePlugin
			})
		},
	},
	{
		name:   "shadow mode",
		values: `scheduler: {shadow: {enabled: true, schedulerNames: [default-scheduler, kai-scheduler], deadlockAfter: 2m}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			dep := typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{})
			if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
				t.Errorf("shadow replicas = %v, want 1 (no leader election: a Lease is a write)", dep.Spec.Replicas)
			}
			args := dep.Spec.Template.Spec.Containers[0].Args
			for _, a := range []string{"--shadow", "--shadow-scheduler-names=default-scheduler,kai-scheduler", "--shadow-namespace=" + testNamespace, "--shadow-deadlock-after=2m", "--leader-elect=false"} {
				if !slices.Contains(args, a) {
					t.Errorf("shadow args %v lack %s", args, a)
				}
			}
			cr := typed(t, r, "ClusterRole", "tessera-scheduler", &rbacv1.ClusterRole{})
			for _, rule := range cr.Rules {
				for _, v := range rule.Verbs {
					if v != "get" && v != "list" && v != "watch" {
						t.Errorf("shadow ClusterRole grants %s on %v %v: it must be read-only", v, rule.APIGroups, rule.Resources)
					}
				}
			}
			if !hasRule(cr.Rules, "", "pods", "watch") || !hasRule(cr.Rules, "resource.k8s.io", "resourceclaims", "list") || !hasRule(cr.Rules, "batch", "jobs", "get") {
				t.Errorf("shadow ClusterRole cannot read pods, claims and workloads: %v", cr.Rules)
			}
			role := typed(t, r, "Role", "tessera-scheduler-shadow-reports", &rbacv1.Role{})
			if role.Namespace != testNamespace || !hasRule(role.Rules, "scheduling.tessera.dev", "shadowreports", "create") || len(role.Rules) != 1 {
				t.Errorf("shadow reports Role = %+v, want create on shadowreports only, in the release namespace", role)
			}
			if got := names(ofKind(r, "Role")); slices.Contains(got, "tessera-scheduler-leader-election") {
				t.Errorf("Roles %v: shadow mode takes no Lease", got)
			}
			if pdbs := ofKind(r, "PodDisruptionBudget"); len(pdbs) != 0 {
				t.Errorf("PodDisruptionBudgets %v: one shadow replica must stay drainable", names(pdbs))
			}
		},
	},
	{
		name:   "GPU operator driver root",
		values: `node: {driverRoot: /run/nvidia/driver, cdiHookPath: /usr/local/nvidia/toolkit/nvidia-cdi-hook, orphanMIG: report}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			ds := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{})
			pod := ds.Spec.Template.Spec
			args := pod.Containers[0].Args
			for _, want := range []string{"--driver-root=/run/nvidia/driver", "--container-driver-root=/driver-root", "--nvidia-cdi-hook-path=/usr/local/nvidia/toolkit/nvidia-cdi-hook", "--orphan-mig=report"} {
				if !slices.Contains(args, want) {
					t.Errorf("args %v lack %s", args, want)
				}
			}
			if !slices.Contains(hostPaths(pod), "/run/nvidia/driver") {
				t.Errorf("host paths %v lack the driver root", hostPaths(pod))
			}
			mounted := false
			for _, m := range pod.Containers[0].VolumeMounts {
				mounted = mounted || (m.MountPath == "/driver-root" && m.ReadOnly)
			}
			if !mounted {
				t.Error("the driver root is not mounted read-only at /driver-root")
			}
		},
	},
	{
		name:   "restricted instead of privileged",
		values: `node: {securityProfile: restricted, partition: {default: {gpus: [{mode: dynamicMIG, profiles: [1g.10gb, 3g.40gb]}]}}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			ds := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{})
			pod := ds.Spec.Template.Spec
			if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
				t.Errorf("runtimeClassName = %v, want nvidia", pod.RuntimeClassName)
			}
			sc := pod.Containers[0].SecurityContext
			if sc.Privileged == nil || *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("security context = %+v, want unprivileged", sc)
			}
			if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYS_ADMIN"}) {
				t.Errorf("capabilities = %+v, want all dropped but SYS_ADMIN", sc.Capabilities)
			}
			if slices.Contains(hostPaths(pod), "/dev/nvidia-caps") {
				t.Error("the runtime injects MIG capability nodes; no /dev host path")
			}
			env := map[string]string{}
			for _, e := range pod.Containers[0].Env {
				env[e.Name] = e.Value
			}
			if env["NVIDIA_MIG_CONFIG_DEVICES"] != "all" || env["NVIDIA_VISIBLE_DEVICES"] != "all" {
				t.Errorf("env = %v, want the NVIDIA runtime asked for all GPUs and MIG config", env)
			}
			checkPartition(t, r, func(cfg *partition.Config) bool {
				return cfg.Default.GPUs[0].Mode == partition.ModeDynamicMIG && slices.Equal(cfg.Default.GPUs[0].Profiles, []string{"1g.10gb", "3g.40gb"})
			})
		},
	},
	{
		name: "partition config per node pool",
		values: `
node:
  partition:
    nodes:
      - name: inference
        nodeSelector: {matchLabels: {tessera.dev/pool: inference}}
        gpus: [{mode: shared, shared: {reservedMemory: 1Gi, memoryStep: 256Mi, defaultMemory: 1Gi, defaultComputeShare: 10}}]
      - name: static
        nodeSelector: {matchExpressions: [{key: tessera.dev/pool, operator: In, values: [mig]}]}
        gpus: [{indices: [0, 1], mode: staticMIG, layout: [{profile: 3g.40gb, start: 0}, {profile: 3g.40gb}]}, {mode: whole}]
`,
		check: func(t *testing.T, r *deployments.Rendered) {
			checkPartition(t, r, func(cfg *partition.Config) bool {
				return len(cfg.Nodes) == 2 && cfg.Nodes[0].GPUs[0].Mode == partition.ModeShared &&
					cfg.Nodes[0].GPUs[0].Shared.MemoryStep.String() == "256Mi" &&
					cfg.Nodes[1].GPUs[0].Mode == partition.ModeStaticMIG && len(cfg.Nodes[1].GPUs[0].Layout) == 2
			})
		},
	},
	{
		name:   "monitoring and example queues",
		values: `{serviceMonitor: {enabled: true, labels: {release: prom}}, exampleQueues: {enabled: true}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			if got := names(ofKind(r, "ServiceMonitor")); !slices.Equal(got, []string{"tessera-node", "tessera-overview", "tessera-scheduler"}) {
				t.Errorf("ServiceMonitors = %v", got)
			}
			for _, sm := range ofKind(r, "ServiceMonitor") {
				if sm.GetLabels()["release"] != "prom" {
					t.Errorf("ServiceMonitor %s lacks the configured label", sm.GetName())
				}
			}
			if got := names(ofKind(r, "Queue")); !slices.Equal(got, []string{"cluster", "team-a", "team-b"}) {
				t.Errorf("example Queues = %v", got)
			}
		},
	},
	{
		name:   "dashboards and alerts",
		values: `{grafanaDashboard: {enabled: true, labels: {grafana_dashboard: "yes"}}, prometheusRule: {enabled: true, gangPendingMinutes: 10, queueAtLimitMinutes: 45, labels: {release: prom}}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			cm := typed(t, r, "ConfigMap", "tessera-dashboards", &corev1.ConfigMap{})
			if cm.Namespace != testNamespace || cm.Labels["grafana_dashboard"] != "yes" {
				t.Errorf("dashboard ConfigMap %s/%s labels %v: want the release namespace and the sidecar's label", cm.Namespace, cm.Name, cm.Labels)
			}
			other := typed(t, render(t, testNamespace, `grafanaDashboard: {enabled: true, namespace: monitoring}`), "ConfigMap", "tessera-dashboards", &corev1.ConfigMap{})
			if other.Namespace != "monitoring" || other.Labels["grafana_dashboard"] != "1" {
				t.Errorf("grafanaDashboard.namespace: ConfigMap in %s with labels %v, want monitoring and the default label", other.Namespace, other.Labels)
			}
			var dash struct {
				Title, UID string
				Panels     []struct{ Title string }
			}
			if err := json.Unmarshal([]byte(cm.Data["tessera.json"]), &dash); err != nil || dash.Title != "tessera" || len(dash.Panels) < 10 {
				t.Errorf("dashboard JSON: %v, %+v", err, dash)
			}
			type alert struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
				For   string `json:"for"`
				// Labels and annotations are not checked here.
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			}
			rule := typed(t, r, "PrometheusRule", "tessera", &struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name      string            `json:"name"`
					Namespace string            `json:"namespace"`
					Labels    map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					Groups []struct {
						Name  string  `json:"name"`
						Rules []alert `json:"rules"`
					} `json:"groups"`
				} `json:"spec"`
			}{})
			if rule.Metadata.Labels["release"] != "prom" {
				t.Errorf("PrometheusRule labels = %v", rule.Metadata.Labels)
			}
			alerts := map[string][2]string{}
			for _, g := range rule.Spec.Groups {
				for _, a := range g.Rules {
					alerts[a.Alert] = [2]string{a.Expr, a.For}
				}
			}
			for _, name := range []string{"TesseraGangPendingTooLong", "TesseraPrepareErrors", "TesseraQueueAtLimit", "TesseraGPUUnhealthy", "TesseraCommitErrors"} {
				if _, ok := alerts[name]; !ok {
					t.Errorf("alert %s missing (have %v)", name, alerts)
				}
			}
			if e := alerts["TesseraGangPendingTooLong"][0]; !strings.HasSuffix(e, "> 600") {
				t.Errorf("gangPendingMinutes 10 not in the alert: %s", e)
			}
			if f := alerts["TesseraQueueAtLimit"][1]; f != "45m" {
				t.Errorf("TesseraQueueAtLimit for = %q, want 45m", f)
			}
		},
	},
	{
		name:   "no overview",
		values: `{overview: {enabled: false}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			for _, kind := range []string{"Deployment", "ClusterRole", "ServiceAccount", "Service"} {
				if slices.Contains(names(ofKind(r, kind)), "tessera-overview") {
					t.Errorf("%s tessera-overview rendered with overview.enabled=false", kind)
				}
			}
		},
	},
	{
		name:   "optional keys left out",
		values: `{exampleQueues: {enabled: true, queues: [{name: root}]}, node: {partition: {nodes: [{nodeSelector: {matchLabels: {a: b}}}]}}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			if got := names(ofKind(r, "Queue")); !slices.Equal(got, []string{"root"}) {
				t.Errorf("example Queues = %v", got)
			}
		},
	},
	{
		name:   "scheduler only",
		values: `{node: {enabled: false}, deviceClasses: {enabled: false}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			for _, kind := range []string{"DaemonSet", "DeviceClass", "ConfigMap"} {
				if n := len(ofKind(r, kind)); n != 0 {
					t.Errorf("%d %s rendered with the node agent off", n, kind)
				}
			}
			if got := names(ofKind(r, "ClusterRole")); slices.Contains(got, "tessera-node") {
				t.Errorf("ClusterRoles = %v: no node role without the node agent", got)
			}
			typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{})
		},
	},
	{
		name:   "one scheduler without leader election",
		values: `scheduler: {replicas: 1, leaderElection: {enabled: false}, podDisruptionBudget: {enabled: false}, topologyKeys: [nvidia.com/gpu.clique, topology.kubernetes.io/zone], extraArgs: [--max-tries=1000, --spread]}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			dep := typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{})
			args := dep.Spec.Template.Spec.Containers[0].Args
			if !slices.Contains(args, "--leader-elect=false") || !slices.Contains(args, "--topology-keys=nvidia.com/gpu.clique,topology.kubernetes.io/zone") || args[len(args)-1] != "--spread" {
				t.Errorf("args = %v", args)
			}
			if got := names(ofKind(r, "Role")); !slices.Equal(got, []string{"tessera-node-mps-daemons"}) || len(ofKind(r, "PodDisruptionBudget")) != 0 {
				t.Errorf("Roles %v (want the node's MPS daemon role only, no lease role) and %d PDBs without leader election", got, len(ofKind(r, "PodDisruptionBudget")))
			}
		},
	},
	{
		name:   "scheduler policy",
		values: `scheduler: {usageHalfLife: 30m, usageWeight: 0.5, consolidationMaxPods: 0, topologies: [{name: dc, levels: [{nodeLabel: example.com/block}, {nodeLabel: example.com/rack}, {nodeLabel: kubernetes.io/hostname}]}]}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			dep := typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{})
			args := dep.Spec.Template.Spec.Containers[0].Args
			for _, want := range []string{"--usage-half-life=30m", "--usage-weight=0.5", "--consolidation-max-pods=0"} {
				if !slices.Contains(args, want) {
					t.Errorf("args %v lack %s", args, want)
				}
			}
			topo := typed(t, r, "Topology", "dc", &v1alpha1.Topology{})
			var levels []string
			for _, l := range topo.Spec.Levels {
				levels = append(levels, l.NodeLabel)
			}
			if want := []string{"example.com/block", "example.com/rack", "kubernetes.io/hostname"}; !slices.Equal(levels, want) {
				t.Errorf("Topology dc levels %v, want %v", levels, want)
			}
		},
	},
	{
		name:   "renamed release with a pinned image",
		values: `{fullnameOverride: gpu, image: {repository: registry.example.com/tessera, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}, scheduler: {image: {tag: v9}}}`,
		check: func(t *testing.T, r *deployments.Rendered) {
			ds := typed(t, r, "DaemonSet", "gpu-node", &appsv1.DaemonSet{})
			if img := ds.Spec.Template.Spec.Containers[0].Image; img != "registry.example.com/tessera@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
				t.Errorf("node image = %s", img)
			}
			dep := typed(t, r, "Deployment", "gpu-scheduler", &appsv1.Deployment{})
			// The global digest wins over a component's tag: a pinned image
			// stays pinned.
			if img := dep.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "registry.example.com/tessera@sha256:") {
				t.Errorf("scheduler image = %s", img)
			}
			vap := ofKind(r, "ValidatingAdmissionPolicy")
			if len(vap) != 3 || !strings.Contains(mustYAML(t, vap[0].Object), `system:serviceaccount:`+nodeNamespace(testNamespace)+`:gpu-node`) || !strings.Contains(mustYAML(t, vap[1].Object), `system:serviceaccount:`+nodeNamespace(testNamespace)+`:gpu-node`) {
				t.Errorf("the node policies must name the renamed service account")
			}
			if !slices.ContainsFunc(vap, func(v *unstructured.Unstructured) bool {
				return v.GetName() == "gpu-node-mps-daemons" && strings.Contains(mustYAML(t, v.Object), "registry.example.com/tessera@sha256:0123")
			}) {
				t.Errorf("the MPS daemon policy must allow the pinned image only")
			}
		},
	},
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func checkPartition(t *testing.T, r *deployments.Rendered, ok func(*partition.Config) bool) {
	t.Helper()
	cm := typed(t, r, "ConfigMap", "", &corev1.ConfigMap{})
	cfg, err := partition.Parse([]byte(cm.Data["partition.yaml"]))
	if err != nil {
		t.Fatalf("partition config rejected by the node agent: %v\n%s", err, cm.Data["partition.yaml"])
	}
	if !ok(cfg) {
		t.Errorf("partition config is not what the values say:\n%s", cm.Data["partition.yaml"])
	}
}

func TestInvalidValues(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{`node: {backend: "mock:dgx1"}`, "/node/backend"},
		{`node: {backend: "nvml:relative/lib.so"}`, "/node/backend"},
		{`node: {bogus: 1}`, "bogus"},
		{`scheduler: {replicas: "two"}`, "/scheduler/replicas"},
		{`image: {digest: "sha256:abc"}`, "/image/digest"},
		{`image: {pullPolicy: Sometimes}`, "/image/pullPolicy"},
		{`node: {partition: {default: {gpus: [{mode: whole, profiles: [1g.10gb]}]}}}`, "/node/partition/default/gpus/0/mode"},
		{`node: {partition: {default: {gpus: [{mode: dynamicMIG, profiles: [big]}]}}}`, "/node/partition/default/gpus/0/profiles/0"},
		{`node: {partition: {default: {gpus: [{mode: shared, shared: {defaultComputeShare: 150}}]}}}`, "/node/partition/default/gpus/0/shared/defaultComputeShare"},
		{`node: {partition: {default: {gpus: [{mode: shared, shared: {memoryStep: lots}}]}}}`, "/node/partition/default/gpus/0/shared/memoryStep"},
		{`node: {partition: {nodes: [{gpus: [{mode: shared}]}]}}`, "nodeSelector"},
		{`node: {partition: {default: {gpus: [{}]}}}`, "mode"},
		{`node: {resyncPeriod: "1 minute"}`, "/node/resyncPeriod"},
		{`node: {securityProfile: root}`, "/node/securityProfile"},
		{`node: {securityProfile: restricted, runtimeClassName: ""}`, "needs node.runtimeClassName"},
		{`node: {health: {benignXIDs: [13, 13]}}`, "/node/health/benignXIDs"},
		{`node: {health: {probeInterval: often}}`, "/node/health/probeInterval"},
		{`scheduler: {gpuDrivers: ["Not A Driver"]}`, "/scheduler/gpuDrivers/0"},
		{`scheduler: {parallelism: 0}`, "/scheduler/parallelism"},
		{`node: {extraArgs: ["rm -rf /"]}`, "/node/extraArgs/0"},
		{`node: {partition: {nodes: [{nodeSelector: {matchLabels: {a: b}}, gpus: [{mode: devicePlugin}]}]}}`, "needs node.devicePlugin.enabled=true"},
		{`node: {devicePlugin: {enabled: true, config: {migStrategy: some}}}`, "/node/devicePlugin/config/migStrategy"},
		{`node: {devicePlugin: {enabled: true, config: {pluginDir: /elsewhere}}}`, "pluginDir"},
		{`node: {devicePlugin: {enabled: true, config: {timeSlicing: {replicas: 0}}}}`, "/node/devicePlugin/config/timeSlicing/replicas"},
		{`scheduler: {leaderElection: {enabled: false}}`, "needs scheduler.leaderElection.enabled=true"},
		{`scheduler: {podDisruptionBudget: {minAvailable: 2}}`, "must be below scheduler.replicas"},
		{`scheduler: {topologyKeys: ["bad key!"]}`, "/scheduler/topologyKeys/0"},
		{`scheduler: {usageHalfLife: "1 hour"}`, "/scheduler/usageHalfLife"},
		{`scheduler: {usageWeight: -1}`, "/scheduler/usageWeight"},
		{`scheduler: {consolidationMaxPods: -1}`, "/scheduler/consolidationMaxPods"},
		{`scheduler: {topologies: [{name: dc, levels: []}]}`, "/scheduler/topologies/0/levels"},
		{`scheduler: {topologies: [{name: dc, levels: [{nodeLabel: "bad label!"}]}]}`, "/scheduler/topologies/0/levels/0/nodeLabel"},
		{`scheduler: {topologies: [{name: dc, levels: [{nodeLabel: a}]}, {name: dc, levels: [{nodeLabel: b}]}]}`, `topology "dc" is listed twice`},
		{`scheduler: {workloadResources: [{apiGroups: ["*"], resources: ["*"]}]}`, "/scheduler/workloadResources/0/resources/0"},
		{`exampleQueues: {queues: [{name: a}, {name: a}]}`, `queue "a" is listed twice`},
		{`{overview: {enabled: false}, prometheusRule: {enabled: true}}`, "need overview.enabled=true"},
		{`prometheusRule: {gangPendingMinutes: 0}`, "/prometheusRule/gangPendingMinutes"},
		{`overview: {refresh: soon}`, "/overview/refresh"},
		{`node: {namespace: Tessera_Node}`, "/node/namespace"},
		{`node: {createNamespace: "yes"}`, "/node/createNamespace"},
		{`exampleQueues: {queues: [{name: a, spec: {resources: {gpu: {quota: "-1"}}}}]}`, "/exampleQueues/queues/0/spec/resources/gpu/quota"},
	} {
		t.Run(tc.values, func(t *testing.T) {
			_, err := deployments.Render(deployments.Options{Namespace: testNamespace, Values: values(t, tc.values)})
			if err == nil {
				t.Fatal("render accepted invalid values")
			}
			if !errors.Is(err, deployments.ErrInvalidValues) {
				t.Errorf("error %v is not ErrInvalidValues", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not name %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestKubeVersion: the chart refuses clusters older than DRA's GA API.
func TestKubeVersion(t *testing.T) {
	_, err := deployments.Render(deployments.Options{KubeVersion: "v1.33.4"})
	if err == nil || !strings.Contains(err.Error(), ">=1.34.0-0") {
		t.Errorf("render for 1.33: err = %v, want the chart's kubeVersion constraint", err)
	}
	if _, err := deployments.Render(deployments.Options{KubeVersion: "v1.34.0"}); err != nil {
		t.Errorf("render for 1.34: %v", err)
	}
}

// TestGeneratedFilesInSync fails when the chart's copies of the CRDs and
// DeviceClasses, or deployments/manifests/, are stale. Fix with
// `go run ./hack/render-manifests`.
func TestGeneratedFilesInSync(t *testing.T) {
	diffs, err := deployments.DiffSources(deployments.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("chart copy out of date: %s (run go run ./hack/render-manifests)", d)
	}
	r, err := deployments.Render(deployments.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range deployments.PlainManifests(r, deployments.DefaultReleaseName, deployments.DefaultNamespace) {
		got, err := os.ReadFile(filepath.Join(deployments.Dir(), "manifests", name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("deployments/manifests/%s is out of date (run go run ./hack/render-manifests)", name)
		}
	}
}

// TestSyncSources: the copy step adds missing files, rewrites changed ones
// and removes files whose source is gone.
func TestSyncSources(t *testing.T) {
	dir := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("crds/a.yaml", "a: 1\n")
	write("crds/b.yaml", "b: 2\n")
	write("deviceclasses/c.yaml", "c: 3\n")
	write("helm/tessera/crds/b.yaml", "b: old\n")
	write("helm/tessera/crds/gone.yaml", "gone: 1\n")
	diffs, err := deployments.DiffSources(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 4 {
		t.Errorf("diffs = %q, want a missing, b changed, gone unsourced, c missing", diffs)
	}
	if _, err := deployments.SyncSources(dir); err != nil {
		t.Fatal(err)
	}
	if diffs, err := deployments.DiffSources(dir); err != nil || len(diffs) != 0 {
		t.Errorf("after sync: diffs = %q, err = %v", diffs, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "helm/tessera/crds/gone.yaml")); !os.IsNotExist(err) {
		t.Error("a chart copy without source survived the sync")
	}
}

// checkServing: the scheduler's and node agent's endpoint flags, port names
// and probe schemes are HTTPS (secure) or plain HTTP, never both.
func checkServing(t *testing.T, r *deployments.Rendered, secure bool) {
	t.Helper()
	dep := typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{})
	ds := typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{})
	ov := typed(t, r, "Deployment", "tessera-overview", &appsv1.Deployment{})
	scheme, name := corev1.URISchemeHTTP, "http"
	if secure {
		scheme, name = corev1.URISchemeHTTPS, "https"
	}
	for _, tc := range []struct {
		c     corev1.Container
		plain string // the plain-HTTP flag
		port  string
		// plainArgs are the serving flags of plain HTTP.
		plainArgs []string
	}{
		{dep.Spec.Template.Spec.Containers[0], "--metrics-bind-address", "10359", []string{"--secure-port=0", "--metrics-bind-address=:10359"}},
		{ds.Spec.Template.Spec.Containers[0], "--http-address", "10358", []string{"--secure-port=0", "--http-address=:10358"}},
		// tessera top serves no HTTPS unless --secure-port is given, and
		// plain HTTP on a pod's addresses only with --web-allow-remote.
		{ov.Spec.Template.Spec.Containers[0], "--web", "8080", []string{"--web=:8080", "--web-allow-remote"}},
	} {
		wantArgs := tc.plainArgs
		if secure {
			wantArgs = []string{"--secure-port=" + tc.port}
		}
		var got []string
		for _, a := range tc.c.Args {
			if strings.HasPrefix(a, "--secure-port") || strings.HasPrefix(a, tc.plain) {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, wantArgs) {
			t.Errorf("%s serving flags = %q, want %q", tc.c.Name, got, wantArgs)
		}
		if len(tc.c.Ports) != 1 || tc.c.Ports[0].Name != name || strconv.Itoa(int(tc.c.Ports[0].ContainerPort)) != tc.port {
			t.Errorf("%s ports = %+v, want %s %s", tc.c.Name, tc.c.Ports, name, tc.port)
		}
		for _, p := range []*corev1.Probe{tc.c.LivenessProbe, tc.c.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != scheme || p.HTTPGet.Port.String() != name {
				t.Errorf("%s probe %+v, want %s on port %s", tc.c.Name, p, scheme, name)
			}
		}
	}
	for _, svc := range []string{"tessera-scheduler-metrics", "tessera-node-metrics", "tessera-overview-metrics"} {
		s := typed(t, r, "Service", svc, &corev1.Service{})
		if s.Spec.Ports[0].TargetPort.String() != name {
			t.Errorf("Service %s targets %s, want %s", svc, s.Spec.Ports[0].TargetPort.String(), name)
		}
	}
}
