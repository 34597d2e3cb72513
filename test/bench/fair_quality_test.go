package bench

import (
	"context"
	"fmt"
	"testing"

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
	// with a required topology spread over more than one domain, a device allocated twice.
	partialGangs, topologyViolations, doubleAllocations int
}

func (q quality) String() string {
	return fmt.Sprintf("%d nodes used, %d free GPUs on partly used nodes, largest gang of 8-GPU pods that fits %d; violations: %d partial gangs, %d topology, %d double allocations",
		q.nodesUsed, q.fragmented, q.fitsGang8, q.partialGangs, q.topologyViolations, q.doubleAllocations)
}

// measureQuality reads the claims and pods of namespace ns on nodes nodes × 8 GPUs; rack
// is the node label of the required topology domain of gangs that have one ("" none).
func measureQuality(ctx context.Context, b *testing.B, kube kubernetes.Interface, ns string, nodes int, rack string) quality {
	b.Helper()
	var q quality
	claims, err := kube.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	used := map[string]map[int]bool{} // node → GPU index → something allocated on it
	seen := map[string]bool{}
	for _, c := range claims.Items {
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
	for _, p := range pods.Items {
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
