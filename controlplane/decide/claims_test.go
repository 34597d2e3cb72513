package decide

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
)

// TestClaimsOfOtherPods: a pod whose claim belongs to another pod, or is going away, waits
// with WaitingForClaims and a message naming the claim and the pod, as the kube-scheduler's
// PreFilter refuses it; nothing of its gang is placed. A claim a pod names by
// resourceClaimName and another pod holds is shared, as the API allows: the pod joins it on
// the claim's node.
func TestClaimsOfOtherPods(t *testing.T) {
	owner := fixture.Pod("ns", "owner")
	owner.Spec.NodeName = "b"
	otherTemplateClaim := func() *resourceapi.ResourceClaim {
		c := fixture.AllocatedClaim("ns", "owner-gpu-x7k2", "b", "gpu-0")
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: owner.Name, UID: owner.UID}}
		return c
	}
	// byTemplate is a pod whose claim "gpu" comes from a template; the claim controller
	// wrote the generated name into its status (here another pod's claim).
	byTemplate := func(name, claim string) *v1.Pod {
		p := fixture.Pod("ns", name)
		p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")}}
		p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		p.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
		return p
	}
	for _, tc := range []struct {
		name   string
		claim  *resourceapi.ResourceClaim
		pod    *v1.Pod
		want   string // message part; empty: placed
		onNode string
	}{
		{
			name:  "template claim generated for another pod",
			claim: otherTemplateClaim(),
			pod:   byTemplate("thief", "owner-gpu-x7k2"),
			want:  "ResourceClaim ns/owner-gpu-x7k2 was not created for Pod ns/thief (Pod is not owner)",
		},
		{
			name: "own template claim being deleted",
			claim: func() *resourceapi.ResourceClaim {
				c := fixture.GPUClaim("ns", "mine-gpu-a1b2", 1)
				c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "mine", UID: "pod-ns-mine", Controller: ptr.To(true)}}
				c.DeletionTimestamp = ptr.To(metav1.Now())
				return c
			}(),
			pod:  byTemplate("mine", "mine-gpu-a1b2"),
			want: "ResourceClaim ns/mine-gpu-a1b2 of pod mine is being deleted",
		},
		{
			name:   "shared claim named by resourceClaimName",
			claim:  otherTemplateClaim(),
			pod:    fixture.Pod("ns", "sharer", "owner-gpu-x7k2"),
			onNode: "b",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t)
			s.node("a", 2)
			s.node("b", 2)
			s.queue("q", "", "", "", 1)
			s.claims["ns/"+tc.claim.Name] = tc.claim
			o := owner.DeepCopy()
			o.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: "owner"}
			s.pods["ns/owner"] = o
			s.pgs["ns/owner"] = &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "owner", UID: "pg-owner"}, Spec: v1alpha1.PodGroupSpec{MinMember: 1, Queue: "q"}}
			p := tc.pod.DeepCopy()
			p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: "g"}
			p.ResourceVersion = "1"
			s.pods["ns/"+p.Name] = p
			s.pgs["ns/g"] = &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "g", UID: "pg-g", Generation: 1}, Spec: v1alpha1.PodGroupSpec{MinMember: 1, Queue: "q"}}

			d := s.cycle(0)
			out := d.Outcomes["ns/g"]
			if tc.want != "" {
				if out.Reason != v1alpha1.ReasonWaitingForClaims || !strings.Contains(out.Message, tc.want) {
					t.Fatalf("outcome %+v, want %s with %q", out, v1alpha1.ReasonWaitingForClaims, tc.want)
				}
				if len(d.Placements) != 0 {
					t.Fatalf("placed %d gangs", len(d.Placements))
				}
				if s.pods["ns/"+p.Name].Spec.NodeName != "" {
					t.Fatal("pod bound")
				}
				return
			}
			if len(d.Placements) != 1 || len(d.Placements[0].Result.Placements) != 1 {
				t.Fatalf("outcome %+v, placements %+v", out, d.Placements)
			}
			pl := d.Placements[0].Result.Placements[0]
			if pl.Node != tc.onNode || len(pl.Allocate) != 0 || len(pl.Reserve) != 1 || pl.Reserve[0].Name != tc.claim.Name {
				t.Fatalf("placed on %s, allocating %d, reserving %v; want %s reserving %s", pl.Node, len(pl.Allocate), pl.Reserve, tc.onNode, tc.claim.Name)
			}
		})
	}
}
