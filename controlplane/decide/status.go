package decide

import (
	"fmt"
	"math"
	"slices"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/quota"
)

// ReasonGangIncomplete is the Event reason of a gang that has had fewer pods than minMember
// for longer than the formation timeout.
const ReasonGangIncomplete = "GangIncomplete"

// desiredStatus computes the status the gang's PodGroup should have, its upstream PodGroup's
// condition, and the PodScheduled conditions of its waiting pods; only what differs from what
// the objects show now is added to d. Messages carry no clocks (times go in
// lastTransitionTime, which only changes with a condition's status), so a gang whose reason
// did not change produces nothing.
func desiredStatus(in Input, d *Decisions, mem *Memory, g *gangState) {
	if g.PodGroup == nil {
		return
	}
	now := metav1.NewTime(in.Now)
	st := g.PodGroup.Status.DeepCopy()
	st.Members = int32(len(g.pending) + len(g.bound))
	st.Scheduled = int32(len(g.bound))
	st.Running = int32(g.Running)
	st.Succeeded, st.Failed = int32(g.Succeeded), int32(g.Failed)
	st.QueuePosition = g.position
	st.Reservation = nil
	if len(g.pending) > 0 {
		st.Reservation = reservationOf(mem, g.Key)
	}
	minMember := int(g.pg.Spec.MinMember)
	switch {
	case len(g.pending) == 0 && len(g.bound) == 0 && g.Succeeded+g.Failed > 0:
		st.Phase = v1alpha1.PodGroupFinished
	case g.Running+g.Succeeded >= minMember:
		st.Phase = v1alpha1.PodGroupRunning
	case len(g.bound)+g.Succeeded >= minMember:
		st.Phase = v1alpha1.PodGroupScheduled
	default:
		st.Phase = v1alpha1.PodGroupPending
	}
	gen := g.PodGroup.Generation
	set := func(t string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: now})
	}
	if g.MappedReason != "" {
		set(v1alpha1.PodGroupConditionMapped, metav1.ConditionTrue, g.MappedReason, g.MappedMessage)
	}
	if g.queueOK {
		set(v1alpha1.PodGroupConditionQueueResolved, metav1.ConditionTrue, v1alpha1.ReasonQueueFound, fmt.Sprintf("queue %q", g.pg.Spec.Queue))
	} else if isQueueReason(g.reason) {
		set(v1alpha1.PodGroupConditionQueueResolved, metav1.ConditionFalse, g.reason, g.message)
	}
	scheduled := len(g.bound) >= minMember
	switch {
	case scheduled:
		msg := fmt.Sprintf("%d of %d pods bound", len(g.bound), st.Members)
		if len(g.pending) > 0 && g.reason != v1alpha1.ReasonScheduled && g.reason != "" {
			msg += fmt.Sprintf("; %d more wait: %s: %s", len(g.pending), g.reason, g.message)
		}
		set(v1alpha1.PodGroupConditionScheduled, metav1.ConditionTrue, v1alpha1.ReasonScheduled, msg)
	case g.reason != "" && g.reason != v1alpha1.ReasonScheduled:
		set(v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, g.reason, g.message)
	}
	if !statusEqual(&g.PodGroup.Status, st) {
		d.Statuses = append(d.Statuses, PodGroupStatus{PodGroup: g.PodGroup, Status: *st})
	}

	if g.formationDue {
		warn(d, mem, g.Key, g.PodGroup, ReasonGangIncomplete, g.message)
	}
	// Waiting pods say why, as the kube-scheduler's do; not for the member and claim counts,
	// which change with every pod a workload creates (writing each pod for each change is
	// quadratic) — unless the gang has been incomplete for longer than the formation timeout.
	if g.formationDue || podReason(g.reason) {
		msg := fmt.Sprintf("gang %s: %s: %s", g.Key, g.reason, g.message)
		for _, p := range g.pending {
			if c := podCondition(p, v1.PodScheduled); c != nil && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable && c.Message == msg {
				continue
			}
			d.PodConditions = append(d.PodConditions, PodCondition{Pod: p, Message: msg})
		}
	}

	if g.Upstream != nil {
		// True only once the pods are bound (the binding of a gang placed this cycle is
		// still in flight).
		upstreamStatus(in, d, g, len(g.Bound) >= minMember)
	}
}

// upstreamStatus writes the scheduling.k8s.io PodGroup's PodGroupInitiallyScheduled condition
// as the kube-scheduler does: True (reason Scheduled) once the gang is placed, which is final;
// until then False with reason Unschedulable (or SchedulerError for bad input) and the
// message.
func upstreamStatus(in Input, d *Decisions, g *gangState, scheduled bool) {
	conds := append([]metav1.Condition(nil), g.Upstream.Status.Conditions...)
	if c := meta.FindStatusCondition(conds, schedulingv1beta1.PodGroupInitiallyScheduled); c != nil && c.Status == metav1.ConditionTrue {
		return
	}
	cond := metav1.Condition{Type: schedulingv1beta1.PodGroupInitiallyScheduled, ObservedGeneration: g.Upstream.Generation, LastTransitionTime: metav1.NewTime(in.Now)}
	switch {
	case scheduled:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "Scheduled", fmt.Sprintf("%d pods bound by tessera-scheduler", len(g.Bound))
	case g.reason == "" || g.reason == v1alpha1.ReasonScheduled:
		return // placed this cycle: True once bound
	case len(g.message) > 14 && g.message[:14] == "invalid input:":
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, schedulingv1beta1.PodGroupReasonSchedulerError, g.message
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, schedulingv1beta1.PodGroupReasonUnschedulable, g.reason+": "+g.message
	}
	meta.SetStatusCondition(&conds, cond)
	if !equality.Semantic.DeepEqual(conds, g.Upstream.Status.Conditions) {
		d.UpstreamStatuses = append(d.UpstreamStatuses, UpstreamStatus{PodGroup: g.Upstream, Conditions: conds})
	}
}

// statusEqual is equality.Semantic.DeepEqual for PodGroup statuses (nil and empty lists
// are equal, times compare as instants in UTC), written out: the reflective comparison of
// every gang's status in every cycle was 7 % of the scheduler's CPU under churn.
// TestStatusEqualIsSemanticDeepEqual keeps the two in step.
func statusEqual(a, b *v1alpha1.PodGroupStatus) bool {
	if a.Phase != b.Phase || a.Members != b.Members || a.Scheduled != b.Scheduled || a.Running != b.Running ||
		a.Succeeded != b.Succeeded || a.Failed != b.Failed {
		return false
	}
	if (a.QueuePosition == nil) != (b.QueuePosition == nil) || a.QueuePosition != nil && *a.QueuePosition != *b.QueuePosition {
		return false
	}
	if (a.Reservation == nil) != (b.Reservation == nil) {
		return false
	}
	if ra, rb := a.Reservation, b.Reservation; ra != nil {
		if ra.Reason != rb.Reason || ra.Since.UTC() != rb.Since.UTC() || !slices.Equal(ra.Nodes, rb.Nodes) {
			return false
		}
	}
	if len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		ca, cb := &a.Conditions[i], &b.Conditions[i]
		if ca.Type != cb.Type || ca.Status != cb.Status || ca.ObservedGeneration != cb.ObservedGeneration ||
			ca.Reason != cb.Reason || ca.Message != cb.Message || ca.LastTransitionTime.UTC() != cb.LastTransitionTime.UTC() {
			return false
		}
	}
	return true
}

func isQueueReason(r string) bool {
	return r == v1alpha1.ReasonNoQueue || r == v1alpha1.ReasonQueueNotFound || r == v1alpha1.ReasonQueueInvalid
}

// podReason: reasons that are stable while a gang waits, so its pods are told.
func podReason(r string) bool {
	switch r {
	case v1alpha1.ReasonUnschedulable, v1alpha1.ReasonQuotaExceeded, v1alpha1.ReasonCommitFailed:
		return true
	}
	return isQueueReason(r)
}

func podCondition(p *v1.Pod, t v1.PodConditionType) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// queueStatuses computes Queue statuses that differ from what the Queues show.
func queueStatuses(cfg Config, d *Decisions, tree *quota.Tree, capacity quota.Usage, now metav1.Time) {
	for _, n := range tree.Nodes() {
		st := n.Queue.Status.DeepCopy()
		st.Allocated = toQuantities(n.Allocated)
		st.FairShare = toQuantities(n.FairShare)
		if cfg.UsageHalfLife > 0 {
			st.Usage = decayedUsage(cfg, n, capacity, now)
		}
		req := quota.Usage{}
		req.Add(n.Allocated)
		req.Add(n.Requested)
		st.Requested = toQuantities(req)
		// SetStatusCondition keeps the transition time while the status holds.
		cond := metav1.Condition{Type: v1alpha1.QueueConditionValid, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonValid, Message: "parent chain resolves to a root", ObservedGeneration: n.Queue.Generation, LastTransitionTime: now}
		if n.Invalid != "" {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, n.InvalidReason, n.Invalid
		}
		meta.SetStatusCondition(&st.Conditions, cond)
		if !equality.Semantic.DeepEqual(&n.Queue.Status, st) {
			d.QueueStatuses = append(d.QueueStatuses, QueueStatus{Queue: n.Queue, Status: *st})
		}
	}
}

// decayedUsage moves the queue's usage history on to now: per resource, the average decays
// by half every half-life towards what the queue holds now (a fraction of capacity), as an
// exponentially weighted integral sampled once per UsagePeriod (the usage is taken as what
// it is now since the last sample). It is kept in thousandths in the Queue's status, which a
// restarted scheduler continues from; an average that does not move in its third decimal is
// not rewritten (an idle, steady cluster costs no writes) and then decays from its older
// time the next time.
func decayedUsage(cfg Config, n *quota.Node, capacity quota.Usage, now metav1.Time) *v1alpha1.QueueUsage {
	prev := n.Queue.Status.Usage
	cur := map[string]float64{}
	for _, r := range quota.Resources {
		if capacity[r] > 0 {
			cur[r] = math.Min(1, n.Allocated[r]/capacity[r])
		}
	}
	if prev == nil || prev.UpdateTime.IsZero() {
		return &v1alpha1.QueueUsage{Average: fractions(map[string]float64{}), HalfLife: metav1.Duration{Duration: cfg.UsageHalfLife}, UpdateTime: now}
	}
	dt := now.Sub(prev.UpdateTime.Time)
	if dt < cfg.UsagePeriod && prev.HalfLife.Duration == cfg.UsageHalfLife {
		return prev.DeepCopy()
	}
	decay := math.Exp2(-dt.Seconds() / cfg.UsageHalfLife.Seconds())
	avg := map[string]float64{}
	for _, r := range quota.Resources {
		old := prev.Average[r]
		avg[r] = old.AsApproximateFloat64()*decay + cur[r]*(1-decay)
	}
	next := &v1alpha1.QueueUsage{Average: fractions(avg), HalfLife: metav1.Duration{Duration: cfg.UsageHalfLife}, UpdateTime: now}
	if equality.Semantic.DeepEqual(next.Average, prev.Average) && prev.HalfLife == next.HalfLife {
		return prev.DeepCopy()
	}
	return next
}

func fractions(u map[string]float64) map[string]resource.Quantity {
	out := map[string]resource.Quantity{}
	for _, r := range quota.Resources {
		out[r] = *resource.NewMilliQuantity(int64(math.Round(u[r]*1000)), resource.DecimalSI)
	}
	return out
}

// toQuantities renders usage: GPU units with three decimals, CPU in millicores, memory bytes.
func toQuantities(u quota.Usage) map[string]resource.Quantity {
	out := map[string]resource.Quantity{}
	for _, r := range quota.Resources {
		v := u[r]
		switch r {
		case v1alpha1.ResourceMemory:
			out[r] = *resource.NewQuantity(int64(v), resource.BinarySI)
		default:
			out[r] = *resource.NewMilliQuantity(int64(math.Round(v*1000)), resource.DecimalSI)
		}
	}
	return out
}
