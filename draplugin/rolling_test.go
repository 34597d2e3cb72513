package draplugin

import (
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// TestRollingUpdate runs an old and a new plugin instance side by side on
// the same directories, as a DaemonSet with maxSurge does: both register,
// a claim prepared by one is unprepared by the other, and each call sees
// what the other instance wrote.
func TestRollingUpdate(t *testing.T) {
	e := newEnv(t)
	old := e.start(func(o *Options) { o.RollingUpdateUID = "pod-old" })
	c := e.claim("roll", []request{{name: "mig", class: "mig", selector: `device.attributes["gpu.tessera.dev"].index == 0`}})
	if res, err := old.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	updated := e.start(func(o *Options) { o.RollingUpdateUID = "pod-new" })
	for _, uid := range []string{"pod-old", "pod-new"} {
		sock := filepath.Join(e.registrarDir, kubeletplugin.RollingUpdateRegistrarSocketFile(e.registrarDir, DriverName, types.UID(uid)))
		if _, err := os.Stat(sock); err != nil {
			t.Errorf("registration socket of %s: %v", uid, err)
		}
	}
	// The new instance kept the old one's prepared claim.
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("MIG instances after the new instance started: %v", got)
	}
	res, err := updated.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
	if err != nil || res[c.UID] != nil {
		t.Fatal(err, res)
	}
	if got := e.migInstances(); len(got) != 0 {
		t.Fatalf("MIG instance left after the new instance unprepared: %v", got)
	}
	// The old instance notices the claim is gone and can prepare it again.
	if res, err := old.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c}); err != nil || res[c.UID].Err != nil {
		t.Fatal(err, res)
	}
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("MIG instances = %v, want 1", got)
	}
	old.Stop()
	res, err = updated.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
	if err != nil || res[c.UID] != nil {
		t.Fatal(err, res)
	}
	if got := e.migInstances(); len(got) != 0 {
		t.Fatalf("MIG instance left: %v", got)
	}
}
