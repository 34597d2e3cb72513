package decide

import (
	"context"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// ReasonPreempted is the Event reason on a gang evicted for a gang of higher priority of its
// queue; ReasonPreempting the one on the gang it is evicted for.
const (
	ReasonPreempted  = "Preempted"
	ReasonPreempting = "Preempting"
)

// preemptible reports whether a gang may be evicted for another one. Preemptibility is apart
// from priority (as KAI Scheduler keeps them): the PodGroup's spec.preemptible wins, else the
// label scheduling.tessera.dev/preemptible=false on the PriorityClass of any of its pods makes
// it non-preemptible.
func preemptible(in Input, g *gangState) bool {
	if g.pg != nil && g.pg.Spec.Preemptible != nil {
		return *g.pg.Spec.Preemptible
	}
	for _, list := range [][]*v1.Pod{g.Pending, g.Bound} {
		for _, p := range list {
			if pc := in.PriorityClasses[p.Spec.PriorityClassName]; p.Spec.PriorityClassName != "" && pc != nil && pc.Labels[v1alpha1.PreemptibleLabel] == "false" {
				return false
			}
		}
	}
	return true
}

// neverPreempts: a gang whose pods (their PriorityClass's preemptionPolicy, which admission
// copies into the pod) or whose upstream PodGroup say preemptionPolicy Never evicts nobody:
// neither by priority nor to reclaim its quota.
func neverPreempts(g *gangState) bool {
	if g.Upstream != nil && g.Upstream.Spec.PreemptionPolicy != nil && *g.Upstream.Spec.PreemptionPolicy == schedulingv1beta1.PreemptNever {
		return true
	}
	for _, p := range g.Pending {
		if p.Spec.PreemptionPolicy != nil && *p.Spec.PreemptionPolicy == v1.PreemptNever {
			return true
		}
	}
	return false
}

// victimUnit is a set of pods evicted together: a whole gang, or the pods of an elastic
// gang above its minMember (they go before any of its core pods).
type victimUnit struct {
	g     *gangState
	pods  []*v1.Pod
	extra bool
	usage quota.Usage
}

// units splits a running gang into what may be evicted of it, in order: the pods above
// minMember (the newest), then the rest (the whole gang).
func units(base *snapshot.Snapshot, g *gangState) []victimUnit {
	usage := func(pods []*v1.Pod) quota.Usage {
		u := quota.Usage{}
		counted := map[types.UID]bool{}
		for _, p := range pods {
			addPodUsage(u, base, p, counted)
		}
		return u
	}
	extra, core := split(g)
	var out []victimUnit
	if len(extra) > 0 {
		out = append(out, victimUnit{g: g, pods: extra, extra: true, usage: usage(extra)})
	}
	return append(out, victimUnit{g: g, pods: core, usage: usage(core)})
}

// disruptedTogether: the gang's upstream PodGroup says disruptionMode all (its pods may only
// be disrupted together, as the kube-scheduler's pod group preemption reads it). Then its
// pods above minMember are not evicted apart from its core, and consolidation moves none of
// them (it moves pods one by one). disruptionMode single (the default) lets pods be
// disrupted independently; tessera still evicts an elastic gang's pods above minMember
// first and otherwise whole gangs (a gang below minMember cannot run).
func disruptedTogether(g *gangState) bool {
	return g.Upstream != nil && g.Upstream.Spec.DisruptionMode != nil && g.Upstream.Spec.DisruptionMode.All != nil
}

// split divides a running gang's bound pods into those above minMember (the newest; none
// when the gang has no core or is disrupted together) and its core.
func split(g *gangState) (extra, core []*v1.Pod) {
	bound := append([]*v1.Pod(nil), g.Bound...)
	sort.SliceStable(bound, func(i, j int) bool {
		ti, tj := bound[i].CreationTimestamp, bound[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return bound[i].Name < bound[j].Name
	})
	n := max(0, min(int(g.pg.Spec.MinMember), len(bound)))
	if n > 0 && n < len(bound) && !disruptedTogether(g) {
		return bound[n:], bound[:n]
	}
	return nil, bound
}

// evictionsInFlight forgets evicted pods that are gone and whose claims are released (or that
// were waited for longer than EvictionWait) and reports whether some are still going away:
// then no new victims are chosen, so that one eviction's capacity is not counted twice. A
// deleted pod's devices stay allocated until the claim controller releases its claims; until
// then the gang it was evicted for still does not fit.
func evictionsInFlight(cfg Config, in Input, mem *Memory) bool {
	if len(mem.evicting) == 0 {
		return false
	}
	live := map[types.UID]bool{}
	for _, p := range in.Raw.Pods {
		live[p.UID] = true
	}
	for _, c := range in.Raw.Claims {
		if c.Status.Allocation != nil {
			for _, r := range c.Status.ReservedFor {
				live[r.UID] = true
			}
		}
	}
	for uid, at := range mem.evicting {
		if !live[uid] || in.Now.Sub(at) > cfg.EvictionWait {
			delete(mem.evicting, uid)
		}
	}
	return len(mem.evicting) > 0
}

// preempt gives a gang that did not fit the capacity of lower-priority gangs of its own queue:
// running, preemptible gangs of lower priority are candidates, the pods above minMember of
// elastic ones first, then whole gangs — youngest first, then the fewest pods and GPU units.
// Candidates are added one by one and the cluster without them simulated; once the gang fits
// (and its queue's limits admit it), candidates it does not need are dropped again (the latest
// first) and the rest evicted. It reports whether it evicted anything.
func preempt(ctx context.Context, cfg Config, in Input, d *Decisions, mem *Memory, gangs []*gangState, tree *quota.Tree, g *gangState) bool {
	logger := klog.FromContext(ctx)
	var lower []*gangState
	for _, b := range gangs {
		if b != g && b.pg != nil && len(b.Bound) > 0 && b.pg.Spec.Queue == g.pg.Spec.Queue &&
			b.pg.Spec.Priority < g.pg.Spec.Priority && preemptible(in, b) {
			lower = append(lower, b)
		}
	}
	if len(lower) == 0 {
		return false
	}
	base := in.Snapshot // for the victims' usage: their claims are as the cycle found them
	var extras, wholes []victimUnit
	for _, b := range lower {
		for _, u := range units(base, b) {
			if u.extra {
				extras = append(extras, u)
			} else {
				wholes = append(wholes, u)
			}
		}
	}
	order := func(us []victimUnit) {
		sort.SliceStable(us, func(i, j int) bool {
			a, b := us[i], us[j]
			if a.g.pg.Spec.Priority != b.g.pg.Spec.Priority {
				return a.g.pg.Spec.Priority < b.g.pg.Spec.Priority // the least important first
			}
			ta, tb := a.g.pg.CreationTimestamp, b.g.pg.CreationTimestamp
			if !ta.Equal(&tb) {
				return tb.Before(&ta) // youngest first
			}
			if len(a.pods) != len(b.pods) {
				return len(a.pods) < len(b.pods)
			}
			if a.usage[v1alpha1.ResourceGPU] != b.usage[v1alpha1.ResourceGPU] {
				return a.usage[v1alpha1.ResourceGPU] < b.usage[v1alpha1.ResourceGPU]
			}
			return a.g.Key > b.g.Key
		})
	}
	order(extras)
	order(wholes)
	candidates := append(extras, wholes...)

	tries := 0
	var placement *solver.Result // where the gang goes without the chosen victims
	fits := func(set []victimUnit) bool {
		tries++
		evict := map[types.UID]bool{}
		released := quota.Usage{}
		for _, u := range set {
			for _, p := range u.pods {
				evict[p.UID] = true
			}
			released.Add(u.usage)
		}
		// The queue's limits (and, for a non-preemptible gang, its quota: place admits it
		// so) after the victims are gone: their usage is taken off the tree for the check
		// and put back.
		admit := tree.Admit
		if !preemptible(in, g) {
			admit = tree.AdmitWithinQuota
		}
		back := quota.Usage{}
		for r, v := range released {
			back[r] = -v
		}
		tree.Charge(g.pg.Spec.Queue, back)
		ok, _ := admit(g.pg.Spec.Queue, g.estimate)
		tree.Charge(g.pg.Spec.Queue, released)
		if !ok {
			return false
		}
		snap := simulate(in, d, RulePreemption, evict)
		res, err := cfg.Solver.Solve(ctx, snap, g.gang)
		if err != nil {
			return false
		}
		placement = res
		return true
	}
	var chosen []victimUnit
	found := false
	for _, u := range candidates {
		if tries >= cfg.MaxReclaimTries {
			break
		}
		chosen = append(chosen, u)
		if fits(chosen) {
			found = true
			break
		}
	}
	if !found {
		logger.V(2).Info("Preemption would not make the gang fit", "podGroup", g.Key, "candidates", len(candidates), "simulated", tries)
		return false
	}
	// Fewest disturbed: drop victims the gang does not need (the last one was needed).
	for i := len(chosen) - 2; i >= 0 && tries < cfg.MaxReclaimTries; i-- {
		rest := append(append([]victimUnit(nil), chosen[:i]...), chosen[i+1:]...)
		if fits(rest) {
			chosen = rest
		}
	}
	// An elastic gang's core pods go only with its extra pods.
	for _, u := range chosen {
		if !u.extra {
			for _, o := range candidates {
				if o.extra && o.g == u.g && !containsUnit(chosen, o) {
					chosen = append(chosen, o)
				}
			}
		}
	}
	names := make([]string, 0, len(chosen))
	for _, u := range chosen {
		what := u.g.Key
		if u.extra {
			what = fmt.Sprintf("%d pods above minMember of %s", len(u.pods), u.g.Key)
		}
		names = append(names, what)
	}
	logger.Info("Preempting lower-priority gangs", "podGroup", g.Key, "queue", g.pg.Spec.Queue, "victims", names, "simulated", tries)
	d.Events = append(d.Events, Event{Object: g.PodGroup, Type: v1.EventTypeNormal, Reason: ReasonPreempting,
		Message: fmt.Sprintf("priority %d: evicting lower-priority work of queue %q (%s)", g.pg.Spec.Priority, g.pg.Spec.Queue, strings.Join(names, ", "))})
	for _, u := range chosen {
		msg := fmt.Sprintf("evicted (priority %d) for gang %s of priority %d in queue %q", u.g.pg.Spec.Priority, g.Key, g.pg.Spec.Priority, g.pg.Spec.Queue)
		if u.extra {
			msg = fmt.Sprintf("%d pods above minMember %s", len(u.pods), msg)
		}
		d.Events = append(d.Events, Event{Object: u.g.PodGroup, Type: v1.EventTypeWarning, Reason: ReasonPreempted, Message: msg})
		for _, p := range u.pods {
			mem.evicting[p.UID] = in.Now
			d.Evictions = append(d.Evictions, p)
		}
	}
	// chosen only changes when the set fits: placement is the last set's.
	reserve(mem, g.Key, placementNodes(placement), ReasonPreempting, in.Now)
	return true
}

func containsUnit(us []victimUnit, u victimUnit) bool {
	for _, o := range us {
		if o.g == u.g && o.extra == u.extra {
			return true
		}
	}
	return false
}

// PriorityClassesByName indexes PriorityClasses for Input.PriorityClasses.
func PriorityClassesByName(pcs []*schedulingv1.PriorityClass) map[string]*schedulingv1.PriorityClass {
	out := make(map[string]*schedulingv1.PriorityClass, len(pcs))
	for _, pc := range pcs {
		out[pc.Name] = pc
	}
	return out
}
