package quota

import (
	"math"
	"sort"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

// FairShareConfig is what fair shares are computed from besides the tree.
type FairShareConfig struct {
	// Capacity of the cluster per resource (GPU units, CPU cores, memory bytes): what the
	// root queues share.
	Capacity Usage
	// Usage is each queue's past usage (by name): per resource a decayed average of what it
	// held, as a fraction of Capacity (QueueUsage). Missing queues have none.
	Usage map[string]Usage
	// K says how much past usage lowers a queue's over-quota share (like KAI Scheduler's
	// kValue): a queue's normalised weight ŵ among the siblings that want more becomes
	// max(0, ŵ + K·(ŵ − u)), where u is its past usage as a fraction of its parent's fair
	// share. 0 ignores usage; with K = 2 a queue that has held 1.5 times its weighted share
	// gets no over-quota share until the others have caught up.
	K float64
}

// ComputeFairShare sets every queue's FairShare, level by level from the roots: each queue of
// a level first gets its quota as far as it wants it (its demand: allocated plus what its
// waiting gangs need, never above its limit), then the rest of the parent's share is divided
// among the siblings that want more in proportion to their effective over-quota weight (their
// weight lowered by past usage), each up to its demand; what is left after that (every queue
// with weight left wants no more) goes by plain weight to queues still wanting, so that no
// capacity is held back. Each resource is divided on its own; reclaim compares queues on the
// dominant one. Queues that cannot admit (loops, missing parents) get nothing.
func (t *Tree) ComputeFairShare(cfg FairShareConfig) {
	var roots []*Node
	for _, n := range t.Nodes() {
		n.FairShare = Usage{}
		n.effWeight = map[string]float64{}
		n.past = cfg.Usage[n.Queue.Name]
		if n.Parent == nil && n.Invalid == "" {
			roots = append(roots, n)
		}
	}
	for _, r := range Resources {
		divide(roots, r, cfg.Capacity[r], cfg)
	}
}

// divide gives siblings their fair share of avail for resource r, then recurses.
func divide(kids []*Node, r string, avail float64, cfg FairShareConfig) {
	if len(kids) == 0 {
		return
	}
	type claim struct {
		n          *Node
		give, want float64
	}
	cs := make([]*claim, 0, len(kids))
	sumQuota := 0.0
	for _, n := range kids {
		if n.Invalid != "" {
			continue
		}
		want := n.Allocated[r] + n.Requested[r]
		if lim, ok := n.lim.limit[r]; ok {
			want = math.Min(want, lim)
		}
		c := &claim{n: n, want: want, give: math.Min(n.lim.quota[r], want)}
		sumQuota += c.give
		cs = append(cs, c)
	}
	if sumQuota > avail && sumQuota > 0 {
		// Quotas promise more than there is: each gets its quota's proportion.
		for _, c := range cs {
			c.give *= avail / sumQuota
		}
	}
	rest := math.Max(0, avail-math.Min(sumQuota, avail))
	// Effective weights of the siblings that want more.
	wantMore := func(c *claim) bool { return c.want > c.give+eps && c.n.lim.weight[r] > 0 }
	sumW := 0.0
	for _, c := range cs {
		if wantMore(c) {
			sumW += c.n.lim.weight[r]
		}
	}
	eff := map[*claim]float64{}
	for _, c := range cs {
		w := c.n.lim.weight[r]
		if !wantMore(c) || sumW == 0 {
			c.n.effWeight[r] = w
			continue
		}
		norm := w / sumW
		u := cfg.Usage[c.n.Queue.Name][r]
		if avail > 0 && cfg.Capacity[r] > 0 {
			u = u * cfg.Capacity[r] / avail // usage as a fraction of what the parent shares
		}
		e := math.Max(0, norm+cfg.K*(norm-u))
		eff[c] = e
		// On the scale of the raw weights (K = 0 gives back the weight itself).
		c.n.effWeight[r] = e * sumW
	}
	rest = fill(cs, rest, func(c *claim) float64 {
		if !wantMore(c) {
			return 0
		}
		return eff[c]
	}, func(c *claim) (*float64, float64) { return &c.give, c.want })
	// Work conservation: whatever the effective weights left goes by plain weight.
	fill(cs, rest, func(c *claim) float64 {
		if !wantMore(c) {
			return 0
		}
		return c.n.lim.weight[r]
	}, func(c *claim) (*float64, float64) { return &c.give, c.want })
	for _, c := range cs {
		c.n.FairShare[r] = c.give
		divide(c.n.Children, r, c.give, cfg)
	}
}

// fill water-fills rest over the claims in proportion to weight, each up to its want, and
// returns what is left.
func fill[C any](cs []C, rest float64, weight func(C) float64, slot func(C) (*float64, float64)) float64 {
	active := make([]C, 0, len(cs))
	for _, c := range cs {
		if g, w := slot(c); weight(c) > 0 && w > *g+eps {
			active = append(active, c)
		}
	}
	for rest > eps && len(active) > 0 {
		total := 0.0
		for _, c := range active {
			total += weight(c)
		}
		next := active[:0:0]
		given := 0.0
		for _, c := range active {
			g, want := slot(c)
			share := rest * weight(c) / total
			if *g+share >= want-eps {
				given += want - *g
				*g = want
				continue
			}
			next = append(next, c)
		}
		if len(next) == len(active) {
			// Nobody reached its want: everyone takes its share and nothing is left.
			for _, c := range active {
				g, _ := slot(c)
				*g += rest * weight(c) / total
			}
			return 0
		}
		rest -= given
		active = next
	}
	return math.Max(0, rest)
}

const eps = 1e-9

// EffectiveWeight is the queue's over-quota weight for r after past usage (on the scale of
// its configured weight), as the last ComputeFairShare found it.
func (n *Node) EffectiveWeight(r string) float64 {
	if w, ok := n.effWeight[r]; ok {
		return w
	}
	return n.lim.weight[r]
}

// Quota is the queue's quota for r (0 when it sets none) and whether it sets one.
func (n *Node) Quota(r string) (float64, bool) {
	q, ok := n.lim.quota[r]
	return q, ok
}

// Path returns the queue and its ancestors, leaf first.
func (n *Node) Path() []*Node { return n.path() }

// Saturation is how far the queue is into its fair share on its dominant resource among rs:
// the largest allocated/fairShare (+Inf when it holds some of a resource it deserves none of).
func (n *Node) Saturation(rs []string) float64 {
	s := 0.0
	for _, r := range rs {
		a, f := n.Allocated[r], n.FairShare[r]
		switch {
		case a <= eps:
		case f <= eps:
			return math.Inf(1)
		default:
			s = math.Max(s, a/f)
		}
	}
	return s
}

// Siblings returns the queues that share the node's parent (the roots for a root), sorted
// by name, the node included.
func (t *Tree) Siblings(n *Node) []*Node {
	if n.Parent != nil {
		out := append([]*Node(nil), n.Parent.Children...)
		sort.Slice(out, func(i, j int) bool { return out[i].Queue.Name < out[j].Queue.Name })
		return out
	}
	var out []*Node
	for _, m := range t.Nodes() {
		if m.Parent == nil {
			out = append(out, m)
		}
	}
	return out
}

// AdmitWithinQuota is Admit for a gang that must not borrow (a non-preemptible gang): the
// queue and every ancestor must stay within their quota for each resource the gang uses (a
// queue without a GPU quota has none to run it on).
func (t *Tree) AdmitWithinQuota(queue string, u Usage) (bool, string) {
	if ok, why := t.Admit(queue, u); !ok {
		return ok, why
	}
	for _, a := range t.nodes[queue].path() {
		for _, r := range Resources {
			need := u[r]
			if need == 0 {
				continue
			}
			q, ok := a.lim.quota[r]
			if !ok && r != v1alpha1.ResourceGPU {
				continue // CPU and memory without a quota are not borrowed
			}
			if after := a.Allocated[r] + need; after > q+1e-9 {
				return false, "non-preemptible gang would borrow: " + quotaMessage(a.Queue.Name, r, after, q, a.Allocated[r], need)
			}
		}
	}
	return true, ""
}

func quotaMessage(queue, r string, after, q, allocated, need float64) string {
	return "queue \"" + queue + "\" would use " + format(r, after) + " of " + r + ", above its quota " + format(r, q) +
		" (allocated " + format(r, allocated) + ", gang needs " + format(r, need) + ")"
}
