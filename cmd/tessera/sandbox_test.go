package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
)

// TestSandboxKubectlWithoutSandbox: without a running sandbox the kubectl
// pass-through says so (and how to start one) rather than running kubectl
// against whatever ~/.kube/config names.
func TestSandboxKubectlWithoutSandbox(t *testing.T) {
	t.Setenv("TESSERA_SANDBOX_DIR", t.TempDir())
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"sandbox", "kubectl", "get", "nodes"})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "no sandbox is running") || !strings.Contains(err.Error(), "tessera sandbox up") {
		t.Errorf("err = %v", err)
	}
}

func TestBrowseURL(t *testing.T) {
	for addr, want := range map[string]string{
		"[::]:8080":       "http://localhost:8080/",
		"0.0.0.0:8080":    "http://localhost:8080/",
		"127.0.0.1:41234": "http://127.0.0.1:41234/",
		"[::1]:9":         "http://[::1]:9/",
	} {
		tcp, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := browseURL("http", tcp); got != want {
			t.Errorf("browseURL(%s) = %s, want %s", addr, got, want)
		}
	}
}
