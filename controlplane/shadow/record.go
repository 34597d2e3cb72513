package shadow

import (
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	shadowv1 "github.com/tessera-gpu/tessera/controlplane/api/shadow/v1alpha1"
	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/mapper"
)

// record is the shadow's state of one gang: the report as it should be, and what was last
// written of it.
type record struct {
	report shadowv1.ShadowReport
	// written is the report as last written (nil: never); a write happens only when the
	// report differs from it.
	written *shadowv1.ShadowReport
	// cycles counts tessera's decision cycles since the gang became ready; it goes into the
	// report only when tessera places the gang or the gang ends, so that a waiting gang costs
	// no write per cycle.
	cycles int32
	// pods are the gang's pods ever seen bound, by name.
	pods map[string]shadowv1.PodPlacement
}

func (r *record) key() string { return r.report.Gang.Namespace + "/" + r.report.Gang.Name }

func recordFromReport(rep *shadowv1.ShadowReport) *record {
	r := &record{report: *rep.DeepCopy(), written: rep.DeepCopy(), cycles: rep.Tessera.Cycles, pods: map[string]shadowv1.PodPlacement{}}
	for _, p := range rep.Actual.Pods {
		r.pods[p.Name] = p
	}
	return r
}

func newRecord(namespace string, g *observed) *record {
	name := reportName(g.namespace, g.mapping.Group)
	r := &record{pods: map[string]shadowv1.PodPlacement{}}
	r.report = shadowv1.ShadowReport{
		TypeMeta: metav1.TypeMeta{APIVersion: shadowv1.SchemeGroupVersion.String(), Kind: "ShadowReport"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{
			shadowv1.GangNamespaceLabel: labelValue(g.namespace), shadowv1.GangNameLabel: labelValue(g.mapping.Group),
		}},
		Gang: shadowv1.Gang{Namespace: g.namespace, Name: g.mapping.Group, Workload: g.mapping.Workload, SchedulerName: g.schedulerName},
	}
	return r
}

// reportName is namespace.gang, shortened with a hash when too long for an object name.
func reportName(namespace, gang string) string {
	name := namespace + "." + gang
	if len(name) <= 253 {
		return name
	}
	return fmt.Sprintf("%s-%08x", name[:240], fnv32(name))
}

func labelValue(s string) string {
	if len(s) <= 63 {
		return s
	}
	return fmt.Sprintf("%s-%08x", strings.TrimRight(s[:54], "-_."), fnv32(s))
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// observed is one gang as this cycle found it in the cluster.
type observed struct {
	namespace     string
	mapping       mapper.Mapping
	schedulerName string
	// group is the gang's PodGroup as tessera would have it (Shadow.podGroup): the mapper's,
	// or the hand-made one the pods name; nil when a named group does not exist.
	group *v1alpha1.PodGroup
	// pending and bound are its live pods (not finished, not being deleted); terminating
	// pods still hold their devices.
	pending, bound, terminating []*v1.Pod
	ended                       int // finished pods
}

func (g *observed) key() string { return g.namespace + "/" + g.mapping.Group }

func (g *observed) minMember() int32 {
	if g.group != nil {
		return max(1, g.group.Spec.MinMember)
	}
	return 1
}

func (g *observed) live() int { return len(g.pending) + len(g.bound) }

// isAIGang: more than one pod must go together, or its pods use devices.
func (g *observed) isAIGang() bool {
	if g.minMember() > 1 {
		return true
	}
	for _, list := range [][]*v1.Pod{g.pending, g.bound} {
		for _, p := range list {
			if len(p.Spec.ResourceClaims) > 0 || hasExtendedResource(p) {
				return true
			}
		}
	}
	return false
}

func hasExtendedResource(p *v1.Pod) bool {
	for _, c := range append(append([]v1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
		for name := range c.Resources.Requests {
			if s := string(name); strings.Contains(s, "/") && !strings.HasPrefix(s, "kubernetes.io/") && !strings.HasPrefix(s, "requests.") {
				return true
			}
		}
		for name := range c.Resources.Limits {
			if s := string(name); strings.Contains(s, "/") && !strings.HasPrefix(s, "kubernetes.io/") {
				return true
			}
		}
	}
	return false
}

// world is what this cycle reads of the cluster for the actual side.
type world struct {
	now    time.Time
	claims map[string]*resourceapi.ResourceClaim // namespace/name
	costs  costFunc
	// seen and bound: when the shadow saw pods and claims appear and pods get bound.
	seen, bound map[types.UID]time.Time
	// deadlockAfter, from the options.
	deadlockAfter time.Duration
}

// podClaims are the claims a pod uses that exist: by name, from templates (status), and its
// DRA extended-resource claim (extended: true).
func (w *world) podClaims(p *v1.Pod) (found []*resourceapi.ResourceClaim, missing int) {
	for _, pc := range p.Spec.ResourceClaims {
		name := ""
		if pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.Name == pc.Name && st.ResourceClaimName != nil {
				name = *st.ResourceClaimName
			}
		}
		if c := w.claims[p.Namespace+"/"+name]; name != "" && c != nil {
			found = append(found, c)
		} else if pc.ResourceClaimTemplateName != nil || pc.ResourceClaimName != nil {
			missing++
		}
	}
	return found, missing
}

func (w *world) extendedClaim(p *v1.Pod) *resourceapi.ResourceClaim {
	if st := p.Status.ExtendedResourceClaimStatus; st != nil {
		return w.claims[p.Namespace+"/"+st.ResourceClaimName]
	}
	return nil
}

// when is when the shadow first saw an object; for objects that existed when it started,
// their creation.
func (w *world) when(uid types.UID, created metav1.Time) time.Time {
	if t, ok := w.seen[uid]; ok {
		return t
	}
	return created.Time
}

// boundAt is when a pod was bound: seen by the shadow, else its PodScheduled condition,
// else its creation.
func (w *world) boundAt(p *v1.Pod) time.Time {
	if t, ok := w.bound[p.UID]; ok {
		return t
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	return w.when(p.UID, p.CreationTimestamp)
}

// observeGang brings the gang's identity, readiness and actual outcome up to date.
func (r *record) observeGang(w *world, g *observed) {
	rep := &r.report
	minMember := g.minMember()
	rep.Gang.MinMember = minMember
	if g.group != nil {
		rep.Gang.Queue = g.group.Spec.Queue
	}
	rep.Gang.MappedReason, rep.Gang.MappedMessage = g.mapping.Reason, g.mapping.Message
	if g.mapping.Workload != "" {
		rep.Gang.Workload = g.mapping.Workload
	}
	if rep.Gang.ReadyTime == nil {
		rep.Gang.Pods = int32(g.live())
		if at, ok := readyAt(w, g, minMember); ok {
			rep.Gang.ReadyTime = micro(at)
		}
	}

	// Actual: the pods bound now, where and when.
	for _, p := range g.bound {
		pl := shadowv1.PodPlacement{Name: p.Name, Node: p.Spec.NodeName, BoundTime: micro(w.boundAt(p))}
		if prev, ok := r.pods[p.Name]; ok && prev.Node == pl.Node && prev.BoundTime != nil {
			pl.BoundTime = prev.BoundTime // the first sighting stands
		}
		claims, _ := w.podClaims(p)
		if c := w.extendedClaim(p); c != nil {
			claims = append(claims, c)
		}
		pl.Devices = devicesOf(claims)
		r.pods[p.Name] = pl
	}
	a := &rep.Actual
	a.Bound = int32(len(g.bound))
	live := map[string]bool{}
	for _, p := range g.bound {
		live[p.Name] = true
	}
	var times []time.Time
	nodes := map[string]bool{}
	a.Pods = nil
	for _, pl := range r.pods {
		a.Pods = append(a.Pods, pl)
		times = append(times, pl.BoundTime.Time)
		if live[pl.Name] {
			nodes[pl.Node] = true
		}
	}
	sort.Slice(a.Pods, func(i, j int) bool { return a.Pods[i].Name < a.Pods[j].Name })
	a.Nodes = sortedKeys(nodes)
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	units, counted := 0.0, map[types.UID]bool{}
	for _, p := range g.bound {
		claims, _ := w.podClaims(p)
		if c := w.extendedClaim(p); c != nil {
			claims = append(claims, c)
		}
		for _, c := range claims {
			if !counted[c.UID] && c.Status.Allocation != nil {
				counted[c.UID] = true
				units += w.costs.allocation(c.Status.Allocation)
			}
		}
	}
	if units > 0 || a.GPUUnits != nil {
		a.GPUUnits = units3(units)
	}
	if len(times) > 0 && a.FirstBoundTime == nil {
		a.FirstBoundTime = micro(times[0])
	}
	if a.FullyBoundTime == nil && int32(len(g.bound)) >= minMember && len(times) >= int(minMember) {
		a.FullyBoundTime = micro(times[minMember-1])
	}
	if minMember > 1 && a.FirstBoundTime != nil {
		a.PartialStartTime = a.FirstBoundTime
		if a.FullyBoundTime != nil {
			a.PartialEndTime = a.FullyBoundTime
			// The pods bound before the minMember-th (for bindings the shadow did not watch
			// one by one, e.g. before it started).
			before := int32(0)
			for _, t := range times {
				if t.Before(a.FullyBoundTime.Time) {
					before++
				}
			}
			a.MaxPartial = max(a.MaxPartial, min(before, minMember-1))
		} else {
			a.MaxPartial = max(a.MaxPartial, min(int32(len(g.bound)), minMember-1))
		}
		if a.PartialEndTime != nil && !a.PartialEndTime.After(a.PartialStartTime.Time) {
			// Bound at once: never partly placed.
			a.PartialStartTime, a.PartialEndTime, a.MaxPartial = nil, nil, 0
		}
	}
	r.checkDeadlock(w, g, times)
}

// readyAt: the gang is ready once minMember pods and every claim those pods need exist; it
// became ready at the later of the minMember-th pod's and those claims' appearance.
func readyAt(w *world, g *observed, minMember int32) (time.Time, bool) {
	pods := append(append([]*v1.Pod(nil), g.pending...), g.bound...)
	if len(pods) < int(minMember) {
		return time.Time{}, false
	}
	sort.Slice(pods, func(i, j int) bool {
		return w.when(pods[i].UID, pods[i].CreationTimestamp).Before(w.when(pods[j].UID, pods[j].CreationTimestamp))
	})
	at := w.when(pods[minMember-1].UID, pods[minMember-1].CreationTimestamp)
	for _, p := range pods {
		claims, missing := w.podClaims(p)
		if missing > 0 {
			return time.Time{}, false
		}
		for _, c := range claims {
			if t := w.when(c.UID, c.CreationTimestamp); t.After(at) {
				at = t
			}
		}
	}
	return at, true
}

// checkDeadlock: partly placed, every waiting pod unschedulable by its scheduler, and no
// pod of the gang bound for the deadlock timeout.
func (r *record) checkDeadlock(w *world, g *observed, times []time.Time) {
	a := &r.report.Actual
	if a.DeadlockTime != nil || a.FullyBoundTime != nil || len(g.bound) == 0 || len(g.pending) == 0 || len(times) == 0 {
		return
	}
	last := times[len(times)-1]
	if w.now.Sub(last) < w.deadlockAfter {
		return
	}
	why := ""
	for _, p := range g.pending {
		c := podScheduled(p)
		if c == nil || c.Status != v1.ConditionFalse || c.Reason != v1.PodReasonUnschedulable {
			return
		}
		if why == "" {
			why = c.Message
		}
	}
	a.DeadlockTime = micro(w.now)
	a.DeadlockMessage = fmt.Sprintf("%d of %d pods bound and none more for %s; %d waiting pods unschedulable: %s",
		len(g.bound), g.minMember(), w.deadlockAfter, len(g.pending), why)
}

func podScheduled(p *v1.Pod) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// devicesOf lists the allocated devices of claims, driver/pool/device, sorted.
func devicesOf(claims []*resourceapi.ResourceClaim) []string {
	set := map[string]bool{}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			set[res.Driver+"/"+res.Pool+"/"+res.Device] = true
		}
	}
	return sortedKeys(set)
}

func sortedKeys(m map[string]bool) []string {
	if len(m) == 0 {
		return nil
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func micro(t time.Time) *metav1.MicroTime {
	m := metav1.NewMicroTime(t.Truncate(time.Microsecond))
	return &m
}

// units3 renders GPU units with three decimals, as Queue statuses do.
func units3(v float64) *resource.Quantity {
	return resource.NewMilliQuantity(int64(v*1000+0.5), resource.DecimalSI)
}

func percent(v float64) *int32 {
	p := int32(v*100 + 0.5)
	return &p
}
