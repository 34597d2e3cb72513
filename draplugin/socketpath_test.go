package draplugin

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// TestCheckSocketPaths: a socket path the kernel cannot bind is an error
// naming it, its length, the limit and the flag; the registration socket of
// a rolling update fits where the helper can shorten its name.
func TestCheckSocketPaths(t *testing.T) {
	const uid = types.UID("0e100000-0000-0000-0000-000000000002")
	short := "/var/lib/kubelet/plugins/gpu.tessera.dev"
	if err := CheckSocketPaths(DefaultRegistrarDir, short, uid); err != nil {
		t.Errorf("default directories: %v", err)
	}
	long := "/var/lib/kubelet/" + strings.Repeat("x", 50) + "/plugins/gpu.tessera.dev"
	err := CheckSocketPaths(DefaultRegistrarDir, long, uid)
	want := long + "/dra-" + string(uid) + ".sock"
	if err == nil || !strings.Contains(err.Error(), "socket path "+want+" is 137 bytes") || !strings.Contains(err.Error(), "108") || !strings.Contains(err.Error(), "--kubelet-plugin-dir") {
		t.Errorf("long plugin dir: %v", err)
	}
	if err := CheckSocketPaths(DefaultRegistrarDir, long, ""); err != nil {
		t.Errorf("long plugin dir without a UID (dra.sock fits): %v", err)
	}
	// 60 bytes of registry dir: <driver>-<uid>-reg.sock does not fit, the
	// hashed names do.
	reg := "/" + strings.Repeat("r", 59)
	if err := CheckSocketPaths(reg, short, uid); err != nil {
		t.Errorf("registry dir of 60 bytes: %v", err)
	}
	reg = "/" + strings.Repeat("r", 90)
	if err := CheckSocketPaths(reg, short, uid); err == nil || !strings.Contains(err.Error(), "--kubelet-registry-dir") {
		t.Errorf("registry dir of 91 bytes: %v", err)
	}
}
