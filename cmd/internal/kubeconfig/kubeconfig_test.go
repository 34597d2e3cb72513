package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func writeKubeconfig(t *testing.T, dir string, servers map[string]string, current, ns string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	for name, server := range servers {
		kc.Clusters[name] = &clientcmdapi.Cluster{Server: server}
		kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: "token-" + name}
		kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: ns}
	}
	kc.CurrentContext = current
	path := filepath.Join(dir, "config")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// isolate unsets $KUBECONFIG and makes in-cluster configuration impossible.
func isolate(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

func TestLoadOrder(t *testing.T) {
	// (~/.kube/config is client-go's, read from a path fixed when the
	// process starts: not tested here.)
	isolate(t)
	envCfg := writeKubeconfig(t, t.TempDir(), map[string]string{"env": "https://env:6443", "other": "https://other:6443"}, "env", "team-a")
	flagCfg := writeKubeconfig(t, t.TempDir(), map[string]string{"flag": "https://flag:6443"}, "flag", "")

	host := func(o Options) string {
		t.Helper()
		cfg, err := Load(o)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Host
	}
	t.Setenv("KUBECONFIG", envCfg)
	if h := host(Options{}); h != "https://env:6443" {
		t.Errorf("with $KUBECONFIG: host %s", h)
	}
	if h := host(Options{Context: "other"}); h != "https://other:6443" {
		t.Errorf("--context other: host %s", h)
	}
	if h := host(Options{Path: flagCfg}); h != "https://flag:6443" {
		t.Errorf("--kubeconfig beats $KUBECONFIG: host %s", h)
	}
	if ns, err := Namespace(Options{}); err != nil || ns != "team-a" {
		t.Errorf("Namespace = %q, %v; want the context's team-a", ns, err)
	}
	cfg, err := Load(Options{Path: flagCfg, UserAgent: "tessera-node"})
	if err != nil || cfg.UserAgent != "tessera-node" || cfg.BearerToken != "token-flag" {
		t.Errorf("Load = %+v, %v", cfg, err)
	}
}

func TestLoadErrorsNameTheSource(t *testing.T) {
	isolate(t)
	_, err := Load(Options{Path: "/does/not/exist"})
	if err == nil || !strings.Contains(err.Error(), `--kubeconfig "/does/not/exist"`) {
		t.Errorf("missing --kubeconfig file: %v", err)
	}
	if _, statErr := os.Stat(clientcmd.RecommendedHomeFile); statErr == nil {
		t.Logf("%s exists: not checking the error without any kubeconfig", clientcmd.RecommendedHomeFile)
	} else if _, err = Load(Options{}); err == nil || !strings.Contains(err.Error(), "not running in a cluster") {
		t.Errorf("nothing at all: %v", err)
	}
	cfg := writeKubeconfig(t, t.TempDir(), map[string]string{"a": "https://a:6443"}, "a", "")
	_, err = Load(Options{Path: cfg, Context: "nope"})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown context: %v", err)
	}
}
