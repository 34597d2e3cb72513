package solver

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// Failed searches on an unchanged input.
//
// A gang that does not fit waits, and the scheduler's cycles ask again: each search that
// fails may take the whole step budget. The search is deterministic (its bounds are work, not
// time): the same gang on a snapshot of the same objects fails with the same message. So the
// caller may say, with WithInput, that a snapshot is of the same input as the snapshots of
// earlier cycles with the same epoch (it starts a new epoch whenever anything a snapshot is
// built from may have changed, and now and then as a safety net), and the solver answers a
// gang that failed in the epoch with its last answer instead of searching again.
//
// Only a search on that snapshot as it was built counts: once a Solve on it succeeded the
// caller may have assumed the placement in it (capacity taken), so later answers on it are
// neither taken from nor given to the memo. A failure cut short by the wall-clock guard is
// not kept (another try may get further); neither are errors (bad input).

type inputKey struct{}

type cycleInput struct {
	snap  *snapshot.Snapshot
	epoch uint64
}

// WithInput returns ctx saying that snap is built from the same objects as every other
// snapshot given with the same epoch.
func WithInput(ctx context.Context, snap *snapshot.Snapshot, epoch uint64) context.Context {
	return context.WithValue(ctx, inputKey{}, cycleInput{snap: snap, epoch: epoch})
}

// Stats counts the solver's work since it was created.
type Stats struct {
	// Searches run.
	Searches uint64
	// Unchanged: gangs answered from the memo (the same input failed before).
	Unchanged uint64
}

// Stats returns the counters.
func (s *Solver) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// memo is the state of failed searches for the current epoch.
type memo struct {
	epoch uint64
	// snap is the last snapshot seen for the epoch; clean while no Solve on it succeeded.
	snap   *snapshot.Snapshot
	clean  bool
	failed map[string]Unschedulable
}

// memoLookup returns the gang's key when the memo applies to this Solve, and its earlier
// answer when there is one.
func (s *Solver) memoLookup(ctx context.Context, snap *snapshot.Snapshot, g *Gang) (string, *Unschedulable) {
	in, ok := ctx.Value(inputKey{}).(cycleInput)
	if !ok || in.snap != snap {
		return "", nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.memo.epoch != in.epoch || s.memo.failed == nil {
		s.memo = memo{epoch: in.epoch, failed: map[string]Unschedulable{}}
	}
	if s.memo.snap != snap {
		s.memo.snap, s.memo.clean = snap, true
	}
	if !s.memo.clean {
		return "", nil
	}
	key := gangKey(g)
	if u, ok := s.memo.failed[key]; ok {
		s.stats.Unchanged++
		return key, &u
	}
	return key, nil
}

// memoRecord keeps the outcome of a search that memoLookup allowed (key != "").
func (s *Solver) memoRecord(snap *snapshot.Snapshot, key string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.memo.snap != snap {
		return
	}
	if err == nil {
		s.memo.clean = false
		return
	}
	var u *Unschedulable
	if key != "" && s.memo.clean && asUnschedulable(err, &u) && !u.WallClock {
		s.memo.failed[key] = *u
	}
}

func asUnschedulable(err error, u **Unschedulable) bool {
	v, ok := err.(*Unschedulable)
	*u = v
	return ok
}

// gangKey is everything of a gang a search reads besides the snapshot: its pods (podKey) and
// claims (by UID and resourceVersion, with what the scheduler's overlay may change without a
// new resourceVersion: a claim's allocation and consumers), whom claims are reserved for,
// topology and the nodes to avoid.
func gangKey(g *Gang) string {
	// The search orders the pods itself (newSearch), so their order here does not matter:
	// the callers list them in informer order, which changes from cycle to cycle.
	pods := make([]string, 0, len(g.Pods))
	for _, p := range g.Pods {
		var b strings.Builder
		podKey(&b, p.Pod)
		for _, c := range p.Claims {
			fmt.Fprintf(&b, "%s/%s/%v/%d,", c.UID, c.ResourceVersion, c.Status.Allocation != nil, len(c.Status.ReservedFor))
		}
		if len(p.Consumers) > 0 {
			uids := make([]string, 0, len(p.Consumers))
			for uid, ref := range p.Consumers {
				uids = append(uids, fmt.Sprintf("%s=%s/%s/%s", uid, ref.Resource, ref.Name, ref.UID))
			}
			sort.Strings(uids)
			fmt.Fprintf(&b, "consumers%v", uids)
		}
		pods = append(pods, b.String())
	}
	sort.Strings(pods)
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|", g.Name, strings.Join(pods, "|"))
	if t := g.Topology; t != nil {
		fmt.Fprintf(&b, "topology %s/%v/%v/%s/%v|", t.Key, t.Required, t.RequiredKeys, t.PreferredKey, t.Levels)
	}
	if len(g.Avoid) > 0 {
		avoid := make([]string, 0, len(g.Avoid))
		for n, on := range g.Avoid {
			if on {
				avoid = append(avoid, n)
			}
		}
		sort.Strings(avoid)
		fmt.Fprintf(&b, "avoid%v", avoid)
	}
	return b.String()
}

// podKey writes what a search reads of a pod: its spec (by metadata.generation, which the API
// server increments on every spec change; by resourceVersion where it is not set), node,
// labels, annotations and claim statuses — not the rest of its status, which the scheduler
// itself writes after a failed search (the PodScheduled condition) and which would otherwise
// make every waiting gang look new once.
func podKey(b *strings.Builder, p *v1.Pod) {
	ver := "rv" + p.ResourceVersion
	if p.Generation > 0 {
		ver = "g" + strconv.FormatInt(p.Generation, 10)
	}
	fmt.Fprintf(b, "%s/%s/%s/%v/%v/", p.UID, ver, p.Spec.NodeName, p.Labels, p.Annotations)
	for _, st := range p.Status.ResourceClaimStatuses {
		fmt.Fprintf(b, "%s=%s,", st.Name, ptr.Deref(st.ResourceClaimName, "-"))
	}
	if e := p.Status.ExtendedResourceClaimStatus; e != nil {
		fmt.Fprintf(b, "ext=%s/%d", e.ResourceClaimName, len(e.RequestMappings))
	}
	b.WriteByte(';')
}
