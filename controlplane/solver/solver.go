// Package solver places one gang at a time on a snapshot: it searches pod → node assignments
// in memory, checks each pod's devices with the structured allocator, carries the devices
// chosen for earlier pods of the gang as allocated, and backtracks across pods when a later pod
// does not fit. Nothing is written to the API here; the committer does that.
package solver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// Config tunes the search.
type Config struct {
	// TopologyKeys are node label keys whose values are topology domains (rack, NVLink
	// domain), most specific first. A gang is kept inside one domain of the first key when it
	// fits there. A gang's own topology constraint overrides this.
	TopologyKeys []string
	// Spread orders nodes emptiest first; the default (false) packs GPUs: fullest first.
	Spread bool
	// MaxTries bounds the search: node evaluations per gang (memoised ones included).
	// Default 50000.
	MaxTries int
	// JointTimeout bounds one joint re-allocation of all gang pods on a node. Default 20ms.
	JointTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxTries <= 0 {
		c.MaxTries = 50000
	}
	if c.JointTimeout <= 0 {
		c.JointTimeout = 20 * time.Millisecond
	}
	return c
}

// Pod is one pending pod of a gang with its ResourceClaims (in spec.resourceClaims order).
type Pod struct {
	Pod    *v1.Pod
	Claims []*resourceapi.ResourceClaim
}

// Topology constrains a gang to one domain of a node label.
type Topology struct {
	Key      string
	Required bool
}

// Gang is what the solver places: all Pods or none.
type Gang struct {
	// Name for messages (namespace/podgroup).
	Name string
	Pods []Pod
	// Topology, when set, overrides the configured keys.
	Topology *Topology
}

// Placement is the decision for one pod.
type Placement struct {
	Pod  *v1.Pod
	Node string
	// Allocate are the claims this pod allocates, with their new allocation.
	Allocate []ClaimAllocation
	// Reserve are claims the pod uses that are (or will be, by an earlier pod of the gang)
	// allocated; the committer only adds the pod to reservedFor.
	Reserve []*resourceapi.ResourceClaim
}

// ClaimAllocation pairs a claim with the allocation chosen for it.
type ClaimAllocation struct {
	Claim      *resourceapi.ResourceClaim
	Allocation *resourceapi.AllocationResult
}

// Result is a solved gang.
type Result struct {
	Placements []Placement
	// GPUUnits are the GPU units of the new allocations.
	GPUUnits float64
	// Tries is the number of node evaluations the search took.
	Tries int
	// Domain is the topology domain the gang was placed in ("" when none applied).
	Domain string
}

// Unschedulable says why a gang does not fit, in numbers.
type Unschedulable struct {
	Message string
}

func (u *Unschedulable) Error() string { return u.Message }

// IsUnschedulable reports whether err says the gang does not fit (as opposed to bad input).
func IsUnschedulable(err error) bool {
	var u *Unschedulable
	return errors.As(err, &u)
}

// Solver holds caches that survive across cycles (shape signatures of immutable claim specs).
type Solver struct {
	cfg Config

	mu        sync.Mutex
	claimSigs map[types.UID]uint64
}

// New returns a solver.
func New(cfg Config) *Solver {
	return &Solver{cfg: cfg.withDefaults(), claimSigs: map[types.UID]uint64{}}
}

// Solve searches a placement for every pod of the gang. It returns *Unschedulable when none
// exists (or none was found within the budget), any other error for bad input (a CEL error, a
// missing DeviceClass). The snapshot is not modified.
func (s *Solver) Solve(ctx context.Context, snap *snapshot.Snapshot, gang *Gang) (*Result, error) {
	logger := klog.FromContext(ctx)
	if len(gang.Pods) == 0 {
		return &Result{}, nil
	}
	st := s.newSearch(ctx, snap, gang)
	st.preferPlain = st.preferPlainGPUs()
	plans := st.domainPlans()
	var lastErr error
	for _, plan := range plans {
		if st.tries >= s.cfg.MaxTries {
			break
		}
		ok, err := st.run(plan.nodes)
		if err != nil {
			return nil, err
		}
		if ok {
			res := st.result()
			res.Domain = plan.domain
			logger.V(4).Info("Gang solved", "gang", gang.Name, "pods", len(gang.Pods), "domain", plan.domain, "tries", st.tries, "gpuUnits", res.GPUUnits)
			return res, nil
		}
	}
	lastErr = &Unschedulable{Message: st.explain(plans)}
	logger.V(4).Info("Gang does not fit", "gang", gang.Name, "tries", st.tries, "reason", lastErr)
	return nil, lastErr
}

// podInfo is the solver's precomputed view of a gang pod.
type podInfo struct {
	pod      *v1.Pod
	claims   []*resourceapi.ResourceClaim
	shape    int // index into distinct shapes; equal shapes are interchangeable
	requests v1.ResourceList
	affinity nodeaffinity.RequiredNodeAffinity
	flexible bool // has prioritized-list requests: other pods' picks may be redone jointly
	gpuNeed  float64
}

type claimKey struct{ namespace, name string }

// placed is one pod's tentative placement.
type placed struct {
	node int
	// owned claims this pod allocates and their tentative results.
	owned   []claimKey
	results []resourceapi.AllocationResult
}

type nodeGang struct {
	pods      []int // gang pods on the node
	requested v1.ResourceList
}

type search struct {
	ctx   context.Context
	s     *Solver
	snap  *snapshot.Snapshot
	gang  *Gang
	pods  []*podInfo
	order []int // pod indices in search order

	placements []*placed // by pod index
	onNode     map[int]*nodeGang
	// owner of a tentatively allocated claim: pod index
	owner map[claimKey]int

	claims     map[claimKey]*resourceapi.ResourceClaim
	staticOK   map[[2]int]string // (shape,node) → "" or reason
	failMemo   map[string]struct{}
	tries      int
	bestDepth  int
	failReason map[string]int // reasons for the pod at bestDepth
	failPod    string
	budgetHit  bool
	// plainFree is, per node index, its free non-partitionable whole GPUs;
	// preferPlain orders nodes that have some first (see preferPlainGPUs).
	plainFree   map[int]int
	preferPlain bool
}

func (s *Solver) newSearch(ctx context.Context, snap *snapshot.Snapshot, gang *Gang) *search {
	st := &search{
		ctx: ctx, s: s, snap: snap, gang: gang,
		placements: make([]*placed, len(gang.Pods)),
		onNode:     map[int]*nodeGang{},
		owner:      map[claimKey]int{},
		staticOK:   map[[2]int]string{},
		claims:     map[claimKey]*resourceapi.ResourceClaim{},
		failMemo:   map[string]struct{}{},
	}
	shapeIDs := map[uint64]int{}
	for _, gp := range gang.Pods {
		pi := &podInfo{
			pod:      gp.Pod,
			claims:   gp.Claims,
			requests: snapshot.PodRequests(gp.Pod),
			affinity: nodeaffinity.GetRequiredNodeAffinity(gp.Pod),
		}
		for _, c := range gp.Claims {
			st.claims[claimKey{c.Namespace, c.Name}] = c
		}
		sig := s.podSignature(gp)
		id, ok := shapeIDs[sig]
		if !ok {
			id = len(shapeIDs)
			shapeIDs[sig] = id
		}
		pi.shape = id
		for _, c := range gp.Claims {
			if c.Status.Allocation != nil {
				continue
			}
			for _, r := range c.Spec.Devices.Requests {
				if len(r.FirstAvailable) > 0 {
					pi.flexible = true
					pi.gpuNeed += float64(max(1, r.FirstAvailable[len(r.FirstAvailable)-1].Count))
				} else if r.Exactly != nil {
					pi.gpuNeed += float64(max(1, r.Exactly.Count))
				}
			}
		}
		st.pods = append(st.pods, pi)
	}
	// Search order: biggest pods first (they are the hardest to fit), equal shapes adjacent so
	// that the symmetry rule below applies, then by name for determinism.
	st.order = make([]int, len(st.pods))
	for i := range st.order {
		st.order[i] = i
	}
	sort.SliceStable(st.order, func(a, b int) bool {
		pa, pb := st.pods[st.order[a]], st.pods[st.order[b]]
		if pa.gpuNeed != pb.gpuNeed {
			return pa.gpuNeed > pb.gpuNeed
		}
		if pa.shape != pb.shape {
			return pa.shape < pb.shape
		}
		return pa.pod.Name < pb.pod.Name
	})
	return st
}

// podSignature hashes what decides where a pod fits: its unallocated claims' specs (immutable,
// so cached by UID), the identity of allocated claims, requests, node selection and
// tolerations.
func (s *Solver) podSignature(gp Pod) uint64 {
	h := fnv.New64a()
	for _, c := range gp.Claims {
		if c.Status.Allocation != nil {
			fmt.Fprintf(h, "allocated:%s;", c.UID)
			continue
		}
		s.mu.Lock()
		sig, ok := s.claimSigs[c.UID]
		s.mu.Unlock()
		if !ok {
			hh := fnv.New64a()
			b, _ := json.Marshal(c.Spec)
			_, _ = hh.Write(b)
			sig = hh.Sum64()
			s.mu.Lock()
			if len(s.claimSigs) > 200000 {
				s.claimSigs = map[types.UID]uint64{}
			}
			s.claimSigs[c.UID] = sig
			s.mu.Unlock()
		}
		fmt.Fprintf(h, "claim:%d;", sig)
	}
	spec := struct {
		R v1.ResourceList
		N map[string]string
		A *v1.Affinity
		T []v1.Toleration
	}{snapshot.PodRequests(gp.Pod), gp.Pod.Spec.NodeSelector, gp.Pod.Spec.Affinity, gp.Pod.Spec.Tolerations}
	b, _ := json.Marshal(spec)
	_, _ = h.Write(b)
	return h.Sum64()
}

type plan struct {
	domain string
	nodes  []int
}

// domainPlans lists the node sets to search, in order: topology domains first (best fit:
// the smallest domain with enough free GPU units), then the whole cluster unless the gang
// requires one domain.
func (st *search) domainPlans() []plan {
	all := st.sortNodes(nil)
	key, required := "", false
	if st.gang.Topology != nil {
		key, required = st.gang.Topology.Key, st.gang.Topology.Required
	} else if len(st.s.cfg.TopologyKeys) > 0 {
		key = st.s.cfg.TopologyKeys[0]
	}
	if key == "" {
		return []plan{{nodes: all}}
	}
	need := 0.0
	for _, p := range st.pods {
		need += p.gpuNeed
	}
	domains := map[string][]int{}
	free := map[string]float64{}
	for i, ni := range st.snap.Nodes {
		v, ok := ni.Node.Labels[key]
		if !ok {
			continue
		}
		domains[v] = append(domains[v], i)
		free[v] += ni.GPUFree()
	}
	names := make([]string, 0, len(domains))
	for d := range domains {
		names = append(names, d)
	}
	sort.Slice(names, func(a, b int) bool {
		fa, fb := free[names[a]] >= need, free[names[b]] >= need
		if fa != fb {
			return fa
		}
		if fa { // both fit: best fit
			if free[names[a]] != free[names[b]] {
				return free[names[a]] < free[names[b]]
			}
		} else if free[names[a]] != free[names[b]] {
			return free[names[a]] > free[names[b]]
		}
		return names[a] < names[b]
	})
	var plans []plan
	for i, d := range names {
		// A preferred constraint tries a few domains, then gives up on locality.
		if !required && i >= 4 {
			break
		}
		plans = append(plans, plan{domain: key + "=" + d, nodes: st.sortNodes(domains[d])})
	}
	if !required {
		plans = append(plans, plan{nodes: all})
	}
	return plans
}

// preferPlainGPUs decides whether bin-packing should try nodes with free plain
// (non-partitionable) GPUs before the others. Bin-packing alone puts a
// whole-GPU pod on the fullest node, which may be one whose free GPUs are all
// dynamic-MIG GPUs: taking them whole strands their MIG capacity while plain
// GPUs sit idle elsewhere. The preference applies only when the gang's hardest
// pod fits on the node with the most free plain GPUs (one allocator probe,
// undone at once), so that gangs asking for MIG devices are not sent through
// every plain node first.
func (st *search) preferPlainGPUs() bool {
	if st.s.cfg.Spread || len(st.order) == 0 {
		return false
	}
	st.plainFree = map[int]int{}
	best, bestFree := -1, 0
	for ni, n := range st.snap.Nodes {
		free := n.PlainGPUsFree()
		st.plainFree[ni] = free
		if free > bestFree {
			best, bestFree = ni, free
		}
	}
	if best < 0 {
		return false
	}
	// The probe must leave no trace in the search's failure bookkeeping: a
	// failure here is not the gang's.
	depth, reasons, pod := st.bestDepth, st.failReason, st.failPod
	pi := st.order[0]
	ok, err := st.tryPlace(pi, best, 0)
	if ok {
		st.undo(pi)
	}
	st.bestDepth, st.failReason, st.failPod = depth, reasons, pod
	return ok && err == nil
}

// sortNodes orders candidate nodes: nodes without free GPU units last; bin-packing puts the
// fullest first, spreading the emptiest. For gangs that can use plain GPUs, bin-packing
// first tries nodes that have free plain GPUs (see preferPlainGPUs).
func (st *search) sortNodes(subset []int) []int {
	if subset == nil {
		subset = make([]int, len(st.snap.Nodes))
		for i := range subset {
			subset[i] = i
		}
	} else {
		subset = append([]int(nil), subset...)
	}
	nodes := st.snap.Nodes
	spread := st.s.cfg.Spread
	sort.SliceStable(subset, func(a, b int) bool {
		na, nb := nodes[subset[a]], nodes[subset[b]]
		fa, fb := na.GPUFree(), nb.GPUFree()
		if (fa <= 0) != (fb <= 0) {
			return fa > 0
		}
		if st.preferPlain {
			if pa, pb := st.plainFree[subset[a]] > 0, st.plainFree[subset[b]] > 0; pa != pb {
				return pa
			}
		}
		if fa != fb {
			if spread {
				return fa > fb
			}
			return fa < fb
		}
		return na.Name() < nb.Name()
	})
	return subset
}

// run searches within one node set: depth-first over pods in search order, nodes in
// candidate order. Pods of equal shape are interchangeable, so a pod never goes to a node
// earlier in the candidate order than the previous pod of its shape: that cuts permutations
// of the same placement out of the search.
func (st *search) run(nodes []int) (bool, error) {
	pos := make([]int, len(st.order)) // candidate position chosen per depth
	depth := 0
	next := make([]int, len(st.order)) // next candidate position to try per depth
	next[0] = 0
	for depth >= 0 {
		if depth == len(st.order) {
			return true, nil
		}
		if err := st.ctx.Err(); err != nil {
			return false, err
		}
		pi := st.order[depth]
		found := false
		for c := next[depth]; c < len(nodes); c++ {
			if st.tries >= st.s.cfg.MaxTries {
				st.budgetHit = true
				break
			}
			st.tries++
			ok, err := st.tryPlace(pi, nodes[c], depth)
			if err != nil {
				return false, err
			}
			if ok {
				pos[depth] = c
				next[depth] = c + 1
				found = true
				break
			}
		}
		if found {
			depth++
			if depth < len(st.order) {
				// Symmetry: the next pod of the same shape starts where this one went.
				if st.pods[st.order[depth]].shape == st.pods[pi].shape {
					next[depth] = pos[depth-1]
				} else {
					next[depth] = 0
				}
			}
			continue
		}
		if st.budgetHit {
			st.undoAll()
			return false, nil
		}
		// Backtrack: undo the previous pod and let it try its next node.
		depth--
		if depth >= 0 {
			st.undo(st.order[depth])
		}
	}
	return false, nil
}

func (st *search) undoAll() {
	for _, pi := range st.order {
		if st.placements[pi] != nil {
			st.undo(pi)
		}
	}
}

// tryPlace checks pod pi on node ni and records the placement when it fits.
func (st *search) tryPlace(pi, ni, depth int) (bool, error) {
	p := st.pods[pi]
	node := st.snap.Nodes[ni]
	fail := func(reason string) (bool, error) {
		if depth >= st.bestDepth {
			if depth > st.bestDepth || st.failReason == nil {
				st.bestDepth = depth
				st.failReason = map[string]int{}
				st.failPod = p.pod.Name
			}
			if st.failPod == p.pod.Name {
				st.failReason[reason]++
			}
		}
		return false, nil
	}
	if reason := st.staticCheck(p, ni); reason != "" {
		return fail(reason)
	}
	ng := st.onNode[ni]
	if reason := fitsResources(node, ng, p); reason != "" {
		return fail(reason)
	}
	// Claims: already allocated (outside the gang or by an earlier pod of the gang) must be
	// usable on this node; the rest are allocated here.
	var toAllocate []*resourceapi.ResourceClaim
	var toAllocateKeys []claimKey
	for _, c := range p.claims {
		k := claimKey{c.Namespace, c.Name}
		if c.Status.Allocation != nil {
			continue // checked statically
		}
		if owner, ok := st.owner[k]; ok {
			if st.placements[owner].node != ni {
				return fail("shared claim allocated on another node")
			}
			continue
		}
		toAllocate = append(toAllocate, c)
		toAllocateKeys = append(toAllocateKeys, k)
	}
	pl := &placed{node: ni}
	if len(toAllocate) > 0 {
		memo := st.memoKey(p.shape, ni)
		if _, bad := st.failMemo[memo]; bad {
			return fail("insufficient devices")
		}
		var extra []resourceapi.AllocationResult
		if ng != nil {
			for _, other := range ng.pods {
				extra = append(extra, st.placements[other].results...)
			}
		}
		res, err := st.snap.AllocateOnNode(st.ctx, node, extra, toAllocate)
		if err != nil {
			return false, fmt.Errorf("pod %s on node %s: %w", klog.KObj(p.pod), node.Name(), err)
		}
		if res == nil && ng != nil && len(ng.pods) > 0 && st.jointUseful(ng, p) {
			ok, err := st.tryJoint(pi, ni, toAllocate, toAllocateKeys)
			if err != nil {
				return false, err
			}
			if ok {
				return true, nil
			}
		}
		if res == nil {
			st.failMemo[memo] = struct{}{}
			return fail("insufficient devices")
		}
		pl.owned, pl.results = toAllocateKeys, res
	}
	st.record(pi, pl)
	return true, nil
}

// jointUseful: re-allocating the gang's pods on a node together can only beat adding the new
// pod's devices on top of the earlier picks when some choice was not forced: a prioritized
// list, or pods of different shapes competing for the same devices. For identical exact
// requests it cannot help, and an infeasible joint search is exponential, so it is skipped.
func (st *search) jointUseful(ng *nodeGang, p *podInfo) bool {
	if p.flexible {
		return true
	}
	for _, other := range ng.pods {
		o := st.pods[other]
		if o.flexible || o.shape != p.shape {
			return true
		}
	}
	return false
}

// tryJoint re-allocates the claims owned by all gang pods on the node together with the new
// pod's, letting the allocator's exhaustive search redo earlier picks (e.g. move an earlier
// pod from a whole GPU to a MIG device so that the new pod gets the whole GPU).
func (st *search) tryJoint(pi, ni int, claims []*resourceapi.ResourceClaim, keys []claimKey) (bool, error) {
	ng := st.onNode[ni]
	var all []*resourceapi.ResourceClaim
	type span struct{ pod, from, to int }
	var spans []span
	for _, other := range ng.pods {
		pl := st.placements[other]
		from := len(all)
		for _, k := range pl.owned {
			all = append(all, st.claims[k])
		}
		spans = append(spans, span{other, from, len(all)})
	}
	from := len(all)
	all = append(all, claims...)
	ctx, cancel := context.WithTimeout(st.ctx, st.s.cfg.JointTimeout)
	defer cancel()
	res, err := st.snap.AllocateOnNode(ctx, st.snap.Nodes[ni], nil, all)
	if err != nil {
		if ctx.Err() != nil && st.ctx.Err() == nil {
			return false, nil // joint search over budget: treat as no fit
		}
		return false, fmt.Errorf("joint allocation on node %s: %w", st.snap.Nodes[ni].Name(), err)
	}
	if res == nil {
		return false, nil
	}
	for _, sp := range spans {
		st.placements[sp.pod].results = res[sp.from:sp.to]
	}
	st.record(pi, &placed{node: ni, owned: keys, results: res[from:]})
	return true, nil
}

func (st *search) record(pi int, pl *placed) {
	st.placements[pi] = pl
	ng := st.onNode[pl.node]
	if ng == nil {
		ng = &nodeGang{requested: v1.ResourceList{}}
		st.onNode[pl.node] = ng
	}
	ng.pods = append(ng.pods, pi)
	for name, q := range st.pods[pi].requests {
		cur := ng.requested[name]
		cur.Add(q)
		ng.requested[name] = cur
	}
	for _, k := range pl.owned {
		st.owner[k] = pi
	}
}

// undo removes pod pi's placement. A joint re-allocation may have changed the devices of
// other pods on the node; those stay valid without pi (they were chosen together with it, and
// dropping a pod only frees devices).
func (st *search) undo(pi int) {
	pl := st.placements[pi]
	if pl == nil {
		return
	}
	ng := st.onNode[pl.node]
	for i, other := range ng.pods {
		if other == pi {
			ng.pods = append(ng.pods[:i], ng.pods[i+1:]...)
			break
		}
	}
	for name, q := range st.pods[pi].requests {
		cur := ng.requested[name]
		cur.Sub(q)
		ng.requested[name] = cur
	}
	if len(ng.pods) == 0 {
		delete(st.onNode, pl.node)
	}
	for _, k := range pl.owned {
		delete(st.owner, k)
	}
	st.placements[pi] = nil
}

// memoKey identifies "a pod of this shape joins these gang shapes on this node": the outcome
// of the allocator is the same for every such state.
func (st *search) memoKey(shape, ni int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d@%d:", shape, ni)
	if ng := st.onNode[ni]; ng != nil {
		shapes := make([]int, 0, len(ng.pods))
		for _, o := range ng.pods {
			shapes = append(shapes, st.pods[o].shape)
		}
		sort.Ints(shapes)
		for _, s := range shapes {
			fmt.Fprintf(&b, "%d,", s)
		}
	}
	return b.String()
}

// staticCheck covers what does not change during the search: node conditions, taints, node
// selector and affinity, and claims allocated before the gang. Cached per (shape, node).
func (st *search) staticCheck(p *podInfo, ni int) string {
	key := [2]int{p.shape, ni}
	if r, ok := st.staticOK[key]; ok {
		return r
	}
	r := st.computeStatic(p, st.snap.Nodes[ni].Node)
	st.staticOK[key] = r
	return r
}

var unschedulableTaint = v1.Taint{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}

func (st *search) computeStatic(p *podInfo, node *v1.Node) string {
	logger := klog.FromContext(st.ctx)
	if node.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(logger, p.pod.Spec.Tolerations, &unschedulableTaint, false) {
		return "node unschedulable"
	}
	if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logger, node.Spec.Taints, p.pod.Spec.Tolerations, func(t *v1.Taint) bool {
		return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
	}, false); untolerated {
		return "untolerated taint"
	}
	if ok, err := p.affinity.Match(node); err != nil || !ok {
		return "node selector or affinity mismatch"
	}
	for _, c := range p.claims {
		if c.Status.Allocation == nil || c.Status.Allocation.NodeSelector == nil {
			continue
		}
		sel, err := nodeaffinity.NewNodeSelector(c.Status.Allocation.NodeSelector)
		if err != nil || !sel.Match(node) {
			return "claim allocated for another node"
		}
	}
	return ""
}

func fitsResources(node *snapshot.NodeInfo, ng *nodeGang, p *podInfo) string {
	alloc := node.Node.Status.Allocatable
	pods := node.Pods + 1
	if ng != nil {
		pods += len(ng.pods)
	}
	if max, ok := alloc[v1.ResourcePods]; ok && int64(pods) > max.Value() {
		return "too many pods"
	}
	for name, q := range p.requests {
		if q.IsZero() {
			continue
		}
		max, ok := alloc[name]
		if !ok {
			return "insufficient " + string(name)
		}
		used := node.Requested[name].DeepCopy()
		if ng != nil {
			used.Add(ng.requested[name])
		}
		used.Add(q)
		if used.Cmp(max) > 0 {
			return "insufficient " + string(name)
		}
	}
	return ""
}

func (st *search) result() *Result {
	res := &Result{Tries: st.tries}
	allocated := map[claimKey]bool{}
	for _, pi := range st.order {
		pl := st.placements[pi]
		p := st.pods[pi]
		out := Placement{Pod: p.pod, Node: st.snap.Nodes[pl.node].Name()}
		owned := map[claimKey]int{}
		for i, k := range pl.owned {
			owned[k] = i
		}
		for _, c := range p.claims {
			k := claimKey{c.Namespace, c.Name}
			if i, ok := owned[k]; ok && !allocated[k] {
				a := pl.results[i].DeepCopy()
				out.Allocate = append(out.Allocate, ClaimAllocation{Claim: c, Allocation: a})
				res.GPUUnits += st.snap.AllocationUnits(a)
				allocated[k] = true
				continue
			}
			out.Reserve = append(out.Reserve, c)
		}
		res.Placements = append(res.Placements, out)
	}
	return res
}

// explain turns the search's best attempt into a message with numbers.
func (st *search) explain(plans []plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gang of %d pods does not fit: at most %d placed together", len(st.pods), st.bestDepth)
	if st.failPod != "" && len(st.failReason) > 0 {
		reasons := make([]string, 0, len(st.failReason))
		for r, n := range st.failReason {
			reasons = append(reasons, fmt.Sprintf("%d %s", n, r))
		}
		sort.Strings(reasons)
		fmt.Fprintf(&b, "; pod %s then fits nowhere (%s)", st.failPod, strings.Join(reasons, ", "))
	}
	need := 0.0
	for _, p := range st.pods {
		need += p.gpuNeed
	}
	free, nodes := 0.0, 0
	for _, ni := range st.snap.Nodes {
		if ni.GPUFree() > 0 {
			free += ni.GPUFree()
			nodes++
		}
	}
	fmt.Fprintf(&b, "; needs %g devices, cluster has %g free GPU units on %d nodes", need, free, nodes)
	var largest float64
	var largestName string
	for _, pl := range plans {
		if pl.domain == "" {
			continue
		}
		f := 0.0
		for _, ni := range pl.nodes {
			f += st.snap.Nodes[ni].GPUFree()
		}
		if f > largest || largestName == "" {
			largest, largestName = f, pl.domain
		}
	}
	if largestName != "" {
		fmt.Fprintf(&b, "; largest topology domain %s has %g free", largestName, largest)
	}
	if st.budgetHit {
		fmt.Fprintf(&b, "; search budget of %d tries exhausted", st.s.cfg.MaxTries)
	}
	return b.String()
}

// Signature identifies gangs that are interchangeable for the search: the same multiset of pod
// shapes and the same topology constraint. Within one cycle capacity only shrinks, so a gang
// whose signature already failed fails again and need not be searched.
func (s *Solver) Signature(g *Gang) string {
	sigs := make([]uint64, 0, len(g.Pods))
	for _, p := range g.Pods {
		sigs = append(sigs, s.podSignature(p))
	}
	sort.Slice(sigs, func(i, j int) bool { return sigs[i] < sigs[j] })
	var b strings.Builder
	if g.Topology != nil {
		fmt.Fprintf(&b, "%s/%v|", g.Topology.Key, g.Topology.Required)
	}
	for _, sig := range sigs {
		fmt.Fprintf(&b, "%x,", sig)
	}
	return b.String()
}
