package realnode

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/contract"
)

// TestPrepareErrorRetried: a claim whose MIG placement is occupied (a stale
// allocation that overlaps a prepared claim's instance, as a second
// scheduler could write) fails to prepare: the pod stays Pending, the
// kubelet reports tessera-node's error as the pod's event and retries; once
// the holder's pod is deleted, the next retry prepares the claim and the pod
// runs with its own MIG device.
func TestPrepareErrorRetried(t *testing.T) {
	e := newEnv(t)
	holderClaim := e.claim("holder", request{class: contract.ClassMIG, selector: attr(contract.AttrProfile) + ` == "1g.10gb"`})
	holder, holderClaim := e.schedule(e.pod("holder", holderClaim.Name, reportScript), holderClaim, e.allocationAt(holderClaim, 0))
	e.waitRunning(holder)
	held := holderClaim.Status.Allocation.Devices.Results[0].Device // gpu-<n>-mig-1g-10gb-0
	gpu := strings.TrimSuffix(held, "-mig-1g-10gb-0")

	// 2g.20gb at placement 0 covers memory slices 0 and 1: it overlaps.
	stale := holderClaim.Status.Allocation.DeepCopy()
	stale.Devices.Results[0].Device = gpu + "-mig-2g-20gb-0"
	e.sliceDevice(stale.Devices.Results[0].Device) // published: a valid device, just taken
	claim := e.claim("late", request{class: contract.ClassMIG})
	pod, claim := e.schedule(e.pod("late", claim.Name, reportScript), claim, stale)

	var messages []string
	e.waitFor("two failed prepares reported as events", 2*time.Minute, func(context.Context) (bool, error) {
		messages = e.events(pod, "FailedPrepareDynamicResources")
		return e.eventCount(pod, "FailedPrepareDynamicResources") >= 2, nil
	}, func() string { return "events: " + strings.Join(e.allEvents(pod), " | ") })
	joined := strings.Join(messages, "\n")
	t.Logf("events of %s: %s", pod.Name, joined)
	for _, want := range []string{"occupied", held, holderClaim.Name} {
		if !strings.Contains(joined, want) {
			t.Errorf("prepare error events do not name %q:\n%s", want, joined)
		}
	}
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("pod with a failed prepare is %s, want Pending (the kubelet retries)", p.Status.Phase)
	}
	if _, ok := e.checkpoint()[claim.UID]; ok || e.hasSpec(claim) {
		t.Errorf("the failed claim left a record or a CDI spec")
	}

	e.deletePod(holder)
	e.waitRunning(pod)
	rec := e.checkpoint()[claim.UID]
	if rec == nil || rec.Devices[0].MIG == nil || rec.Devices[0].MIG.Profile != "2g.20gb" || rec.Devices[0].MIG.Start != 0 {
		t.Fatalf("record of the retried claim: %+v", rec)
	}
	r := e.readReport(pod)
	caps := 0
	for path := range r.devices {
		if strings.HasPrefix(path, "/dev/nvidia-caps/") {
			caps++
		}
	}
	if caps != 2 {
		t.Errorf("the retried pod has %d MIG capability nodes, want 2 (its GPU and compute instance): %v", caps, r.devices)
	}
	e.deleteAndCheckUnprepared(pod, claim, "mig")
}
