package main

import (
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/internal/secureserve"
)

// TestTopWebServesPlainHTTPOnLoopbackOnly: --web is plain HTTP without
// authentication, so an address reachable from the network is refused with
// the ways out named, unless --web-allow-remote; loopback addresses pass.
func TestTopWebServesPlainHTTPOnLoopbackOnly(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		remote  bool
		refused string
	}{
		{":8080", false, "without authentication to the network"},
		{"0.0.0.0:8080", false, "without authentication to the network"},
		{"[::]:8080", false, "without authentication to the network"},
		{"192.0.2.1:8080", false, "without authentication to the network"},
		{"example.com:8080", false, "without authentication to the network"},
		{"nohostport", false, "nohostport"},
		{":8080", true, ""},
		{"localhost:8080", false, ""},
		{"127.0.0.1:0", false, ""},
		{"[::1]:0", false, ""},
	} {
		o := secureserve.NewOptions("tessera-overview", 0)
		o.InsecureAddress = tc.addr
		err := validateServing(o, tc.remote)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("--web %s (allow remote %t): %v", tc.addr, tc.remote, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("--web %s (allow remote %t): %v, want an error with %q", tc.addr, tc.remote, err, tc.refused)
		case tc.refused != "" && tc.addr != "nohostport" && (!strings.Contains(err.Error(), "--secure-port") || !strings.Contains(err.Error(), "--web-allow-remote")):
			t.Errorf("--web %s: %v does not name the ways out", tc.addr, err)
		}
	}
	// The command refuses before it reads the cluster.
	cmd := newTopCommand()
	cmd.SetArgs([]string{"--web", ":8080", "--kubeconfig", "/nonexistent"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "without authentication to the network") {
		t.Errorf("tessera top --web :8080: %v", err)
	}
}
