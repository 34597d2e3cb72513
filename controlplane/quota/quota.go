// Package quota keeps the hierarchical Queue tree of one scheduling cycle: what each queue
// (with its descendants) holds, whether a gang may be admitted without any queue on its path
// exceeding its limit, and in which order queues get to place their next gang (under quota
// first, then borrowers by over-quota usage per weight).
package quota

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// Resources accounted for: GPU units (contract.DeviceUnits), CPU cores, memory bytes.
var Resources = []string{v1alpha1.ResourceGPU, v1alpha1.ResourceCPU, v1alpha1.ResourceMemory}

// Usage is an amount per resource.
type Usage map[string]float64

// Add adds o to u.
func (u Usage) Add(o Usage) {
	for k, v := range o {
		u[k] += v
	}
}

func (u Usage) String() string {
	parts := make([]string, 0, len(u))
	for _, r := range Resources {
		if v, ok := u[r]; ok {
			parts = append(parts, fmt.Sprintf("%s=%s", r, format(r, v)))
		}
	}
	return strings.Join(parts, ",")
}

func format(r string, v float64) string {
	if r == v1alpha1.ResourceMemory {
		return resource.NewQuantity(int64(v), resource.BinarySI).String()
	}
	return fmt.Sprintf("%g", math.Round(v*1000)/1000)
}

type limits struct {
	quota, limit map[string]float64 // absent: none
	weight       map[string]float64
}

// Node is one queue in the tree.
type Node struct {
	Queue    *v1alpha1.Queue
	Parent   *Node
	Children []*Node
	// Allocated is what bound and assumed pods of the queue and its descendants hold.
	Allocated Usage
	// Requested is Allocated plus the demand of waiting gangs.
	Requested Usage
	// Invalid is set when the queue cannot admit: a parent loop or a missing parent.
	Invalid       string
	InvalidReason string
	// FairShare is what the queue deserves now (ComputeFairShare).
	FairShare Usage
	lim       limits
	effWeight map[string]float64
	// past is the queue's past usage (fractions of capacity; ComputeFairShare).
	past Usage
}

// Tree is the queue hierarchy of one cycle.
type Tree struct {
	nodes map[string]*Node
}

// Build makes the tree. Queues in a parent loop or below a missing parent are marked invalid
// with a reason (CRD validation cannot see other objects, so loops are found here).
func Build(queues []*v1alpha1.Queue) *Tree {
	t := &Tree{nodes: make(map[string]*Node, len(queues))}
	for _, q := range queues {
		t.nodes[q.Name] = &Node{Queue: q, Allocated: Usage{}, Requested: Usage{}, FairShare: Usage{}, lim: limitsOf(q)}
	}
	for _, n := range t.nodes {
		if p := n.Queue.Spec.Parent; p != "" {
			if parent, ok := t.nodes[p]; ok {
				n.Parent = parent
				parent.Children = append(parent.Children, n)
			}
		}
	}
	for name, n := range t.nodes {
		seen := map[string]bool{name: true}
		path := []string{name}
		for cur := n; cur.Queue.Spec.Parent != ""; cur = cur.Parent {
			p := cur.Queue.Spec.Parent
			if cur.Parent == nil {
				n.Invalid, n.InvalidReason = fmt.Sprintf("parent queue %q of %q does not exist", p, cur.Queue.Name), v1alpha1.ReasonParentNotFound
				break
			}
			path = append(path, p)
			if seen[p] {
				n.Invalid, n.InvalidReason = "parent loop: "+strings.Join(path, " -> "), v1alpha1.ReasonParentLoop
				break
			}
			seen[p] = true
		}
	}
	return t
}

func limitsOf(q *v1alpha1.Queue) limits {
	l := limits{quota: map[string]float64{}, limit: map[string]float64{}, weight: map[string]float64{}}
	set := func(name string, rq *v1alpha1.ResourceQuota) {
		l.weight[name] = 1
		if rq == nil {
			return
		}
		scale := func(q resource.Quantity) float64 {
			return q.AsApproximateFloat64()
		}
		if rq.Quota != nil {
			l.quota[name] = scale(*rq.Quota)
		}
		if rq.Limit != nil {
			l.limit[name] = scale(*rq.Limit)
		}
		if rq.OverQuotaWeight != nil {
			l.weight[name] = float64(*rq.OverQuotaWeight)
		}
	}
	set(v1alpha1.ResourceGPU, q.Spec.Resources.GPU)
	set(v1alpha1.ResourceCPU, q.Spec.Resources.CPU)
	set(v1alpha1.ResourceMemory, q.Spec.Resources.Memory)
	return l
}

// Get returns the queue's node, or nil.
func (t *Tree) Get(name string) *Node { return t.nodes[name] }

// Nodes returns all queues sorted by name.
func (t *Tree) Nodes() []*Node {
	out := make([]*Node, 0, len(t.nodes))
	for _, n := range t.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue.Name < out[j].Queue.Name })
	return out
}

// path returns the queue and its ancestors (stops at a loop).
func (n *Node) path() []*Node {
	var out []*Node
	seen := map[*Node]bool{}
	for cur := n; cur != nil && !seen[cur]; cur = cur.Parent {
		seen[cur] = true
		out = append(out, cur)
	}
	return out
}

// Charge adds usage to the queue and all its ancestors.
func (t *Tree) Charge(queue string, u Usage) {
	if n := t.nodes[queue]; n != nil {
		for _, a := range n.path() {
			a.Allocated.Add(u)
		}
	}
}

// Demand adds waiting demand to the queue and its ancestors (for status.requested).
func (t *Tree) Demand(queue string, u Usage) {
	if n := t.nodes[queue]; n != nil {
		for _, a := range n.path() {
			a.Requested.Add(u)
		}
	}
}

// Admit checks that adding u to the queue keeps it and every ancestor within its limit, and
// that a queue borrowing beyond its quota is allowed to (over-quota weight above 0). The
// reason says which queue and resource stopped the gang, in numbers.
func (t *Tree) Admit(queue string, u Usage) (bool, string) {
	n := t.nodes[queue]
	if n == nil {
		return false, fmt.Sprintf("queue %q does not exist", queue)
	}
	if n.Invalid != "" {
		return false, fmt.Sprintf("queue %q is invalid: %s", queue, n.Invalid)
	}
	for _, a := range n.path() {
		for _, r := range Resources {
			need := u[r]
			if need == 0 {
				continue
			}
			after := a.Allocated[r] + need
			if lim, ok := a.lim.limit[r]; ok && after > lim+1e-9 {
				return false, fmt.Sprintf("queue %q would use %s of %s, above its limit %s (allocated %s, gang needs %s)",
					a.Queue.Name, format(r, after), r, format(r, lim), format(r, a.Allocated[r]), format(r, need))
			}
			if q, ok := a.lim.quota[r]; ok && after > q+1e-9 && a.lim.weight[r] == 0 {
				return false, fmt.Sprintf("queue %q would use %s of %s, above its quota %s, and its overQuotaWeight is 0 (allocated %s, gang needs %s)",
					a.Queue.Name, format(r, after), r, format(r, q), format(r, a.Allocated[r]), format(r, need))
			}
		}
	}
	return true, ""
}

// Rank orders queues for their next gang; lower ranks go first. A gang that keeps the queue
// and its ancestors within quota (for every resource with a quota) comes before any borrower,
// the least-served queue (allocated/quota) first; borrowers are ordered by the over-quota
// usage per weight of their leaf queue, so idle capacity is shared in proportion to
// overQuotaWeight. Priority of the queue breaks ties.
type Rank struct {
	Borrowing bool
	Share     float64
	// Past is the leaf's past usage of the resource that ranks it (fraction of capacity):
	// between equal shares, the queue that used less recently goes first, so that two
	// queues that each want the whole cluster take turns instead of the first by name
	// keeping it.
	Past     float64
	Priority int32
}

// Less orders ranks.
func (r Rank) Less(o Rank) bool {
	if r.Borrowing != o.Borrowing {
		return !r.Borrowing
	}
	if r.Share != o.Share {
		return r.Share < o.Share
	}
	if r.Past != o.Past {
		return r.Past < o.Past
	}
	return r.Priority > o.Priority
}

// RankOf ranks the queue for a gang needing u.
func (t *Tree) RankOf(queue string, u Usage) Rank {
	n := t.nodes[queue]
	if n == nil {
		return Rank{Borrowing: true, Share: math.Inf(1)}
	}
	rank := Rank{Priority: n.Queue.Spec.Priority}
	for _, a := range n.path() {
		for r, q := range a.lim.quota {
			if a.Allocated[r]+u[r] > q+1e-9 {
				rank.Borrowing = true
			}
		}
		// A queue without a GPU quota guarantees no GPUs: every GPU it uses is borrowed.
		// (CPU and memory count only where a quota is set.)
		if _, ok := a.lim.quota[v1alpha1.ResourceGPU]; !ok && u[v1alpha1.ResourceGPU] > 0 {
			rank.Borrowing = true
		}
	}
	if !rank.Borrowing {
		// Dominant share of the leaf against its quota.
		for r, q := range n.lim.quota {
			if q > 0 {
				rank.Share = max(rank.Share, n.Allocated[r]/q)
			}
		}
		return rank
	}
	// GPUs decide borrowing order when the gang uses them; else the dominant resource.
	for _, r := range Resources {
		if u[r] == 0 {
			continue
		}
		// The weight as past usage leaves it (ComputeFairShare; the configured weight
		// without usage history).
		w := n.EffectiveWeight(r)
		over := n.Allocated[r] - n.lim.quota[r]
		share := math.Inf(1)
		if w > 0 {
			// Absolute units per weight: idle units are shared in proportion to weight.
			share = over / w
		}
		if r == v1alpha1.ResourceGPU {
			rank.Share, rank.Past = share, n.past[r]
			return rank
		}
		if share >= rank.Share {
			rank.Share, rank.Past = share, n.past[r]
		}
	}
	return rank
}
