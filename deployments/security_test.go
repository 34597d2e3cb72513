package deployments_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/draplugin/sharing"
	"github.com/tessera-gpu/tessera/test/framework"
)

// freeAddr returns 127.0.0.1:<a port free just now>.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// httpsGet fetches an agent's endpoint with a bearer token (none when empty).
// The certificate is the self-signed one the chart's default makes.
func httpsGet(url, token string) (int, string, error) {
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the agents' self-signed certificate
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestSecureEndpointsWithChartAccess runs tessera-scheduler, tessera-node and
// the overview (tessera top) with the chart's flags (HTTPS, the default) as their service accounts with
// nothing but the chart's RBAC, which must let them delegate authentication
// (TokenReview) and authorization (SubjectAccessReview) to the real API
// server: /metrics refuses a request without a token (403 for system:anonymous,
// as the kube-scheduler answers) and a service account without the chart's metrics-reader role (403), and serves the
// scraper the chart binds (secureServing.scrapers); the health paths need no
// token (the kubelet's probes carry none).
func TestSecureEndpointsWithChartAccess(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	scrapers := c.cp.CreateNamespace(t)
	ns, prefix := install(t, c, fmt.Sprintf("rbac: {queueAdmin: {enabled: false}}, secureServing: {scrapers: [{kind: ServiceAccount, name: prometheus, namespace: %[1]s}]}, overview: {viewers: [{kind: ServiceAccount, name: viewer, namespace: %[1]s}]}", scrapers))
	token := func(name string) string {
		if _, err := c.client.CoreV1().ServiceAccounts(scrapers).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := c.client.CoreV1().ServiceAccounts(scrapers).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	prometheus, other, viewer := token("prometheus"), token("other"), token("viewer")

	nodeName := framework.UniqueName("gpu-node")
	if _, err := c.client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.client.CoreV1().Nodes().Delete(context.Background(), nodeName, metav1.DeleteOptions{}) })
	node := startNode(t, c, ns, prefix, nodeName, `{partition: {default: {gpus: [{mode: whole}]}}}`, "")

	// The scheduler with exactly the chart's flags but the address.
	schedAddr := freeAddr(t)
	kubeconfig := saKubeconfig(t, c, t.TempDir(), ns, prefix+"-scheduler", nil)
	dep := typed(t, render(t, ns, "{fullnameOverride: "+prefix+"}"), "Deployment", prefix+"-scheduler", &appsv1.Deployment{})
	args := dep.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--secure-port=10359") || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--metrics-bind-address") }) {
		t.Fatalf("the chart's scheduler does not serve HTTPS only by default: %q", args)
	}
	args = append(args, "--kubeconfig="+kubeconfig, "--bind-address=127.0.0.1", "--secure-port="+port(schedAddr))
	sched := startProcess(t, "tessera-scheduler", binary(t, "tessera-scheduler"), args, nil)

	// The overview (tessera top) with exactly the chart's flags but the address.
	overviewAddr := freeAddr(t)
	ovKubeconfig := saKubeconfig(t, c, t.TempDir(), ns, prefix+"-overview", nil)
	ovDep := typed(t, render(t, ns, "{fullnameOverride: "+prefix+"}"), "Deployment", prefix+"-overview", &appsv1.Deployment{})
	ovArgs := ovDep.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(ovArgs, "--secure-port=8080") || slices.ContainsFunc(ovArgs, func(a string) bool { return strings.HasPrefix(a, "--web") }) {
		t.Fatalf("the chart's overview does not serve HTTPS only by default: %q", ovArgs)
	}
	ovArgs = append(ovArgs, "--kubeconfig="+ovKubeconfig, "--bind-address=127.0.0.1", "--secure-port="+port(overviewAddr))
	ov := startProcess(t, "tessera-overview", binary(t, "tessera"), ovArgs, nil)

	for _, agent := range []struct {
		name, addr, metric string
		p                  *process
	}{
		{"tessera-scheduler", schedAddr, "tessera_scheduler_", sched},
		{"tessera-node", node.secureAddr, "tessera_node_", node.process},
		{"tessera-overview", overviewAddr, "tessera_cluster_", ov},
	} {
		t.Run(agent.name, func(t *testing.T) {
			base := "https://" + agent.addr
			if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
				if err := agent.p.running(); err != nil {
					return false, err
				}
				code, _, err := httpsGet(base+"/healthz", "")
				return err == nil && code == http.StatusOK, nil
			}); err != nil {
				t.Fatalf("%s /healthz over HTTPS without a token: %v", agent.name, err)
			}
			for _, tc := range []struct {
				what, path, token string
				want              int
				body              string
			}{
				{"no token (system:anonymous)", "/metrics", "", http.StatusForbidden, `system:anonymous\" cannot get path \"/metrics\"`},
				{"a service account without the metrics-reader role", "/metrics", other, http.StatusForbidden, `cannot get path \"/metrics\"`},
				{"the scraper the chart binds", "/metrics", prometheus, http.StatusOK, agent.metric},
				// The kube-scheduler's answer to a token the API server does not know.
				{"an unknown token", "/metrics", "not-a-token", http.StatusUnauthorized, "Unauthorized"},
				{"livez without a token", "/livez", "", http.StatusOK, "ok"},
				{"readyz without a token", "/readyz", "", http.StatusOK, "ok"},
			} {
				code, body, err := httpsGet(base+tc.path, tc.token)
				if err != nil || code != tc.want || !strings.Contains(body, tc.body) {
					t.Errorf("%s: GET %s = %d %.300q (%v), want %d with %q", tc.what, tc.path, code, body, err, tc.want, tc.body)
				}
			}
			if agent.name != "tessera-overview" {
				return
			}
			// The page and /overview.json: only for overview.viewers (the
			// ClusterRole <release>-overview-viewer), not for the scraper.
			for _, tc := range []struct {
				what, path, token string
				want              int
				body              string
			}{
				{"the page without a token", "/", "", http.StatusForbidden, `system:anonymous\" cannot get path \"/\"`},
				{"the page for the scraper", "/", prometheus, http.StatusForbidden, `cannot get path \"/\"`},
				{"the page for a viewer", "/", viewer, http.StatusOK, "<html"},
				{"/overview.json for a viewer", "/overview.json", viewer, http.StatusOK, `"nodes"`},
				{"/overview.json for another service account", "/overview.json", other, http.StatusForbidden, `cannot get path \"/overview.json\"`},
				{"/metrics for a viewer", "/metrics", viewer, http.StatusForbidden, `cannot get path \"/metrics\"`},
			} {
				code, body, err := httpsGet(base+tc.path, tc.token)
				if err != nil || code != tc.want || !strings.Contains(body, tc.body) {
					t.Errorf("%s: GET %s = %d %.300q (%v), want %d with %q", tc.what, tc.path, code, body, err, tc.want, tc.body)
				}
			}
		})
	}
}

// TestServingAccess: the chart gives each agent's service account what
// delegated authentication and authorization need, as the kube-scheduler's
// bootstrap policy gives system:kube-scheduler, and nothing of it when plain
// HTTP is chosen.
func TestServingAccess(t *testing.T) {
	c := getCluster(t)
	for _, secure := range []bool{true, false} {
		ns, prefix := install(t, c, fmt.Sprintf("rbac: {queueAdmin: {enabled: false}}, secureServing: {enabled: %t}", secure))
		for _, agent := range []string{"node", "scheduler", "overview"} {
			saNS := ns
			if agent == "node" {
				saNS = nodeNamespace(ns)
			}
			user := "system:serviceaccount:" + saNS + ":" + prefix + "-" + agent
			checkAccess(t, c, agent, user, []access{
				{"create", "authentication.k8s.io", "tokenreviews", "", "", secure},
				{"create", "authorization.k8s.io", "subjectaccessreviews", "", "", secure},
				{"get", "", "configmaps", "kube-system", "extension-apiserver-authentication", secure},
				{"watch", "", "configmaps", "kube-system", "extension-apiserver-authentication", secure},
				{"get", "", "configmaps", "kube-system", "kube-root-ca.crt", false},
			})
		}
	}
}

// violations are the check names of a PodSecurity refusal, e.g.
// `violates PodSecurity "restricted:latest": privileged (container ...),
// hostPath volumes (...)` gives [hostPath volumes, privileged].
func violations(err error) []string {
	msg := err.Error()
	i := strings.Index(msg, `":`)
	if !strings.Contains(msg, "violates PodSecurity") || i < 0 {
		return []string{"not a PodSecurity refusal: " + msg}
	}
	var names []string
	depth, start := 0, i+2
	for j := start; j < len(msg); j++ {
		switch msg[j] {
		case '(':
			if depth == 0 {
				names = append(names, strings.TrimSpace(msg[start:j]))
			}
			depth++
		case ')':
			depth--
			if depth == 0 {
				start = j + 1
				if start < len(msg) && msg[start] == ',' {
					start++
				}
			}
		}
	}
	sort.Strings(names)
	return names
}

// TestPodSecurityAdmission creates every pod the chart runs, and the MPS
// daemon pods tessera-node creates, in namespaces labelled with each Pod
// Security level, through the real API server's PodSecurity admission (on by
// default): the scheduler and overview pass `restricted`; the node agent and
// the MPS daemons are refused by `restricted` and `baseline` with exactly the
// violations docs/install.md names with their reasons, and admitted by
// `privileged`, the level of the node namespace the chart creates. The chart
// rendered into a release namespace enforcing `restricted` has every pod
// admitted where it puts it.
func TestPodSecurityAdmission(t *testing.T) {
	c := getCluster(t)
	ctx := context.Background()
	level := map[string]string{}
	for _, l := range []string{"restricted", "baseline", "privileged"} {
		ns := c.cp.CreateNamespace(t)
		n, err := c.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels["pod-security.kubernetes.io/enforce"] = l
		if _, err := c.client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		level[l] = ns
	}

	type podCase struct {
		name string
		spec corev1.PodSpec
		// refused: the violations at each level that refuses it.
		refused map[string][]string
	}
	var cases []podCase
	templates := func(values string) (sched, overview, node corev1.PodSpec) {
		r := render(t, "tessera", values)
		sched = typed(t, r, "Deployment", "tessera-scheduler", &appsv1.Deployment{}).Spec.Template.Spec
		overview = typed(t, r, "Deployment", "tessera-overview", &appsv1.Deployment{}).Spec.Template.Spec
		node = typed(t, r, "DaemonSet", "", &appsv1.DaemonSet{}).Spec.Template.Spec
		return
	}
	sched, overview, node := templates("{fullnameOverride: tessera, overview: {enabled: true}}")
	_, _, restrictedNode := templates("{fullnameOverride: tessera, node: {securityProfile: restricted}}")
	cases = append(cases,
		podCase{name: "scheduler", spec: sched},
		podCase{name: "overview", spec: overview},
		podCase{name: "node agent (securityProfile privileged, the default)", spec: node, refused: map[string][]string{
			"restricted": {"allowPrivilegeEscalation != false", "privileged", "restricted volume types", "runAsNonRoot != true", "runAsUser=0", "seccompProfile", "unrestricted capabilities"},
			"baseline":   {"hostPath volumes", "privileged"},
		}},
		podCase{name: "node agent (securityProfile restricted)", spec: restrictedNode, refused: map[string][]string{
			"restricted": {"restricted volume types", "runAsNonRoot != true", "runAsUser=0", "unrestricted capabilities"},
			"baseline":   {"hostPath volumes", "non-default capabilities"},
		}},
	)
	dirs := sharing.Dirs{Root: "/run/tessera/mps/claims/u1", Pipe: "/run/tessera/mps/claims/u1/pipe", Log: "/run/tessera/mps/claims/u1/log", Shm: "/run/tessera/mps/claims/u1/shm"}
	spec := sharing.DaemonSpec{ID: "u1", Claim: "team-a/claim", Devices: []string{"GPU-0"}}
	for _, rc := range []string{"nvidia", ""} {
		l := &sharing.PodLauncher{NodeName: "n1", Image: "tessera:test", MPSDir: "/run/tessera/mps", RuntimeClassName: rc, HostDriverRoot: "/"}
		pc := podCase{name: "MPS daemon, runtime class " + rc, spec: l.Pod(spec, dirs).Spec, refused: map[string][]string{
			"restricted": {"host namespaces", "restricted volume types", "runAsNonRoot != true", "runAsUser=0", "unrestricted capabilities"},
			"baseline":   {"host namespaces", "hostPath volumes"},
		}}
		if rc == "" {
			pc.name = "MPS daemon, privileged (no runtime class)"
			pc.refused["restricted"] = []string{"allowPrivilegeEscalation != false", "host namespaces", "privileged", "restricted volume types", "runAsNonRoot != true", "runAsUser=0", "seccompProfile", "unrestricted capabilities"}
			pc.refused["baseline"] = []string{"host namespaces", "hostPath volumes", "privileged"}
		}
		cases = append(cases, pc)
	}

	psaCreate := func(ns string, spec corev1.PodSpec) error {
		spec = *spec.DeepCopy()
		// PodSecurity looks at the pod alone; the service accounts and
		// nodes of a real install are not there.
		spec.ServiceAccountName, spec.NodeName = "", ""
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-probe"}, Spec: spec}
		_, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}

	// The chart as installed: the release namespace enforcing restricted
	// (as docs/install.md tells to label it), the node namespace as the
	// chart creates it. Every pod template is admitted where the chart puts
	// it, the MPS daemon pods too; the node agent in the release namespace
	// is refused with exactly the violations listed above.
	t.Run("chart with the release namespace restricted", func(t *testing.T) {
		releaseNS := level["restricted"]
		r := render(t, releaseNS, "{fullnameOverride: tessera, overview: {enabled: true}}")
		namespaces := ofKind(r, "Namespace")
		if len(namespaces) != 1 {
			t.Fatalf("the chart renders Namespaces %v, want the node namespace", names(namespaces))
		}
		c.create(t, namespaces[0], "")
		nodeNS := namespaces[0].GetName()
		if err := c.cp.WaitDefaultServiceAccount(ctx, c.client, nodeNS); err != nil {
			t.Fatal(err)
		}
		var admitted []string
		for _, obj := range r.Objects {
			var spec corev1.PodSpec
			switch obj.GetKind() {
			case "DaemonSet":
				spec = typed(t, r, "DaemonSet", obj.GetName(), &appsv1.DaemonSet{}).Spec.Template.Spec
			case "Deployment":
				spec = typed(t, r, "Deployment", obj.GetName(), &appsv1.Deployment{}).Spec.Template.Spec
			default:
				continue
			}
			if err := psaCreate(obj.GetNamespace(), spec); err != nil {
				t.Errorf("%s %s refused in its namespace %s: %v", obj.GetKind(), obj.GetName(), obj.GetNamespace(), err)
			}
			admitted = append(admitted, obj.GetNamespace()+"/"+obj.GetName())
			if obj.GetKind() == "DaemonSet" {
				err := psaCreate(releaseNS, spec)
				if want := cases[2].refused["restricted"]; err == nil || !slices.Equal(violations(err), want) {
					t.Errorf("node agent in the release namespace: %v, want refused with %q", err, want)
				}
			}
		}
		slices.Sort(admitted)
		if want := []string{nodeNS + "/tessera-node", releaseNS + "/tessera-overview", releaseNS + "/tessera-scheduler"}; !slices.Equal(admitted, want) {
			t.Errorf("pod templates checked = %v, want %v", admitted, want)
		}
		for _, rc := range []string{"nvidia", ""} {
			l := &sharing.PodLauncher{Namespace: nodeNS, NodeName: "n1", Image: "tessera:test", MPSDir: "/run/tessera/mps", RuntimeClassName: rc, HostDriverRoot: "/"}
			if err := psaCreate(nodeNS, l.Pod(spec, dirs).Spec); err != nil {
				t.Errorf("MPS daemon (runtime class %q) refused in the node namespace: %v", rc, err)
			}
		}
	})

	for _, pc := range cases {
		for _, l := range []string{"restricted", "baseline", "privileged"} {
			t.Run(pc.name+" in "+l, func(t *testing.T) {
				err := psaCreate(level[l], pc.spec)
				want, refused := pc.refused[l]
				switch {
				case !refused && err != nil:
					t.Errorf("refused by %s: %v", l, err)
				case refused && err == nil:
					t.Errorf("admitted by %s, want the violations %q", l, want)
				case refused && !slices.Equal(violations(err), want):
					t.Errorf("violations of %s = %q, want %q (the ones docs/install.md names):\n%v", l, violations(err), want, err)
				}
			})
		}
	}
}
