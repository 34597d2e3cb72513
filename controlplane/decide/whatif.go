package decide

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// The rules that simulate victim sets (Decisions.VictimSetsByRule, the scheduler's
// victim_sets_simulated_total metric).
const (
	RulePreemption    = "preemption"
	RuleReclaim       = "reclaim"
	RuleConsolidation = "consolidation"
)

// simulate counts one victim set of rule and returns the snapshot of the cycle's input
// without the pods in evict (and with the claims only they use released): a what-if
// derived from the cycle's snapshot (snapshot.WhatIf), the same as building it from scratch
// from in.Raw.
func simulate(in Input, d *Decisions, rule string, evict map[types.UID]bool) *snapshot.Snapshot {
	d.VictimSetsSimulated++
	d.VictimSetsByRule[rule]++
	return in.whatIf.Without(evict)
}
