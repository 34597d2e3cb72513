package scheduler

import (
	"context"
	"time"

	"github.com/tessera-gpu/tessera/controlplane/decide"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// Input epochs: waiting gangs are not searched again while nothing they read changed.
//
// A gang that does not fit waits, and every cycle would search it again (decide's backoff
// spaces the searches only until capacity may have come back, up to MaxBackoff). A search
// reads the cycle's snapshot (built from the nodes, pods, slices, claims and classes the
// informers list, with the assumed writes laid over them, and from the informers the
// kube-scheduler's filters read) and the gang. The scheduler numbers its inputs: a new epoch
// starts when an informer reported a change that can matter to a decision (the same events
// that trigger a cycle: relevantUpdate), when anything is assumed (a commit in flight, or
// writes the informers have not shown yet), after a cycle that placed or evicted, at a new
// leadership term, and at least every Options.UnfitRetry as a safety net (for what the
// events do not cover: the filters' StorageClass and CSI informers, and a pod whose update
// relevantUpdate calls irrelevant wrongly). Within an epoch the solver answers a gang that
// failed with its last answer (solver.WithInput). decide still runs every cycle: quotas,
// reasons, backoffs, preemption and consolidation are decided as before.
//
// An event is counted when its handler runs, which is after the informer's store has the
// object: a cycle that lists the object before the handler ran keeps the old epoch, and the
// next cycle (which the event triggers) starts a new one. A waiting gang is thus searched
// again at most one cycle after a change.

// defaultUnfitRetry is Options.UnfitRetry's default.
const defaultUnfitRetry = 30 * time.Second

// epochState is the cycle goroutine's view of input epochs.
type epochState struct {
	epoch uint64
	// gen is the change count (informer events + assumed-cache changes) the epoch began at.
	gen   uint64
	since time.Time
	// acted: the last cycle placed or evicted (its commits change the next input).
	acted bool
	// stats are the solver's counters at the last cycle (for the metric).
	stats solver.Stats
}

// changes is the count of everything that starts a new epoch when it changes.
func (s *Scheduler) changes() (gen uint64, busy bool) {
	ag, busy := s.assumed.state()
	return s.inputGen.Load() + ag, busy
}

// withInputEpoch returns ctx naming the cycle's snapshot with its input epoch. before is
// changes() before the cycle's lists were read.
func (s *Scheduler) withInputEpoch(ctx context.Context, in decide.Input, before uint64, busyBefore bool) context.Context {
	if s.opts.UnfitRetry < 0 {
		return ctx
	}
	after, busyAfter := s.changes()
	e := &s.epochs
	if e.epoch == 0 || before != e.gen || after != before || busyBefore || busyAfter || e.acted || in.Now.Sub(e.since) >= s.opts.UnfitRetry {
		e.epoch++
		e.since = in.Now
	}
	e.gen = after
	return solver.WithInput(ctx, in.Snapshot, e.epoch)
}

// afterDecide records what the next cycle's epoch depends on, and counts the searches not
// run again.
func (s *Scheduler) afterDecide(d *decide.Decisions) {
	s.epochs.acted = len(d.Placements) > 0 || len(d.Evictions) > 0
	st := s.solver.Stats()
	searchesUnchanged.Add(float64(st.Unchanged - s.epochs.stats.Unchanged))
	s.epochs.stats = st
}

// SolverStats returns the solver's counters: searches run, and answered as unchanged.
func (s *Scheduler) SolverStats() solver.Stats { return s.solver.Stats() }
