package secureserve

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/internal/metricsconv"
	"github.com/tessera-gpu/tessera/test/framework"
)

func TestMain(m *testing.M) { os.Exit(framework.Run(m)) }

// endpoints is a component's mux: health paths and /metrics.
func endpoints() http.Handler {
	mux := http.NewServeMux()
	for _, p := range []string{"/healthz", "/readyz", "/livez"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	}
	mux.Handle("/metrics", metricsconv.Handler())
	return mux
}

// get fetches url with token (none when empty), returning status and body.
func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		// The endpoint's certificate is self-signed (no --tls-cert-file).
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test of a self-signed server
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestDelegatedAuth serves against the real kube-apiserver: /metrics needs a
// token the API server accepts (TokenReview) of a user allowed `get` on the
// non-resource URL /metrics (SubjectAccessReview); the health paths need
// nothing; the explicit plain-HTTP address needs nothing either.
func TestDelegatedAuth(t *testing.T) {
	cp := framework.Shared(t)
	client := cp.Client(t)
	ns := cp.CreateNamespace(t)
	ctx := context.Background()

	// A scraper's ClusterRole as the chart grants it, bound to one service account.
	role := framework.UniqueName("metrics-reader")
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, NonResourceURLs: []string{"/metrics"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
	token := func(sa string) string {
		if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, other := token("scraper"), token("other")

	o := NewOptions("test", 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.SecureServing.Listener = l
	o.InsecureAddress = "127.0.0.1:0"
	o.DefaultKubeconfig(cp.KubeconfigPath)
	if errs := o.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	_, tctx := ktesting.NewTestContext(t)
	srv, err := o.Serve(tctx, endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	base := "https://" + srv.SecureAddr.String()

	for _, tc := range []struct {
		name, path, token string
		want              int
		body              string
	}{
		{"no token (system:anonymous, as the kube-scheduler)", "/metrics", "", http.StatusForbidden, `system:anonymous\" cannot get path \"/metrics\"`},
		{"a token the API server does not know", "/metrics", "not-a-token", http.StatusUnauthorized, "Unauthorized"},
		{"a service account without the role", "/metrics", other, http.StatusForbidden, `system:serviceaccount:` + ns + `:other\" cannot get path \"/metrics\"`},
		{"the scraper", "/metrics", scraper, http.StatusOK, "# TYPE "},
		{"the scraper on a path RBAC does not grant", "/debug", scraper, http.StatusForbidden, "cannot get path"},
		{"healthz without a token", "/healthz", "", http.StatusOK, "ok"},
		{"readyz without a token", "/readyz", "", http.StatusOK, "ok"},
		{"livez without a token", "/livez", "", http.StatusOK, "ok"},
		{"healthz with another's token", "/healthz", other, http.StatusOK, "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, base+tc.path, tc.token)
			if code != tc.want || !strings.Contains(body, tc.body) {
				t.Errorf("GET %s: %d %q, want %d with %q", tc.path, code, body, tc.want, tc.body)
			}
		})
	}
	t.Run("plain HTTP", func(t *testing.T) {
		code, body := get(t, "http://"+srv.InsecureAddr.String()+"/metrics", "")
		if code != http.StatusOK || !strings.Contains(body, "# TYPE ") {
			t.Errorf("plain GET /metrics: %d %q", code, body)
		}
	})
}

// TestOutsideAClusterWithoutKubeconfig: with no kubeconfig to delegate to
// (and not in a pod) the endpoint still starts, as the kube-scheduler's does,
// and refuses everything but the always-allowed paths.
func TestOutsideAClusterWithoutKubeconfig(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	o := NewOptions("test", 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.SecureServing.Listener = l
	o.DefaultKubeconfig("")
	_, tctx := ktesting.NewTestContext(t)
	srv, err := o.Serve(tctx, endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if code, _ := get(t, "https://"+srv.SecureAddr.String()+"/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, _ := get(t, "https://"+srv.SecureAddr.String()+"/metrics", ""); code != http.StatusForbidden {
		t.Errorf("/metrics without delegation: %d, want 403", code)
	}
	if srv.InsecureAddr != nil {
		t.Errorf("plain HTTP served without its flag: %s", srv.InsecureAddr)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		port     int
		insecure string
		bad      string
	}{
		{10259, "", ""},
		{0, "127.0.0.1:8080", ""},
		{70000, "", "--secure-port"},
		{10259, "127.0.0.1", "--metrics-bind-address"},
		{10259, ":http", "not a number"},
	} {
		o := NewOptions("test", tc.port)
		o.insecureFlag = "metrics-bind-address"
		o.InsecureAddress = tc.insecure
		errs := o.Validate()
		if tc.bad == "" && len(errs) > 0 || tc.bad != "" && (len(errs) == 0 || !strings.Contains(errs[0].Error(), tc.bad)) {
			t.Errorf("port %d insecure %q: %v, want an error with %q", tc.port, tc.insecure, errs, tc.bad)
		}
	}
}
