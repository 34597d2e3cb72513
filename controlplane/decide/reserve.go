package decide

import (
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

// Reservations. When pods are evicted for a gang (priority preemption, reclaim,
// consolidation), the nodes of the placement the simulation found for it are kept for it:
// other gangs avoid them until it is placed, it goes away (no pod waits any more), or
// ReservationTimeout passed since the eviction. Without this, a gang of a queue that ranks
// first, or a small gang that fits in the freed space, arriving while the victims go away
// would take what was freed and the gang evicted for would still not fit: the victims would
// be lost for nothing.
//
// The unit is the node (the solver's Avoid), not the device: a node the gang's placement
// uses is kept whole, also the devices of it the gang does not need, so that what the
// simulation placed stays placeable whichever devices the search picks when the gang is
// tried for real.
//
// A reservation is kept in Memory and written to the gang's PodGroup status
// (status.reservation, with the time of the eviction): a new scheduler (restart, failover of
// the leader) starts with empty Memory and takes the reservations over from the statuses of
// the gangs that still wait, with their original time, so that they still end on time. While
// a reservation is younger than EvictionWait no new victims are chosen (as for evictions in
// flight, which a new scheduler does not know): a restart does not evict a second time for
// the same capacity.

// reservation: a node kept for a gang.
type reservation struct {
	gang, reason string
	at           time.Time
}

// reserve keeps the nodes for the gang. The time is kept to the second, as the status keeps
// it, so that the status written and the one read back compare equal.
func reserve(mem *Memory, gang string, nodes []string, reason string, now time.Time) {
	at := now.Truncate(time.Second)
	for _, n := range nodes {
		mem.reserved[n] = reservation{gang: gang, reason: reason, at: at}
	}
}

// release forgets the gang's reservations (it is placed).
func release(mem *Memory, gang string) {
	for n, r := range mem.reserved {
		if r.gang == gang {
			delete(mem.reserved, n)
		}
	}
}

// placementNodes are the nodes of a solver result, sorted.
func placementNodes(res *solver.Result) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range res.Placements {
		if !seen[p.Node] {
			seen[p.Node] = true
			out = append(out, p.Node)
		}
	}
	sort.Strings(out)
	return out
}

// adoptReservations takes over the reservations that waiting gangs' PodGroup statuses show
// and Memory lacks (a new scheduler). gangs are sorted by key; a node kept for two gangs
// stays with the first.
func adoptReservations(mem *Memory, gangs []*gangState) {
	have := map[string]bool{}
	for _, r := range mem.reserved {
		have[r.gang] = true
	}
	for _, g := range gangs {
		if g.PodGroup == nil || len(g.pending) == 0 || have[g.Key] || g.PodGroup.Status.Reservation == nil {
			continue
		}
		r := g.PodGroup.Status.Reservation
		for _, n := range r.Nodes {
			if _, taken := mem.reserved[n]; !taken {
				mem.reserved[n] = reservation{gang: g.Key, reason: r.Reason, at: r.Since.Time}
			}
		}
	}
}

// reservedAvoid forgets reservations whose gang is placed, gone or waited too long, and
// returns the gang each remaining node is kept for.
func reservedAvoid(cfg Config, in Input, mem *Memory, waiting map[string]bool) map[string]string {
	out := map[string]string{}
	for n, r := range mem.reserved {
		if !waiting[r.gang] || in.Now.Sub(r.at) > cfg.ReservationTimeout {
			delete(mem.reserved, n)
			continue
		}
		out[n] = r.gang
	}
	return out
}

// freshReservation: some reservation is younger than EvictionWait — its victims may still be
// going away (a new scheduler does not know its predecessor's evictions in flight).
func freshReservation(cfg Config, in Input, mem *Memory) bool {
	for _, r := range mem.reserved {
		if in.Now.Sub(r.at) < cfg.EvictionWait {
			return true
		}
	}
	return false
}

// reservationOf is the status.reservation of a gang: its nodes, the reason and the time of
// the eviction; nil when nothing is kept for it.
func reservationOf(mem *Memory, gang string) *v1alpha1.Reservation {
	var out *v1alpha1.Reservation
	for n, r := range mem.reserved {
		if r.gang != gang {
			continue
		}
		if out == nil {
			out = &v1alpha1.Reservation{Reason: r.reason, Since: metav1.NewTime(r.at)}
		}
		if r.at.Before(out.Since.Time) {
			out.Since, out.Reason = metav1.NewTime(r.at), r.reason
		}
		out.Nodes = append(out.Nodes, n)
	}
	if out != nil {
		sort.Strings(out.Nodes)
	}
	return out
}
