package decide

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/filters/filterstest"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
	"github.com/tessera-gpu/tessera/controlplane/solver"
)

var features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	ConsumableCapacity: true,
}

// sim is an in-memory cluster for the policy: no API server. A cycle builds the input from
// its objects, calls Decide, and applies the decisions the way the effects layer and the
// kubelet would (pods bound and running, claims allocated, statuses written, evicted pods
// gone).
type sim struct {
	t      *testing.T
	ctx    context.Context
	cfg    Config
	mem    *Memory
	now    time.Time
	nodes  []*v1.Node
	slices []*resourceapi.ResourceSlice
	claims map[string]*resourceapi.ResourceClaim
	pods   map[string]*v1.Pod
	pgs    map[string]*v1alpha1.PodGroup
	// desired: the mapper's PodGroups of mapped gangs (mappedGang), by gang key; such a gang's
	// PodGroup exists (pgs) only once a cycle's writes or commit created it.
	desired map[string]*v1alpha1.PodGroup
	queues  map[string]*v1alpha1.Queue
	// upstream: scheduling.k8s.io PodGroups of gangs, by gang key (optional).
	upstream map[string]*schedulingv1beta1.PodGroup
	capGen   uint64
	seq      int
	// cache builds each cycle's snapshot as the scheduler does (Cache.Snapshot), so that
	// the victim simulations derive their what-ifs from its state (snapshot.WhatIf).
	cache *snapshot.Cache
}

func newSim(t *testing.T) *sim {
	_, ctx := ktesting.NewTestContext(t)
	cache := snapshot.NewCache()
	cfg := Config{
		Solver:   solver.New(solver.Config{Filters: filterstest.New(t)}),
		Snapshot: snapshot.Config{Features: features, Cache: cache},
	}
	return &sim{t: t, ctx: ctx, cfg: cfg, mem: NewMemory(), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), cache: cache,
		claims: map[string]*resourceapi.ResourceClaim{}, pods: map[string]*v1.Pod{}, pgs: map[string]*v1alpha1.PodGroup{}, desired: map[string]*v1alpha1.PodGroup{}, queues: map[string]*v1alpha1.Queue{}}
}

func (s *sim) node(name string, gpus int) {
	s.nodes = append(s.nodes, fixture.Node(name, map[string]string{v1.LabelHostname: name}))
	s.slices = append(s.slices, fixture.WholeGPUSlices(name, gpus)...)
}

func (s *sim) queue(name, parent, quota, limit string, weight int32) {
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("q-" + name), ResourceVersion: "1"}, Spec: v1alpha1.QueueSpec{Parent: parent}}
	rq := &v1alpha1.ResourceQuota{OverQuotaWeight: ptr.To(weight)}
	if quota != "" {
		rq.Quota = ptr.To(resource.MustParse(quota))
	}
	if limit != "" {
		rq.Limit = ptr.To(resource.MustParse(limit))
	}
	q.Spec.Resources.GPU = rq
	s.queues[name] = q
}

// gang adds a PodGroup of minMember pods (n pods in all) with one claim of gpus whole GPUs each.
func (s *sim) gang(name, queue string, n int, gpus int64, mutate ...func(*v1alpha1.PodGroup)) {
	s.seq++
	pg := &v1alpha1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("pg-" + name), Generation: 1, ResourceVersion: "1",
			CreationTimestamp: metav1.NewTime(s.now.Add(time.Duration(s.seq) * time.Second))},
		Spec: v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: queue},
	}
	for _, m := range mutate {
		m(pg)
	}
	s.pgs["ns/"+name] = pg
	for i := range n {
		s.pod(name, fmt.Sprintf("%s-%d", name, i), gpus)
	}
}

// mappedGang adds a gang the mapper found (a lone pod, a workload's gang): its PodGroup is
// the mapper's Desired one and does not exist until a cycle creates it.
func (s *sim) mappedGang(name, queue string, n int, gpus int64, mutate ...func(*v1alpha1.PodGroup)) {
	pg := &v1alpha1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec:       v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: queue},
	}
	for _, m := range mutate {
		m(pg)
	}
	s.desired["ns/"+name] = pg
	for i := range n {
		s.pod(name, fmt.Sprintf("%s-%d", name, i), gpus)
	}
}

// createPodGroup creates a mapped gang's PodGroup as the API server would.
func (s *sim) createPodGroup(desired *v1alpha1.PodGroup) {
	key := desired.Namespace + "/" + desired.Name
	if s.pgs[key] != nil {
		s.t.Fatalf("PodGroup %s created twice", key)
	}
	pg := desired.DeepCopy()
	pg.UID, pg.Generation, pg.ResourceVersion = types.UID("pg-"+desired.Name), 1, "1"
	pg.CreationTimestamp = metav1.NewTime(s.now)
	s.pgs[key] = pg
}

func (s *sim) pod(group, name string, gpus int64) {
	c := fixture.GPUClaim("ns", name, gpus)
	s.claims["ns/"+c.Name] = c
	p := fixture.Pod("ns", name, c.Name)
	p.Annotations = map[string]string{v1alpha1.PodGroupAnnotation: group}
	p.ResourceVersion = "1"
	p.CreationTimestamp = metav1.NewTime(s.now)
	s.pods["ns/"+name] = p
}

func (s *sim) input() Input {
	var in Input
	in.Now = s.now
	in.CapacityGen = s.capGen
	in.Raw = snapshot.Input{Nodes: s.nodes, Slices: s.slices, Classes: fixture.DeviceClasses()}
	for _, k := range sortedKeys(s.claims) {
		in.Raw.Claims = append(in.Raw.Claims, s.claims[k])
	}
	for _, k := range sortedKeys(s.pods) {
		in.Raw.Pods = append(in.Raw.Pods, s.pods[k])
	}
	in.Snapshot = s.cache.Snapshot(in.Raw, s.cfg.Snapshot)
	for _, k := range sortedKeys(s.queues) {
		in.Queues = append(in.Queues, s.queues[k])
	}
	gangs := map[string]*Gang{}
	for _, p := range in.Raw.Pods {
		key := "ns/" + p.Annotations[v1alpha1.PodGroupAnnotation]
		g := gangs[key]
		if g == nil {
			g = &Gang{Key: key, PodGroup: s.pgs[key], MappedReason: v1alpha1.ReasonManual, Upstream: s.upstream[key], Desired: s.desired[key]}
			gangs[key] = g
		}
		switch {
		case p.Status.Phase == v1.PodSucceeded:
			g.Succeeded++
		case p.Spec.NodeName == "":
			g.Pending = append(g.Pending, p)
		default:
			g.Bound = append(g.Bound, p)
			g.Running++
		}
	}
	for _, k := range sortedKeys(gangs) {
		in.Gangs = append(in.Gangs, gangs[k])
	}
	return in
}

// cycle runs one Decide and applies its decisions; time then moves on by step.
func (s *sim) cycle(step time.Duration) *Decisions {
	s.t.Helper()
	d := Decide(s.ctx, s.cfg, s.input(), s.mem)
	s.apply(d, true)
	s.now = s.now.Add(step)
	return d
}

// apply applies a cycle's decisions; evicted pods are removed only when evict is set (else
// they are still going away: their pods and claims stay).
func (s *sim) apply(d *Decisions, evict bool) {
	for _, pg := range d.PodGroups {
		if s.pgs[pg.Namespace+"/"+pg.Name] == nil {
			s.createPodGroup(pg)
		}
	}
	for _, p := range d.Placements {
		if p.CreatePodGroup != nil {
			s.createPodGroup(p.CreatePodGroup)
		}
		for _, pl := range p.Result.Placements {
			pod := s.pods["ns/"+pl.Pod.Name].DeepCopy()
			pod.Spec.NodeName = pl.Node
			pod.Status.Phase = v1.PodRunning
			pod.ResourceVersion = bump(pod.ResourceVersion)
			s.pods["ns/"+pod.Name] = pod
			for _, ca := range pl.Allocate {
				c := s.claims["ns/"+ca.Claim.Name].DeepCopy()
				c.Status.Allocation = ca.Allocation
				c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
				s.claims["ns/"+c.Name] = c
			}
		}
	}
	for _, st := range d.Statuses {
		pg := s.pgs[st.PodGroup.Namespace+"/"+st.PodGroup.Name].DeepCopy()
		pg.Status = st.Status
		pg.ResourceVersion = bump(pg.ResourceVersion)
		s.pgs[pg.Namespace+"/"+pg.Name] = pg
	}
	for _, st := range d.QueueStatuses {
		q := s.queues[st.Queue.Name].DeepCopy()
		q.Status = st.Status
		s.queues[q.Name] = q
	}
	for _, pc := range d.PodConditions {
		pod := s.pods["ns/"+pc.Pod.Name].DeepCopy()
		pod.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable, Message: pc.Message}}
		s.pods["ns/"+pod.Name] = pod
	}
	if evict {
		for _, p := range d.Evictions {
			s.remove(p.Name)
		}
	}
}

// remove deletes a pod and releases its claims, as the kubelet and the claim controller do.
func (s *sim) remove(pod string) {
	p := s.pods["ns/"+pod]
	delete(s.pods, "ns/"+pod)
	for _, pc := range p.Spec.ResourceClaims {
		c := s.claims["ns/"+*pc.ResourceClaimName].DeepCopy()
		c.Status.Allocation, c.Status.ReservedFor = nil, nil
		s.claims["ns/"+c.Name] = c
	}
	s.capGen++
}

// finish completes a gang's pods: they succeed and release their devices.
func (s *sim) finish(group string) {
	for k, p := range s.pods {
		if p.Annotations[v1alpha1.PodGroupAnnotation] != group {
			continue
		}
		p = p.DeepCopy()
		p.Status.Phase = v1.PodSucceeded
		s.pods[k] = p
		for _, pc := range p.Spec.ResourceClaims {
			c := s.claims["ns/"+*pc.ResourceClaimName].DeepCopy()
			c.Status.Allocation, c.Status.ReservedFor = nil, nil
			s.claims["ns/"+c.Name] = c
		}
	}
	s.capGen++
}

// boundGPUs counts, per queue, the GPUs of bound, unfinished pods.
func (s *sim) boundGPUs() map[string]int64 {
	out := map[string]int64{}
	for _, p := range s.pods {
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded {
			continue
		}
		q := s.pgs["ns/"+p.Annotations[v1alpha1.PodGroupAnnotation]].Spec.Queue
		c := s.claims["ns/"+*p.Spec.ResourceClaims[0].ResourceClaimName]
		out[q] += c.Spec.Devices.Requests[0].Exactly.Count
		if parent := s.queues[q].Spec.Parent; parent != "" {
			out[parent] += c.Spec.Devices.Requests[0].Exactly.Count
		}
	}
	return out
}

func (s *sim) condition(group, typ string) metav1.Condition {
	for _, c := range s.pgs["ns/"+group].Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

func bump(rv string) string {
	var n int
	_, _ = fmt.Sscan(rv, &n)
	return fmt.Sprint(n + 1)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
