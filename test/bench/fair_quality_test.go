package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// quality is where a run left the cluster, next to how fast it got there.
type quality struct {
	nodesUsed int // nodes with at least one GPU (or part of one) allocated
	// fragmented is the free GPUs on partly used nodes: GPUs a whole-node request cannot use.
	fragmented int
	// fitsGang8 is the largest gang of 8-GPU pods that still fits: the nodes with all 8
	// GPUs free (a GPU with any MIG device allocated is not free).
	fitsGang8 int
	// Violations, each must be 0: a gang with some but not all of its pods bound, a gang
	// with a required topology spread over more than one domain, a device allocated twice,
	// an init pod (placed before the measured scheduler started) gone, unbound or with its
	// claim no longer allocated and reserved for it.
	partialGangs, topologyViolations, doubleAllocations, initDisturbed int
	// disturbed names the init pods counted in initDisturbed, and what happened to each.
	disturbed []string
}

func (q quality) String() string {
	return fmt.Sprintf("%d nodes used, %d free GPUs on partly used nodes, largest gang of 8-GPU pods that fits %d; violations: %d partial gangs, %d topology, %d double allocations, %d init pods disturbed",
		q.nodesUsed, q.fragmented, q.fitsGang8, q.partialGangs, q.topologyViolations, q.doubleAllocations, q.initDisturbed)
}

// measureQuality reads the claims and pods of namespace ns on nodes nodes × 8 GPUs; rack
// is the node label of the required topology domain of gangs that have one ("" none);
// initPods is how many init pods were created and bound before the measured run, which
// must all still be there, bound, with their claims (0: not checked; the churn scenario
// ends them).
func measureQuality(ctx context.Context, b *testing.B, kube kubernetes.Interface, ns string, nodes int, rack string, initPods int) quality {
	b.Helper()
	var q quality
	claims, err := kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	used := map[string]map[int]bool{} // node → GPU index → something allocated on it
	seen := map[string]bool{}
	claimOf := map[string]*resourceapi.ResourceClaim{} // name in ns → claim (each pod's claim has its name)
	for i, c := range claims.Items {
		if c.Namespace == ns {
			claimOf[c.Name] = &claims.Items[i]
		}
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			id := r.Pool + "/" + r.Device
			if seen[id] {
				q.doubleAllocations++
			}
			seen[id] = true
			var gpu int
			// Device names are gpu-<index> (whole) and gpu-<index>-mig-<profile>-<start>.
			if _, err := fmt.Sscanf(r.Device, "gpu-%d", &gpu); err != nil {
				b.Fatalf("device %s of claim %s/%s: not a benchmark GPU name", r.Device, c.Namespace, c.Name)
			}
			if used[r.Pool] == nil {
				used[r.Pool] = map[int]bool{}
			}
			used[r.Pool][gpu] = true
		}
	}
	for i := 0; i < nodes; i++ {
		n := len(used[nodeName(i)])
		switch {
		case n == 0:
			q.fitsGang8++
		default:
			q.nodesUsed++
			q.fragmented += 8 - n
		}
	}

	// Gangs: all or nothing, and inside one domain of rack when they have to be.
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	nodeList, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	domain := map[string]string{}
	for _, n := range nodeList.Items {
		domain[n.Name] = n.Labels[rack]
	}
	type gangState struct {
		pods, bound int
		domains     map[string]bool
	}
	byGang := map[string]*gangState{}
	initSeen := 0
	for _, p := range pods.Items {
		if initPods > 0 && p.Labels[phaseLabel] == "init" {
			initSeen++
			c := claimOf[p.Name]
			switch {
			case p.Spec.NodeName == "":
				q.disturbed = append(q.disturbed, p.Name+": unbound")
			case c == nil:
				q.disturbed = append(q.disturbed, p.Name+": its claim is gone")
			case c.Status.Allocation == nil:
				q.disturbed = append(q.disturbed, p.Name+": its claim is not allocated")
			case !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }):
				q.disturbed = append(q.disturbed, p.Name+": its claim is not reserved for it")
			}
		}
		g := p.Labels[gangLabel]
		if g == "" || p.Labels[phaseLabel] != "batch" {
			continue
		}
		s := byGang[g]
		if s == nil {
			s = &gangState{domains: map[string]bool{}}
			byGang[g] = s
		}
		s.pods++
		if p.Spec.NodeName != "" {
			s.bound++
			s.domains[domain[p.Spec.NodeName]] = true
		}
	}
	q.initDisturbed = len(q.disturbed)
	if initSeen < initPods {
		q.initDisturbed += initPods - initSeen
		q.disturbed = append(q.disturbed, fmt.Sprintf("%d of %d init pods are gone", initPods-initSeen, initPods))
	}
	for _, s := range byGang {
		if s.bound > 0 && s.bound < s.pods {
			q.partialGangs++
		}
		if rack != "" && len(s.domains) > 1 {
			q.topologyViolations++
		}
	}
	return q
}
