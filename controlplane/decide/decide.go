// Package decide is tessera's scheduling policy as a function: a snapshot of the cluster, the
// queue tree and the gangs go in; decisions come out — which gangs to place where, why the
// others wait, which gangs to evict to give a queue its quota back, and the status, pod
// conditions and Events that say so. Decide makes no API call and reads no clock (the time is
// an input), so it can be called on any snapshot without side effects: by the scheduler's
// loop, by tests without an API server, by a shadow scheduler that decides but does not act.
// Acting on the decisions — commits, status writes, Events — is the caller's business
// (controlplane/scheduler's effects layer).
package decide

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// Config is the policy's configuration.
type Config struct {
	// Solver searches placements. Required.
	Solver *solver.Solver
	// Snapshot configures the snapshots Decide builds for simulations (reclaim, starvation).
	Snapshot snapshot.Config
	// StarvationTimeout: a borrowing gang that has not fit for this long (and would fit the
	// empty cluster) holds back other borrowing gangs until it is placed. Zero means 5
	// minutes; negative disables.
	StarvationTimeout time.Duration
	// FormationTimeout: a gang with fewer pods than minMember for this long (counted from
	// its oldest pod) says so loudly: its condition names the workload and what is missing,
	// an Event is emitted and its waiting pods get PodScheduled=False. Zero means 2 minutes;
	// negative disables.
	FormationTimeout time.Duration
	// MinBackoff and MaxBackoff bound the retry delay of a gang that did not fit. Defaults
	// 500ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// MaxReclaimTries bounds the victim sets simulated for one gang per cycle. Default 8.
	MaxReclaimTries int
	// UsageWeight says how much a queue's past usage (status.usage) lowers its over-quota
	// share (quota.FairShareConfig.K, like KAI Scheduler's kValue). 0 ignores it.
	UsageWeight float64
	// UsageHalfLife is the half-life of each queue's usage history (status.usage); 0 keeps
	// none.
	UsageHalfLife time.Duration
	// UsagePeriod is how often the usage history is moved on. Default 1 minute.
	UsagePeriod time.Duration
	// MaxConsolidationMoves bounds the pods one consolidation moves. Default 16; negative
	// disables consolidation.
	MaxConsolidationMoves int
	// EvictionWait is how long a reclaim waits for its evicted pods before it may choose more
	// victims. Default 2 minutes.
	EvictionWait time.Duration
	// ReservationTimeout bounds how long the nodes freed for a gang (preemption, reclaim,
	// consolidation) are kept for it when it is not placed. Default 2 × EvictionWait.
	ReservationTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.StarvationTimeout == 0 {
		c.StarvationTimeout = 5 * time.Minute
	}
	if c.FormationTimeout == 0 {
		c.FormationTimeout = 2 * time.Minute
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 500 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 10 * time.Second
	}
	if c.MaxReclaimTries <= 0 {
		c.MaxReclaimTries = 8
	}
	if c.MaxConsolidationMoves == 0 {
		c.MaxConsolidationMoves = 16
	}
	if c.UsagePeriod <= 0 {
		c.UsagePeriod = time.Minute
	}
	if c.EvictionWait <= 0 {
		c.EvictionWait = 2 * time.Minute
	}
	if c.ReservationTimeout <= 0 {
		c.ReservationTimeout = 2 * c.EvictionWait
	}
	return c
}

// Gang is one gang as the caller found it in the cluster.
type Gang struct {
	// Key is namespace/name of its PodGroup.
	Key string
	// PodGroup is the tessera PodGroup as it is now (with the caller's writes that the
	// informers have not delivered yet); nil when it does not exist yet.
	PodGroup *v1alpha1.PodGroup
	// Desired is the PodGroup the mapper wants (created or its spec kept current); nil for a
	// PodGroup made by hand.
	Desired *v1alpha1.PodGroup
	// MappedReason and MappedMessage say how the gang was found (Mapped condition).
	MappedReason, MappedMessage string
	// Workload names the gang's workload for messages ("JobSet ns/train"); may be empty.
	Workload string
	// Upstream is the scheduling.k8s.io PodGroup the gang's pods name
	// (spec.schedulingGroup), when it is one.
	Upstream *schedulingv1beta1.PodGroup
	// Pending pods wait for a node; Bound hold one; Terminating are going away but still
	// hold their devices (charged, not members).
	Pending, Bound, Terminating []*v1.Pod
	// Running, Succeeded, Failed count the gang's pods in those phases.
	Running, Succeeded, Failed int
}

func (g *Gang) spec() *v1alpha1.PodGroup {
	if g.PodGroup != nil {
		if g.Desired != nil {
			// The mapper's spec wins over a PodGroup whose update is still in flight. A
			// shallow copy: only the two scalar fields differ, and nothing in Decide writes
			// to a gang's PodGroup (a deep copy of every gang's PodGroup in every cycle was
			// a tenth of the scheduler's CPU under churn).
			pg := *g.PodGroup
			pg.Spec.MinMember, pg.Spec.Queue = g.Desired.Spec.MinMember, g.Desired.Spec.Queue
			return &pg
		}
		return g.PodGroup
	}
	return g.Desired
}

// Input is one cycle's state.
type Input struct {
	// Now is the cycle's time; Decide reads no clock.
	Now time.Time
	// Snapshot of nodes, devices and pods. Decide consumes it: placed gangs are assumed in
	// it so that later gangs of the cycle see their capacity taken.
	Snapshot *snapshot.Snapshot
	// Raw is what Snapshot was built from (the same objects); simulations (preemption,
	// reclaim, consolidation, starvation) derive snapshots of it.
	Raw snapshot.Input
	// Queues are all Queues.
	Queues []*v1alpha1.Queue
	// Gangs are all gangs with live pods (any order).
	Gangs []*Gang
	// CapacityGen changes whenever capacity may have come back (a pod finished, a claim was
	// released, a node, slice, class or queue changed); gangs in backoff are then retried.
	CapacityGen uint64
	// PriorityClasses by name: the label scheduling.tessera.dev/preemptible=false on a pod's
	// class makes its gang non-preemptible. May be nil.
	PriorityClasses map[string]*schedulingv1.PriorityClass
	// Topologies order node-label levels for gangs' topology constraints. May be empty.
	Topologies []*v1alpha1.Topology

	// whatIf derives the victim simulations' snapshots (set by Decide).
	whatIf *snapshot.WhatIf
}

// Memory is what decisions remember from cycle to cycle: backoffs, how long gangs have
// waited, which warnings were given, which pods a reclaim evicted. The caller owns it and
// passes the same Memory to every Decide; a shadow caller passes its own.
type Memory struct {
	failures map[string]*failure
	// warned: gang key → the last warning Event (reason: message) emitted for it.
	warned map[string]string
	// evicting: pods evicted by a reclaim, and when.
	evicting map[types.UID]time.Time
	// reserved: nodes freed by evictions (preemption, reclaim, consolidation), for the gang
	// they were freed for (reserve.go).
	reserved map[string]reservation
}

type failure struct {
	reason, message string
	at              time.Time
	backoff         time.Duration
	capacity        uint64
	since           time.Time
	fitsEmpty       *bool
}

// NewMemory returns empty memory (a new leadership term starts with it).
func NewMemory() *Memory {
	return &Memory{failures: map[string]*failure{}, warned: map[string]string{}, evicting: map[types.UID]time.Time{}, reserved: map[string]reservation{}}
}

// CommitFailed records that the commit of a placed gang failed (the caller undid it): the
// gang waits with the error as its reason and is retried after the minimum backoff.
func (m *Memory) CommitFailed(key, message string, now time.Time, cfg Config) {
	cfg = cfg.withDefaults()
	backoff, since := cfg.MinBackoff, now
	if prev := m.failures[key]; prev != nil {
		// A commit that keeps failing (a volume that never binds) is retried less and less
		// often.
		backoff, since = min(cfg.MaxBackoff, 2*prev.backoff), prev.since
	}
	m.failures[key] = &failure{reason: v1alpha1.ReasonCommitFailed, message: message, at: now, backoff: backoff, since: since}
}

// Committed records that a placed gang's commit succeeded: its failure history ends.
func (m *Memory) Committed(key string) { delete(m.failures, key) }

// Decisions is what one cycle decided.
type Decisions struct {
	// Placements are the admitted gangs, to commit.
	Placements []*Placement
	// PodGroups to create (Object has no resourceVersion) or whose spec to update.
	PodGroups []*v1alpha1.PodGroup
	// Statuses are PodGroup statuses that differ from what the PodGroups show.
	Statuses []PodGroupStatus
	// UpstreamStatuses are scheduling.k8s.io PodGroup conditions that differ.
	UpstreamStatuses []UpstreamStatus
	// QueueStatuses are Queue statuses that differ.
	QueueStatuses []QueueStatus
	// PodConditions are PodScheduled=False conditions waiting pods lack.
	PodConditions []PodCondition
	// Events to emit (already deduplicated against Memory).
	Events []Event
	// Evictions are pods to evict (reclaim).
	Evictions []*v1.Pod
	// Pending is the number of gangs with waiting pods at the end of the cycle.
	Pending int
	// Queues is the cycle's queue tree (for metrics).
	Queues *quota.Tree
	// WallClockAborts counts searches the solver's wall-clock guard ended.
	WallClockAborts int
	// SolveSeconds are the durations of the cycle's gang searches (measured for metrics
	// only; no decision depends on them).
	SolveSeconds []float64
	// VictimSetsSimulated counts the victim sets preemption, reclaim and consolidation
	// simulated (each a what-if snapshot the gang was searched on); VictimSetsByRule splits
	// it by rule (RulePreemption, RuleReclaim, RuleConsolidation).
	VictimSetsSimulated int
	VictimSetsByRule    map[string]int
	// Outcomes are every gang's reason and message this cycle (for logs and tests).
	Outcomes map[string]Outcome
}

// Outcome is why a gang is where it is this cycle.
type Outcome struct {
	Reason, Message string
}

// Placement is an admitted gang.
type Placement struct {
	Key string
	// PodGroup is nil when the gang is placed in the cycle that first saw it, before its
	// PodGroup exists: the commit creates CreatePodGroup (the mapper's) before it writes
	// anything else, and records the gang's Events on what it created.
	PodGroup       *v1alpha1.PodGroup
	CreatePodGroup *v1alpha1.PodGroup
	Upstream       *schedulingv1beta1.PodGroup
	Result         *solver.Result
	// Usage charged to the queue.
	Usage quota.Usage
	// AlreadyBound pods of the gang before this placement, and its MinMember: a commit whose
	// binding fails part-way must not leave fewer than MinMember bound.
	AlreadyBound, MinMember int
}

// PodGroupStatus is the status a PodGroup should have.
type PodGroupStatus struct {
	PodGroup *v1alpha1.PodGroup // the object as it is now
	Status   v1alpha1.PodGroupStatus
}

// UpstreamStatus is the condition list a scheduling.k8s.io PodGroup should have.
type UpstreamStatus struct {
	PodGroup   *schedulingv1beta1.PodGroup
	Conditions []metav1.Condition
}

// QueueStatus is the status a Queue should have.
type QueueStatus struct {
	Queue  *v1alpha1.Queue
	Status v1alpha1.QueueStatus
}

// PodCondition is a PodScheduled=False condition for a waiting pod.
type PodCondition struct {
	Pod     *v1.Pod
	Message string
}

// Event is an Event to record.
type Event struct {
	Object                runtime.Object
	Type, Reason, Message string
}

// gangState is one gang during a cycle.
type gangState struct {
	*Gang
	// pending and bound start as the Gang's and change as the cycle places pods (the input
	// is not modified).
	pending, bound  []*v1.Pod
	pg              *v1alpha1.PodGroup
	reason, message string
	queueOK         bool
	gang            *solver.Gang
	estimate        quota.Usage
	placed          int // pods placed this cycle
	position        *v1alpha1.QueuePosition
	formationDue    bool
}

// Decide runs one cycle of the policy. mem is updated.
func Decide(ctx context.Context, cfg Config, in Input, mem *Memory) *Decisions {
	cfg = cfg.withDefaults()
	logger := klog.FromContext(ctx)
	d := &Decisions{Outcomes: map[string]Outcome{}, VictimSetsByRule: map[string]int{}}
	snap := in.Snapshot
	// Victim sets are simulated on what-ifs of the cycle's input, derived from the state of
	// the cycle's snapshot before any placement of this cycle (as from in.Raw).
	in.whatIf = snapshot.NewWhatIf(in.Snapshot, in.Raw, cfg.Snapshot)

	gangs := make([]*gangState, 0, len(in.Gangs))
	live := map[string]bool{}
	for _, g := range in.Gangs {
		gs := &gangState{Gang: g, pg: g.spec(), pending: g.Pending, bound: g.Bound}
		if g.PodGroup == nil && g.Desired != nil {
			// Its PodGroup is created now (by this cycle's commit or writes): it queues as
			// the youngest, not — with the mapper's object's zero creation time — the oldest.
			pg := *g.Desired // shallow, as in spec: only a value field differs
			pg.CreationTimestamp = metav1.NewTime(in.Now)
			gs.pg = &pg
		}
		gangs = append(gangs, gs)
		live[g.Key] = true
	}
	sort.Slice(gangs, func(i, j int) bool { return gangs[i].Key < gangs[j].Key })
	for key := range mem.failures {
		if !live[key] {
			delete(mem.failures, key)
		}
	}
	for key := range mem.warned {
		if !live[key] {
			delete(mem.warned, key)
		}
	}

	// Queues: charge what bound and terminating pods hold.
	tree := quota.Build(in.Queues)
	d.Queues = tree
	// Summed per queue first, then charged once per queue (in name order, so that the sums
	// are the same in every cycle): a Charge walks the queue's ancestors.
	held := map[string]quota.Usage{}
	counted := map[types.UID]bool{}
	for _, g := range gangs {
		if g.pg == nil || g.pg.Spec.Queue == "" {
			continue
		}
		u := held[g.pg.Spec.Queue]
		if u == nil {
			u = quota.Usage{}
			held[g.pg.Spec.Queue] = u
		}
		for _, p := range g.bound {
			addPodUsage(u, snap, p, counted)
		}
		for _, p := range g.Terminating {
			addPodUsage(u, snap, p, counted)
		}
	}
	for _, q := range slices.Sorted(maps.Keys(held)) {
		tree.Charge(q, held[q])
	}

	// Gangs ready to be placed, per queue.
	byQueue := map[string][]*gangState{}
	var starving *gangState
	var starvingSince time.Time
	for _, g := range gangs {
		if len(g.pending) == 0 {
			continue
		}
		d.Pending++
		if g.PodGroup == nil && g.Desired == nil {
			// A hand-made PodGroup the pods name must exist: nothing here can create it.
			g.reason, g.message = reasonPodGroupNotFound, fmt.Sprintf("PodGroup %s named by %s does not exist", g.Key, v1alpha1.PodGroupAnnotation)
			warn(d, mem, g.Key, g.pending[0], reasonPodGroupNotFound, g.message)
			continue
		}
		// A gang whose mapper-made PodGroup does not exist yet is tried at once — a lone
		// pod or a gang whose pods all came before its first cycle would otherwise wait a
		// PodGroup write, its watch event and one more cycle before it is even tried. If it
		// is placed its commit creates the PodGroup first; if not, fail gives it no backoff
		// and no Event, and the PodGroup is created by this cycle's writes.
		if !readyToPlace(cfg, in, snap, tree, g) {
			continue
		}
		tree.Demand(g.pg.Spec.Queue, g.estimate)
		fl := mem.failures[g.Key]
		if fl != nil && fl.reason == v1alpha1.ReasonUnschedulable && starvingGang(ctx, cfg, in, g, fl) &&
			tree.RankOf(g.pg.Spec.Queue, g.estimate).Borrowing && (starving == nil || fl.since.Before(starvingSince)) {
			starving, starvingSince = g, fl.since
		}
		// A gang that did not fit is retried after its backoff, or at once when capacity may
		// have come back; one whose commit failed only after its backoff.
		if fl != nil && (fl.capacity == in.CapacityGen || fl.reason == v1alpha1.ReasonCommitFailed) && in.Now.Sub(fl.at) < fl.backoff {
			g.reason, g.message = fl.reason, fl.message
			continue
		}
		byQueue[g.pg.Spec.Queue] = append(byQueue[g.pg.Spec.Queue], g)
	}
	// Nodes freed by evictions are kept for their gang: the others avoid them.
	waiting := map[string]bool{}
	for _, g := range gangs {
		if len(g.pending) > 0 {
			waiting[g.Key] = true
		}
	}
	adoptReservations(mem, gangs)
	if reserved := reservedAvoid(cfg, in, mem, waiting); len(reserved) > 0 {
		for _, list := range byQueue {
			for _, g := range list {
				for n, owner := range reserved {
					if owner != g.Key {
						if g.gang.Avoid == nil {
							g.gang.Avoid = map[string]bool{}
						}
						g.gang.Avoid[n] = true
					}
				}
			}
		}
	}
	// Fair shares from this cycle's allocations and demand: what reclaim gives back.
	tree.ComputeFairShare(quota.FairShareConfig{Capacity: capacity(snap), K: cfg.UsageWeight, Usage: usageHistory(in.Queues)})
	for _, list := range byQueue {
		sort.SliceStable(list, func(i, j int) bool {
			a, b := list[i].pg, list[j].pg
			if a.Spec.Priority != b.Spec.Priority {
				return a.Spec.Priority > b.Spec.Priority
			}
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return list[i].Key < list[j].Key
		})
	}

	// Place: always the queue whose next gang ranks best (under quota first, then borrowers
	// by over-quota usage per weight). A gang that does not fit does not block the gangs
	// behind it.
	var reclaimFor, consolidateFor *gangState
	var preemptors []*gangState         // gangs that did not fit, most important first
	failedShapes := map[string]string{} // gang signature → why it did not fit
	var reserved []*Placement           // volume reservations to release at the end
	for len(byQueue) > 0 {
		if ctx.Err() != nil {
			break
		}
		var bestQ string
		var bestRank quota.Rank
		for q, list := range byQueue {
			r := tree.RankOf(q, list[0].estimate)
			if bestQ == "" || r.Less(bestRank) || (!bestRank.Less(r) && q < bestQ) {
				bestQ, bestRank = q, r
			}
		}
		g := byQueue[bestQ][0]
		if byQueue[bestQ] = byQueue[bestQ][1:]; len(byQueue[bestQ]) == 0 {
			delete(byQueue, bestQ)
		}
		if starving != nil && g != starving && bestRank.Borrowing {
			g.reason, g.message = v1alpha1.ReasonUnschedulable, fmt.Sprintf("waits behind gang %s, which has not fit for longer than the starvation timeout (%s) and goes first among gangs beyond their quota",
				starving.Key, cfg.StarvationTimeout)
			continue
		}
		sig := cfg.Solver.Signature(snap, g.gang)
		if msg, failed := failedShapes[sig]; failed && sig != "" {
			// An identical gang did not fit earlier in this cycle; capacity only shrank since.
			fail(cfg, d, mem, in, g, v1alpha1.ReasonUnschedulable, msg)
			continue
		}
		if p := place(ctx, cfg, in, d, mem, tree, g); p != nil {
			d.Placements = append(d.Placements, p)
			reserved = append(reserved, p)
			d.Pending--
			if len(g.pending) > 0 {
				d.Pending++ // an elastic gang with pods left waiting
			}
		} else if g.PodGroup == nil {
			// Preemption, reclaim and consolidation record Events and reservations on the
			// gang's PodGroup: they wait for the next cycle, when it exists.
			continue
		} else if g.reason == v1alpha1.ReasonUnschedulable {
			// Gangs of the same shape get the same message, so that a gang's message does not
			// depend on whether it or another was searched this cycle.
			failedShapes[sig] = g.message
			if consolidateFor == nil && !neverPreempts(g) {
				consolidateFor = g
			}
			if reclaimFor == nil && (!bestRank.Borrowing || belowFairShare(tree, g)) && !neverPreempts(g) {
				reclaimFor = g
			}
		}
		if (g.reason == v1alpha1.ReasonUnschedulable || g.reason == v1alpha1.ReasonQuotaExceeded) && !neverPreempts(g) {
			preemptors = append(preemptors, g)
		}
	}
	// At most one eviction decision per cycle, and none while evicted pods still go away
	// (also those of a reservation a new scheduler took over): first priority within the
	// queue of the most important gang that did not fit, then quota reclaim across queues,
	// then consolidation.
	if (len(preemptors) > 0 || reclaimFor != nil || consolidateFor != nil) && !evictionsInFlight(cfg, in, mem) && !freshReservation(cfg, in, mem) {
		acted := false
		for _, g := range preemptors {
			if acted = preempt(ctx, cfg, in, d, mem, gangs, tree, g); acted {
				break
			}
		}
		if !acted && reclaimFor != nil {
			acted = reclaim(ctx, cfg, in, d, mem, gangs, tree, reclaimFor)
		}
		if !acted && consolidateFor != nil && cfg.MaxConsolidationMoves > 0 {
			consolidate(ctx, cfg, in, d, mem, gangs, consolidateFor)
		}
	}
	// Volume reservations made so that later gangs of this cycle do not pick the same
	// PersistentVolumes are released: Decide leaves the volume binder as it found it. The
	// caller reserves them again when it acts on the placements.
	for _, p := range reserved {
		for _, pl := range p.Result.Placements {
			pl.Volumes.Unreserve(ctx)
		}
	}

	for _, g := range gangs {
		if g.Desired == nil {
			continue
		}
		if g.PodGroup == nil && g.placed > 0 {
			continue // its commit creates it (Placement.CreatePodGroup)
		}
		if g.PodGroup == nil || g.PodGroup.Spec.MinMember != g.Desired.Spec.MinMember || g.PodGroup.Spec.Queue != g.Desired.Spec.Queue {
			d.PodGroups = append(d.PodGroups, g.Desired)
		}
	}
	queuePositions(tree, gangs)
	for _, g := range gangs {
		d.Outcomes[g.Key] = Outcome{Reason: g.reason, Message: g.message}
		desiredStatus(in, d, mem, g)
	}
	queueStatuses(cfg, d, tree, capacity(snap), metav1.NewTime(in.Now))
	logger.V(3).Info("Decided", "gangs", len(gangs), "placed", len(d.Placements), "pending", d.Pending)
	return d
}

// reasonPodGroupNotFound: a pod names a PodGroup (annotation) that does not exist.
const reasonPodGroupNotFound = "PodGroupNotFound"

// queuePositions numbers the gangs that wait with everything they need (members, claims, a
// queue) in the order the scheduler tries them: in their queue by priority, then age; overall
// by the rank their queue would have once the gangs ahead of them in it were placed (within
// quota first, then borrowers by over-quota usage per weight), so that queues take turns as
// they do when capacity comes back.
func queuePositions(tree *quota.Tree, gangs []*gangState) {
	byQueue := map[string][]*gangState{}
	for _, g := range gangs {
		if g.gang != nil && len(g.pending) > 0 && g.pg != nil {
			byQueue[g.pg.Spec.Queue] = append(byQueue[g.pg.Spec.Queue], g)
		}
	}
	type entry struct {
		g       *gangState
		inQueue int
		rank    quota.Rank
	}
	var all []entry
	for q, list := range byQueue {
		sort.SliceStable(list, func(i, j int) bool {
			a, b := list[i].pg, list[j].pg
			if a.Spec.Priority != b.Spec.Priority {
				return a.Spec.Priority > b.Spec.Priority
			}
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return list[i].Key < list[j].Key
		})
		ahead := quota.Usage{}
		for i, g := range list {
			ahead.Add(g.estimate)
			all = append(all, entry{g: g, inQueue: i + 1, rank: tree.RankOf(q, ahead)})
		}
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].rank.Less(all[j].rank) != all[j].rank.Less(all[i].rank) {
			return all[i].rank.Less(all[j].rank)
		}
		if all[i].inQueue != all[j].inQueue {
			return all[i].inQueue < all[j].inQueue
		}
		return all[i].g.Key < all[j].g.Key
	})
	for i, e := range all {
		e.g.position = &v1alpha1.QueuePosition{InQueue: int32(e.inQueue), Overall: int32(i + 1)}
	}
}

// capacity is the cluster's GPU units, CPU cores and memory bytes: what the root queues'
// fair shares divide.
func capacity(snap *snapshot.Snapshot) quota.Usage {
	c := quota.Usage{}
	for _, ni := range snap.Nodes {
		c[v1alpha1.ResourceGPU] += ni.GPUTotal
		c[v1alpha1.ResourceCPU] += ni.Node.Status.Allocatable.Cpu().AsApproximateFloat64()
		c[v1alpha1.ResourceMemory] += ni.Node.Status.Allocatable.Memory().AsApproximateFloat64()
	}
	return c
}

// usageHistory is each queue's past usage as its status keeps it (fractions of capacity).
func usageHistory(queues []*v1alpha1.Queue) map[string]quota.Usage {
	out := map[string]quota.Usage{}
	for _, q := range queues {
		if q.Status.Usage == nil {
			continue
		}
		u := quota.Usage{}
		for r, v := range q.Status.Usage.Average {
			u[r] = v.AsApproximateFloat64()
		}
		out[q.Name] = u
	}
	return out
}

// belowFairShare: the gang's queue stays within its fair share with the gang (for each
// resource the gang needs). Its ancestors are checked by reclaim, up to the level where the
// paths of the reclaimer and a victim part (a shared ancestor is full either way).
func belowFairShare(tree *quota.Tree, g *gangState) bool {
	n := tree.Get(g.pg.Spec.Queue)
	if n == nil {
		return false
	}
	var rs []string
	for _, r := range quota.Resources {
		if g.estimate[r] > 0 {
			rs = append(rs, r)
		}
	}
	return len(rs) > 0 && withinShare(n, g.estimate, rs)
}

// warn emits a warning Event for a gang when its message changed since the last one.
func warn(d *Decisions, mem *Memory, key string, obj runtime.Object, reason, msg string) {
	if mem.warned[key] == reason+": "+msg {
		return
	}
	mem.warned[key] = reason + ": " + msg
	d.Events = append(d.Events, Event{Object: obj, Type: v1.EventTypeWarning, Reason: reason, Message: msg})
}

// place solves one gang and checks its exact usage against the queue limits. It returns the
// placement when the gang is admitted (then its usage is charged and its pods assumed in the
// snapshot), else nil with the gang's reason set.
func place(ctx context.Context, cfg Config, in Input, d *Decisions, mem *Memory, tree *quota.Tree, g *gangState) *Placement {
	logger := klog.FromContext(ctx)
	snap := in.Snapshot
	start := time.Now()
	res, err := cfg.Solver.Solve(ctx, snap, g.gang)
	d.SolveSeconds = append(d.SolveSeconds, time.Since(start).Seconds())
	placed := g.pending
	if solver.IsUnschedulable(err) && ctx.Err() == nil {
		// Elastic gang: more pods than minMember. When not all fit, place as many as fit
		// (at least enough to reach minMember, at least one), the rest later as capacity
		// comes back: the most pods for which a placement exists, found by bisection (a
		// subset of pods that fits stays fitting with fewer of them).
		if need := max(1, int(g.pg.Spec.MinMember)-len(g.bound)); need < len(g.pending) {
			pods := append([]solver.Pod(nil), g.gang.Pods...)
			sort.Slice(pods, func(i, j int) bool { return pods[i].Pod.Name < pods[j].Pod.Name })
			try := func(k int) (*solver.Result, bool) {
				sub := *g.gang
				sub.Pods = pods[:k]
				r, subErr := cfg.Solver.Solve(ctx, snap, &sub)
				return r, subErr == nil
			}
			if r, ok := try(need); ok {
				best, lo, hi := r, need, len(pods)-1 // lo fits; all of them did not
				for lo < hi && ctx.Err() == nil {
					mid := (lo + hi + 1) / 2
					if r, ok := try(mid); ok {
						best, lo = r, mid
					} else {
						hi = mid - 1
					}
				}
				res, err = best, nil
				placed = nil
				for _, p := range pods[:lo] {
					placed = append(placed, p.Pod)
				}
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		var u *solver.Unschedulable
		msg := err.Error()
		if !errors.As(err, &u) {
			msg = "invalid input: " + msg
		} else if u.WallClock {
			d.WallClockAborts++
		}
		fail(cfg, d, mem, in, g, v1alpha1.ReasonUnschedulable, msg)
		return nil
	}
	usage := quota.Usage{v1alpha1.ResourceGPU: res.GPUUnits}
	for _, p := range placed {
		req := snapshot.PodRequests(p)
		usage[v1alpha1.ResourceCPU] += req.Cpu().AsApproximateFloat64()
		usage[v1alpha1.ResourceMemory] += req.Memory().AsApproximateFloat64()
	}
	admit := tree.Admit
	if !preemptible(in, g) {
		// Nobody can take it back: a non-preemptible gang runs only within its quota.
		admit = tree.AdmitWithinQuota
	}
	if ok, why := admit(g.pg.Spec.Queue, usage); !ok {
		fail(cfg, d, mem, in, g, v1alpha1.ReasonQuotaExceeded, why)
		return nil
	}
	// Admitted: take the capacity in this cycle's snapshot and queue tree.
	tree.Charge(g.pg.Spec.Queue, usage)
	for _, p := range res.Placements {
		var allocs []*resourceapi.AllocationResult
		for _, ca := range p.Allocate {
			allocs = append(allocs, ca.Allocation)
		}
		if p.Extended != nil {
			allocs = append(allocs, p.Extended.Allocation)
		}
		snap.Assume(p.Node, p.Pod, allocs)
		if err := p.Volumes.Reserve(ctx); err != nil {
			logger.V(2).Info("Volume reservation for the rest of the cycle failed", "pod", klog.KObj(p.Pod), "err", err)
		}
	}
	if fl := mem.failures[g.Key]; fl == nil || fl.reason != v1alpha1.ReasonCommitFailed {
		// Placed: the gang's failure history ends (a failed commit's stays, for its backoff,
		// until a commit succeeds).
		delete(mem.failures, g.Key)
	}
	delete(mem.warned, g.Key)
	release(mem, g.Key)
	isPlaced := map[types.UID]bool{}
	for _, p := range placed {
		isPlaced[p.UID] = true
	}
	var rest []*v1.Pod
	for _, p := range g.pending {
		if !isPlaced[p.UID] {
			rest = append(rest, p)
		}
	}
	already := len(g.bound)
	g.bound = append(append([]*v1.Pod(nil), g.bound...), placed...)
	g.pending = rest
	g.placed = len(placed)
	g.reason, g.message = v1alpha1.ReasonScheduled, fmt.Sprintf("%d pods placed on %d nodes", len(res.Placements), countNodes(res))
	logger.V(2).Info("Gang admitted", "podGroup", g.Key, "pods", len(res.Placements), "gpuUnits", res.GPUUnits, "queue", g.pg.Spec.Queue, "domain", res.Domain, "tries", res.Tries, "steps", res.Steps)
	pl := &Placement{Key: g.Key, PodGroup: g.PodGroup, Upstream: g.Upstream, Result: res, Usage: usage, AlreadyBound: already, MinMember: int(g.pg.Spec.MinMember)}
	if g.PodGroup == nil {
		pl.CreatePodGroup = g.Desired
	}
	return pl
}

// fail records that a gang did not fit: backoff, the reason, and a warning Event when the
// message is new.
func fail(cfg Config, d *Decisions, mem *Memory, in Input, g *gangState, reason, msg string) {
	if g.PodGroup == nil {
		// Tried before its PodGroup exists: no Event (nothing to attach it to yet) and no
		// backoff; the next cycle, with the PodGroup created, decides again.
		g.reason, g.message = reason, msg
		return
	}
	fl := mem.failures[g.Key]
	backoff := cfg.MinBackoff
	if fl != nil {
		backoff = min(cfg.MaxBackoff, fl.backoff*2)
	}
	warn(d, mem, g.Key, g.PodGroup, reason, msg)
	nf := &failure{reason: reason, message: msg, at: in.Now, backoff: backoff, capacity: in.CapacityGen, since: in.Now}
	if fl != nil {
		nf.since, nf.fitsEmpty = fl.since, fl.fitsEmpty
	}
	mem.failures[g.Key] = nf
	g.reason, g.message = reason, msg
}

// starvingGang reports whether a gang has not fit for longer than the starvation timeout and
// would fit the cluster if it were empty (a gang that can never fit must not hold others
// back).
func starvingGang(ctx context.Context, cfg Config, in Input, g *gangState, fl *failure) bool {
	if cfg.StarvationTimeout < 0 || in.Now.Sub(fl.since) < cfg.StarvationTimeout {
		return false
	}
	if fl.fitsEmpty != nil {
		return *fl.fitsEmpty
	}
	empty := snapshot.New(snapshot.Input{Nodes: in.Raw.Nodes, Slices: in.Raw.Slices, Classes: in.Raw.Classes}, cfg.Snapshot)
	_, err := cfg.Solver.Solve(ctx, empty, g.gang)
	fits := err == nil
	fl.fitsEmpty = &fits
	return fits
}

func countNodes(res *solver.Result) int {
	n := map[string]bool{}
	for _, p := range res.Placements {
		n[p.Node] = true
	}
	return len(n)
}

func truncate(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(s[:n:n], fmt.Sprintf("and %d more", len(s)-n))
}
