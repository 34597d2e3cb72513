package decide

import (
	"fmt"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// readyToPlace checks queue, members and claims, filling the gang's solver input and its
// estimated usage, or the reason it waits.
func readyToPlace(cfg Config, in Input, snap *snapshot.Snapshot, tree *quota.Tree, g *gangState) bool {
	q := g.pg.Spec.Queue
	switch node := tree.Get(q); {
	case q == "":
		g.reason, g.message = v1alpha1.ReasonNoQueue, fmt.Sprintf("no queue: label %s is on neither the workload, the pod, nor namespace %s", v1alpha1.QueueLabel, g.pg.Namespace)
		return false
	case node == nil:
		g.reason, g.message = v1alpha1.ReasonQueueNotFound, fmt.Sprintf("queue %q does not exist", q)
		return false
	case node.Invalid != "":
		g.reason, g.message = v1alpha1.ReasonQueueInvalid, fmt.Sprintf("queue %q is invalid: %s", q, node.Invalid)
		return false
	}
	g.queueOK = true
	if have := int32(len(g.pending) + len(g.bound)); have < g.pg.Spec.MinMember {
		g.reason, g.message = v1alpha1.ReasonWaitingForMembers, fmt.Sprintf("%d of %d pods exist", have, g.pg.Spec.MinMember)
		if cfg.FormationTimeout > 0 && in.Now.Sub(oldestPod(g)) >= cfg.FormationTimeout {
			// Never a silent wait: a gang that cannot form says what it waits for.
			what := "the gang"
			if g.Workload != "" {
				what = g.Workload
			}
			g.formationDue = true
			g.message = fmt.Sprintf("only %d of %d pods of %s exist after %s: waiting for %d more before any is placed", have, g.pg.Spec.MinMember, what, cfg.FormationTimeout, g.pg.Spec.MinMember-have)
		}
		return false
	}
	gang := &solver.Gang{Name: g.Key}
	gang.Topology = gangTopology(in, g)
	est := quota.Usage{}
	var missing, unusable []string
	for _, p := range g.pending {
		claims, consumers, miss, bad := podClaims(snap, p, g)
		missing = append(missing, miss...)
		unusable = append(unusable, bad...)
		gang.Pods = append(gang.Pods, solver.Pod{Pod: p, Claims: claims, Consumers: consumers})
		req := snapshot.PodRequests(p)
		est[v1alpha1.ResourceCPU] += req.Cpu().AsApproximateFloat64()
		est[v1alpha1.ResourceMemory] += req.Memory().AsApproximateFloat64()
		for _, n := range snap.ExtendedResources(req) {
			est[v1alpha1.ResourceGPU] += float64(n)
		}
		for _, c := range claims {
			if c.Status.Allocation != nil {
				continue
			}
			for _, r := range c.Spec.Devices.Requests {
				if r.Exactly != nil {
					est[v1alpha1.ResourceGPU] += float64(max(1, r.Exactly.Count))
				} else if len(r.FirstAvailable) > 0 {
					est[v1alpha1.ResourceGPU] += float64(max(1, r.FirstAvailable[0].Count))
				}
			}
		}
	}
	if len(unusable) > 0 {
		// As the kube-scheduler: such a pod waits until its claim is
		// usable (recreated, or the pod replaced); placing the rest of
		// the gang without it would break all-or-nothing.
		sort.Strings(unusable)
		g.reason, g.message = v1alpha1.ReasonWaitingForClaims, fmt.Sprintf("%d ResourceClaims cannot be used by their pods: %v", len(unusable), truncate(unusable, 5))
		return false
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		g.reason, g.message = v1alpha1.ReasonWaitingForClaims, fmt.Sprintf("%d ResourceClaims do not exist yet: %v", len(missing), truncate(missing, 5))
		return false
	}
	g.gang, g.estimate = gang, est
	return true
}

// oldestPod is when the gang's oldest live pod was created.
func oldestPod(g *gangState) time.Time {
	var t time.Time
	for _, list := range [][]*v1.Pod{g.pending, g.bound} {
		for _, p := range list {
			if c := p.CreationTimestamp.Time; t.IsZero() || c.Before(t) {
				t = c
			}
		}
	}
	return t
}

// podClaims resolves a pod's claims: by name, or for claims from templates through the
// pod's status (the resource claim controller writes the generated name there), or, for a
// claim its upstream PodGroup defines (DRAWorkloadResourceClaims), through the PodGroup's
// status — such a claim is reserved for the PodGroup, not the pod.
//
// unusable says why an existing claim cannot be used by the pod, as the kube-scheduler's
// PreFilter refuses it: the claim is being deleted, or the pod's template claim (its name from
// the pod's status) is another pod's — generated for it, owned by it. A claim a pod names
// by resourceClaimName may be shared with other pods (the API allows it): such a pod joins
// the claim's reservation on the claim's node, and is not refused here.
func podClaims(snap *snapshot.Snapshot, pod *v1.Pod, g *gangState) (out []*resourceapi.ResourceClaim, consumers map[types.UID]resourceapi.ResourceClaimConsumerReference, missing, unusable []string) {
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		name := ""
		var consumer *resourceapi.ResourceClaimConsumerReference
		if g.Upstream != nil {
			if ref, err := resourceclaim.BindTo(pod, g.Upstream, pc); err == nil && ref.Resource == "podgroups" {
				consumer = &ref
				for _, pgc := range g.Upstream.Spec.ResourceClaims {
					if pgc.Name == pc.Name {
						if n, _, err := resourceclaim.NameFromPodGroup(g.Upstream, &pgc); err == nil && n != nil {
							name = *n
						}
					}
				}
			}
		}
		if name == "" {
			if pc.ResourceClaimName != nil {
				name = *pc.ResourceClaimName
			} else {
				for _, st := range pod.Status.ResourceClaimStatuses {
					if st.Name == pc.Name && st.ResourceClaimName != nil {
						name = *st.ResourceClaimName
					}
				}
			}
		}
		var c *resourceapi.ResourceClaim
		if name != "" {
			c = snap.Claim(pod.Namespace, name)
		}
		if c == nil {
			missing = append(missing, pod.Namespace+"/"+pod.Name+":"+pc.Name)
			continue
		}
		if c.DeletionTimestamp != nil {
			unusable = append(unusable, fmt.Sprintf("ResourceClaim %s/%s of pod %s is being deleted", c.Namespace, c.Name, pod.Name))
			continue
		}
		if consumer == nil && pc.ResourceClaimName == nil {
			if err := resourceclaim.IsForPod(pod, c, g.Upstream != nil); err != nil {
				unusable = append(unusable, err.Error())
				continue
			}
		}
		if consumer != nil {
			if consumers == nil {
				consumers = map[types.UID]resourceapi.ResourceClaimConsumerReference{}
			}
			consumers[c.UID] = *consumer
		}
		out = append(out, c)
	}
	return out, consumers, missing, unusable
}

// addPodUsage adds to u what a bound pod holds: its requests and, once per claim, its
// claims' GPU units. It adds into u rather than returning a Usage of the pod's own, and
// reads what the snapshot keeps of unchanged pods and claims: every cycle charges every
// bound pod, and under churn that was most of a cycle's cost (docs/benchmarks.md).
func addPodUsage(u quota.Usage, snap *snapshot.Snapshot, p *v1.Pod, counted map[types.UID]bool) {
	cpu, memory := snap.RequestedCPUMemory(p)
	u[v1alpha1.ResourceCPU] += cpu
	u[v1alpha1.ResourceMemory] += memory
	u[v1alpha1.ResourceGPU] += podGPUUnits(snap, p, counted)
}

// podGPUUnits is the GPU units of a bound pod's claims not counted yet (addPodUsage without
// the requests, for where only GPUs matter).
func podGPUUnits(snap *snapshot.Snapshot, p *v1.Pod, counted map[types.UID]bool) float64 {
	units := 0.0
	add := func(c *resourceapi.ResourceClaim) {
		if c == nil || counted[c.UID] || c.Status.Allocation == nil {
			return
		}
		counted[c.UID] = true
		units += snap.ClaimUnits(c)
	}
	for _, pc := range p.Spec.ResourceClaims {
		name := ""
		if pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.Name == pc.Name && st.ResourceClaimName != nil {
				name = *st.ResourceClaimName
			}
		}
		if name != "" {
			add(snap.Claim(p.Namespace, name))
		}
	}
	if st := p.Status.ExtendedResourceClaimStatus; st != nil {
		add(snap.Claim(p.Namespace, st.ResourceClaimName))
	}
	return units
}
