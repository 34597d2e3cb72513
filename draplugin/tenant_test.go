package draplugin

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
)

// TestTenantIsolation: one tenant's prepared device is never prepared for
// another namespace's claim, whatever the API says, and the kubelet's
// request cannot reach another namespace's claim by naming its own
// namespace with the other's name or UID. Every refusal leaves nothing
// behind: no CDI spec, no checkpoint record, no tool call.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t)
	e.start()
	k := e.kubelet()
	other := e.namespace()

	mine := e.claim("train", []request{{name: "gpu", class: "gpu", selector: `device.attributes["gpu.tessera.dev"].index == 3`}})
	if r := k.prepare(t, e.ctx, mine)[string(mine.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	specs, calls := e.specFiles(), len(e.tools.Calls())

	// Another namespace's claim carrying a copy of this claim's allocation
	// (a stale or forged allocation; the API server accepts it).
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: other}, Spec: mine.Spec}
	theirs, err := e.client.ResourceV1().ResourceClaims(other).Create(e.ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	theirs.Status.Allocation = mine.Status.Allocation.DeepCopy()
	if theirs, err = e.client.ResourceV1().ResourceClaims(other).UpdateStatus(e.ctx, theirs, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := k.prepare(t, e.ctx, theirs)[string(theirs.UID)]
	for _, want := range []string{"exclusive-device guard", other + "/train", e.ns + "/train", string(mine.UID)} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("cross-namespace prepare: error %q does not contain %q", r.Error, want)
		}
	}

	// The kubelet names a claim by namespace, name and UID; the plugin
	// prepares only the claim that is all three. This tenant's claim named
	// under the other namespace is the other's claim, whose UID differs.
	// (The kubeletplugin helper fetches the claim the request names and
	// fails the whole request when it is not the claim with that UID.)
	forged := mine.DeepCopy()
	forged.Namespace = other
	if err := k.prepareErr(e, forged); err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Errorf("claim %s/train with the UID of %s/train: %v, want it refused", other, e.ns, err)
	}
	// A name that exists only in this tenant's namespace.
	forged.Name = "does-not-exist"
	if err := k.prepareErr(e, forged); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("claim named in a namespace where it does not exist: %v, want it refused", err)
	}

	if got := e.specFiles(); len(got) != len(specs) {
		t.Errorf("refused prepares left CDI specs: %v (before: %v)", got, specs)
	}
	if got := len(e.tools.Calls()); got != calls {
		t.Errorf("refused prepares ran tools: %v", e.tools.Calls()[calls:])
	}
	cp, err := checkpoint.Read(filepath.Join(e.pluginDir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Data.Claims) != 1 || cp.Data.Claims[mine.UID] == nil {
		t.Errorf("checkpoint holds %v, want only %s/train", cp.Data.Claims, e.ns)
	}
}

// prepareErr sends a prepare for the claim and returns the error of the
// whole request or of the claim.
func (k *kubelet) prepareErr(e *env, c *resourceapi.ResourceClaim) error {
	resp, err := k.dra.NodePrepareResources(e.ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		return err
	}
	if r := resp.Claims[string(c.UID)]; r != nil && r.Error != "" {
		return errors.New(r.Error)
	}
	return nil
}
