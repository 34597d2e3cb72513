package decide

import (
	"context"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/quota"
)

// ReasonReclaimed is the Event reason on a gang evicted to give a queue back its quota;
// ReasonReclaiming the one on the gang it is evicted for.
const (
	ReasonReclaimed  = "Reclaimed"
	ReasonReclaiming = "Reclaiming"
)

// reclaim gives a queue its fair share back. g does not fit although its queue would stay
// within its fair share (quota first, then its weighted part of what its parent deserves;
// quota.ComputeFairShare) with it — or within its quota. Victims are running, preemptible
// gangs of other queues whose branch is above its fair share, compared level by level: at
// the level where the two queues' paths part (the children of their nearest common ancestor,
// or the roots), the victim's branch must hold more than its fair share and the reclaimer's
// branch must stay within its own with g. The branch most above its share (on the dominant
// resource among those g needs) gives first, its newest gang first, the pods above minMember
// of an elastic gang before its core pods; no branch is taken below its fair share. Victims
// are evicted only once a simulation on the cluster without them shows that g then fits.
func reclaim(ctx context.Context, cfg Config, in Input, d *Decisions, mem *Memory, gangs []*gangState, tree *quota.Tree, g *gangState) bool {
	logger := klog.FromContext(ctx)
	base := in.Snapshot // for the victims' usage: their claims are as the cycle found them
	mine := tree.Get(g.pg.Spec.Queue)
	if mine == nil {
		return false
	}
	var rs []string // the resources g needs; GPU first
	for _, r := range quota.Resources {
		if g.estimate[r] > 0 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return false
	}
	type victim struct {
		victimUnit
		branch *quota.Node // the victim's queue's ancestor at the level where the paths part
		over   float64
	}
	var victims []victim
	for _, b := range gangs {
		if b == g || b.pg == nil || len(b.Bound) == 0 || b.pg.Spec.Queue == "" || b.pg.Spec.Queue == g.pg.Spec.Queue || !preemptible(in, b) {
			continue
		}
		n := tree.Get(b.pg.Spec.Queue)
		if n == nil {
			continue
		}
		theirs, ours := parting(n, mine)
		if theirs == nil || ours == nil {
			continue // b's queue is an ancestor or descendant of g's
		}
		// Ours must stay within its fair share with g (or within its quota: quota is a
		// guarantee even when quotas promise more than the cluster has).
		if !pathWithinShare(mine, ours, g.estimate, rs) && tree.RankOf(g.pg.Spec.Queue, g.estimate).Borrowing {
			continue
		}
		over := theirs.Saturation(rs)
		if over <= 1+1e-9 {
			continue
		}
		for _, u := range units(base, b) {
			victims = append(victims, victim{victimUnit: u, branch: theirs, over: over})
		}
	}
	if len(victims) == 0 {
		return false
	}
	sort.SliceStable(victims, func(i, j int) bool {
		a, b := victims[i], victims[j]
		if a.over != b.over {
			return a.over > b.over
		}
		if a.extra != b.extra {
			return a.extra
		}
		ti, tj := a.g.pg.CreationTimestamp, b.g.pg.CreationTimestamp
		if !ti.Equal(&tj) {
			return tj.Before(&ti)
		}
		// Timestamps have a resolution of one second; names keep the order deterministic.
		return a.g.Key > b.g.Key
	})
	// Take victims while their branch stays at or above its fair share; simulate after each.
	released := map[*quota.Node]quota.Usage{}
	evict := map[types.UID]bool{}
	var chosen []victimUnit
	tries := 0
	hasExtra := map[*gangState]bool{}
	for _, v := range victims {
		hasExtra[v.g] = hasExtra[v.g] || v.extra
	}
	for _, v := range victims {
		if !v.extra && hasExtra[v.g] && !containsUnit(chosen, victimUnit{g: v.g, extra: true}) {
			continue // never core pods while the gang's extra pods run
		}
		rel := released[v.branch]
		if rel == nil {
			rel = quota.Usage{}
			released[v.branch] = rel
		}
		if !staysAtShare(v.branch, rel, v.usage, rs) {
			continue
		}
		rel.Add(v.usage)
		chosen = append(chosen, v.victimUnit)
		for _, p := range v.pods {
			evict[p.UID] = true
		}
		if tries++; tries > cfg.MaxReclaimTries {
			break
		}
		snap := simulate(in, d, RuleReclaim, evict)
		res, err := cfg.Solver.Solve(ctx, snap, g.gang)
		if err != nil {
			continue
		}
		names := make([]string, 0, len(chosen))
		for _, c := range chosen {
			what := c.g.Key
			if c.extra {
				what = fmt.Sprintf("%d pods above minMember of %s", len(c.pods), c.g.Key)
			}
			names = append(names, what)
		}
		logger.Info("Reclaiming fair share: evicting gangs of queues above theirs", "podGroup", g.Key, "queue", g.pg.Spec.Queue, "victims", names)
		d.Events = append(d.Events, Event{Object: g.PodGroup, Type: v1.EventTypeNormal, Reason: ReasonReclaiming,
			Message: fmt.Sprintf("queue %q is below its fair share: evicting %d gangs of queues above theirs (%s)", g.pg.Spec.Queue, len(chosen), strings.Join(names, ", "))})
		for _, c := range chosen {
			msg := fmt.Sprintf("evicted: queue %q is above its fair share and queue %q needs its share back for gang %s", c.g.pg.Spec.Queue, g.pg.Spec.Queue, g.Key)
			if c.extra {
				msg = fmt.Sprintf("%d pods above minMember %s", len(c.pods), msg)
			}
			d.Events = append(d.Events, Event{Object: c.g.PodGroup, Type: v1.EventTypeWarning, Reason: ReasonReclaimed, Message: msg})
			for _, p := range c.pods {
				mem.evicting[p.UID] = in.Now
				d.Evictions = append(d.Evictions, p)
			}
		}
		reserve(mem, g.Key, placementNodes(res), ReasonReclaiming, in.Now)
		return true
	}
	logger.V(2).Info("Reclaim would not make the gang fit", "podGroup", g.Key, "candidates", len(victims))
	return false
}

// parting returns the ancestors of a and b (themselves included) that are siblings: children
// of their nearest common ancestor, or roots. Nil when one is the other's ancestor.
func parting(a, b *quota.Node) (*quota.Node, *quota.Node) {
	pa, pb := a.Path(), b.Path() // leaf first
	onB := map[*quota.Node]bool{}
	for _, n := range pb {
		onB[n] = true
	}
	for i, n := range pa {
		if !onB[n] {
			continue
		}
		// n is the nearest common ancestor.
		if i == 0 {
			return nil, nil
		}
		for j, m := range pb {
			if m == n {
				if j == 0 {
					return nil, nil
				}
				return pa[i-1], pb[j-1]
			}
		}
	}
	return pa[len(pa)-1], pb[len(pb)-1] // different roots
}

// withinShare: the branch with u added holds no more than its fair share of any resource in rs.
func withinShare(n *quota.Node, u quota.Usage, rs []string) bool {
	for _, r := range rs {
		if n.Allocated[r]+u[r] > n.FairShare[r]+1e-9 {
			return false
		}
	}
	return true
}

// pathWithinShare: withinShare for the queue and each ancestor up to (and with) top.
func pathWithinShare(leaf, top *quota.Node, u quota.Usage, rs []string) bool {
	for _, a := range leaf.Path() {
		if !withinShare(a, u, rs) {
			return false
		}
		if a == top {
			break
		}
	}
	return true
}

// staysAtShare: after releasing released and u, the branch still holds at least its fair
// share of the dominant resource among rs (the first of rs it is above its share of).
func staysAtShare(n *quota.Node, released, u quota.Usage, rs []string) bool {
	for _, r := range rs {
		if n.Allocated[r] > n.FairShare[r]+1e-9 {
			return n.Allocated[r]-released[r]-u[r] >= n.FairShare[r]-1e-9
		}
	}
	return false
}
