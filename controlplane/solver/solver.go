// Package solver places one gang at a time on a snapshot: it searches pod → node assignments
// in memory, checks every pod on a node with the kube-scheduler's own filter plugins
// (controlplane/filters) and its devices with the structured allocator, carries the gang's
// earlier choices (pods for affinity, spread, ports and resources; devices, node-local and
// network-attached; volumes) into the checks of its later pods, and backtracks across pods
// when a later pod does not fit. The search is bounded by work — node evaluations and
// allocator steps — never by the clock, so the same snapshot always gives the same answer.
// Nothing is written to the API here.
package solver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/controlplane/filters"
	"github.com/tessera-gpu/tessera/controlplane/snapshot"
)

// Config tunes the search.
type Config struct {
	// Filters are the kube-scheduler's filter plugins. Required.
	Filters *filters.Filters
	// TopologyKeys are node label keys whose values are topology domains (rack, NVLink
	// domain), most specific first. A gang is kept inside one domain of the first key when it
	// fits there. A gang's own topology constraint overrides this.
	TopologyKeys []string
	// Spread orders nodes emptiest first; the default (false) packs GPUs: fullest first.
	Spread bool
	// MaxTries bounds the search: node evaluations per gang (memoised ones included).
	// Default 50000.
	MaxTries int
	// JointSteps bounds one joint re-allocation of all gang pods on a node, in allocator
	// steps (one device tried for one request; 2–5 µs each on the development machine).
	// Default 10000.
	JointSteps int64
	// MaxSteps bounds the allocator steps of one gang's whole search. Default 500000.
	MaxSteps int64
	// WallClockGuard is a last resort against a search that the work bounds did not stop in
	// time (a pathological CEL selector, a huge cluster): the search ends and the gang's
	// condition says so. It makes the outcome depend on the machine, so it is generous and
	// counted (Unschedulable.WallClock). Default 30s; negative disables.
	WallClockGuard time.Duration
	// NoRunAhead turns off run-ahead allocation (runahead.go): every pod's devices are then
	// allocated by an allocator call of its own. For tests and benchmarks.
	NoRunAhead bool
}

func (c Config) withDefaults() Config {
	if c.MaxTries <= 0 {
		c.MaxTries = 50000
	}
	if c.JointSteps <= 0 {
		c.JointSteps = 10000
	}
	if c.MaxSteps <= 0 {
		c.MaxSteps = 500000
	}
	if c.WallClockGuard == 0 {
		c.WallClockGuard = 30 * time.Second
	}
	return c
}

// Pod is one pending pod of a gang with its ResourceClaims (in spec.resourceClaims order).
type Pod struct {
	Pod    *v1.Pod
	Claims []*resourceapi.ResourceClaim
	// Consumers, when set for a claim UID, is whom the claim is reserved for instead of the
	// pod (a claim of the pod's upstream PodGroup is reserved for the PodGroup).
	Consumers map[types.UID]resourceapi.ResourceClaimConsumerReference
}

// Gang is what the solver places: all Pods or none.
type Gang struct {
	// Name for messages (namespace/podgroup).
	Name string
	Pods []Pod
	// Topology, when set, overrides the configured keys.
	Topology *Topology
	// Avoid are nodes the gang must not use (capacity reserved for another gang).
	Avoid map[string]bool
}

// Placement is the decision for one pod.
type Placement struct {
	Pod  *v1.Pod
	Node string
	// Allocate are the claims this pod allocates, with their new allocation.
	Allocate []ClaimAllocation
	// Reserve are claims the pod uses that are (or will be, by an earlier pod of the gang)
	// allocated; the committer only adds the consumer to reservedFor.
	Reserve []*resourceapi.ResourceClaim
	// Consumers of the pod's claims other than the pod itself (see Pod.Consumers).
	Consumers map[types.UID]resourceapi.ResourceClaimConsumerReference
	// Extended is the claim for the pod's extended resources backed by DRA (KEP-5004), to be
	// created by the committer; nil when the pod has none on this node.
	Extended *ExtendedClaim
	// Volumes are the volume binder's decisions for the pod on the node.
	Volumes filters.Volumes
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
	// Steps is the number of allocator steps the search took.
	Steps int64
	// AllocatorCalls counts the search's device checks on a node (Snapshot.AllocateBounded:
	// own, joint and run-ahead; those the count check answers without running the allocator
	// included), and RunAhead the pods whose devices came from a run-ahead allocation
	// (runahead.go).
	AllocatorCalls, RunAhead int
	// Domain is the topology domain the gang was placed in ("" when none applied).
	Domain string
}

// Unschedulable says why a gang does not fit, in numbers.
type Unschedulable struct {
	Message string
	// WallClock is set when the last-resort wall-clock guard ended the search.
	WallClock bool
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
	// podSigs caches podSignature of pods by UID (valid for one resourceVersion and one set
	// of relevant label keys).
	podSigs map[types.UID]podSigEntry
	// memo keeps the failed searches of the current input epoch (memo.go); stats counts.
	memo  memo
	stats Stats
}

type podSigEntry struct {
	resourceVersion, keys string
	sig                   uint64
}

// New returns a solver. cfg.Filters must be set.
func New(cfg Config) *Solver {
	if cfg.Filters == nil {
		panic("solver: Config.Filters is required")
	}
	return &Solver{cfg: cfg.withDefaults(), claimSigs: map[types.UID]uint64{}, podSigs: map[types.UID]podSigEntry{}}
}

// Config returns the solver's configuration (with defaults applied).
func (s *Solver) Config() Config { return s.cfg }

// Solve searches a placement for every pod of the gang. It returns *Unschedulable when none
// exists (or none was found within the budget), any other error for bad input (a CEL error, a
// missing DeviceClass). The snapshot is left as it was.
//
// With WithInput, a gang that failed on a snapshot of the same input epoch is answered with
// the same *Unschedulable without a search (memo.go).
func (s *Solver) Solve(ctx context.Context, snap *snapshot.Snapshot, gang *Gang) (*Result, error) {
	if len(gang.Pods) == 0 {
		return &Result{}, nil
	}
	key, prev := s.memoLookup(ctx, snap, gang)
	if prev != nil {
		klog.FromContext(ctx).V(4).Info("Gang does not fit, input unchanged since its last search", "gang", gang.Name, "reason", prev)
		return nil, prev
	}
	s.mu.Lock()
	s.stats.Searches++
	s.mu.Unlock()
	res, err := s.solve(ctx, snap, gang)
	s.memoRecord(snap, key, err)
	return res, err
}

func (s *Solver) solve(ctx context.Context, snap *snapshot.Snapshot, gang *Gang) (*Result, error) {
	logger := klog.FromContext(ctx)
	session := s.cfg.Filters.Begin(ctx, snap.Pods)
	defer session.End()
	st, err := s.newSearch(ctx, snap, session, gang)
	if err != nil {
		return nil, err
	}
	if msg := st.rejectedEverywhere(); msg != "" {
		return nil, &Unschedulable{Message: msg}
	}
	st.preferPlain, err = st.preferPlainGPUs()
	if err != nil {
		return nil, err
	}
	plans := st.domainPlans()
	for _, plan := range plans {
		if st.outOfBudget() {
			break
		}
		ok, err := st.run(plan.nodes)
		if err != nil {
			return nil, err
		}
		if ok {
			res := st.result()
			res.Domain = plan.domain
			st.undoAll()
			logger.V(4).Info("Gang solved", "gang", gang.Name, "pods", len(gang.Pods), "domain", plan.domain, "tries", st.tries, "steps", st.steps, "gpuUnits", res.GPUUnits)
			return res, nil
		}
	}
	u := &Unschedulable{Message: st.explain(plans), WallClock: st.guardHit}
	logger.V(4).Info("Gang does not fit", "gang", gang.Name, "tries", st.tries, "steps", st.steps, "reason", u)
	return nil, u
}

// podInfo is the solver's precomputed view of a gang pod.
type podInfo struct {
	pod       *v1.Pod
	claims    []*resourceapi.ResourceClaim
	consumers map[types.UID]resourceapi.ResourceClaimConsumerReference
	shape     int // index into distinct shapes; equal shapes are interchangeable
	flexible  bool
	gpuNeed   float64
	filter    *filters.PodState
	// extended are the pod's requests of extended resources that DeviceClasses map (DRA
	// extended resources), by resource name.
	extended map[v1.ResourceName]int64
	// requiredAffinity: the pod has required inter-pod affinity, which a placed gang can
	// satisfy (capacity does not only shrink for it).
	requiredAffinity bool
	// orderMatters: the pod has constraints that a subset of a valid placement can violate
	// (topology spread, required pod affinity). The filters check them pod by pod, so the
	// order in which the gang's pods are placed matters and the symmetry rule (equal pods
	// go to non-decreasing candidate positions) would cut valid placements.
	orderMatters bool
}

type claimKey struct{ namespace, name string }

// placed is one pod's tentative placement.
type placed struct {
	node int
	// owned claims this pod allocates and their tentative results.
	owned   []claimKey
	results []resourceapi.AllocationResult
	// extended is the pod's extended-resource claim on this node and its result.
	extended *ExtendedClaim
	// ahead is the run-ahead allocation the results were taken from (nil: a call of their
	// own), aheadIdx the pod's position in it.
	ahead    *runAhead
	aheadIdx int
}

type nodeGang struct {
	pods []int // gang pods on the node
}

type search struct {
	ctx     context.Context
	s       *Solver
	snap    *snapshot.Snapshot
	session *filters.Session
	gang    *Gang
	pods    []*podInfo
	order   []int // pod indices in search order
	start   time.Time

	placements []*placed // by pod index
	onNode     map[int]*nodeGang
	stack      []int // placed pods in placement order (LIFO, as the filters' session)
	// owner of a tentatively allocated claim: pod index
	owner map[claimKey]int

	claims     map[claimKey]*resourceapi.ResourceClaim
	staticOK   map[[2]int]string // (shape,node) → "" or reason
	failMemo   map[string]struct{}
	tries      int
	steps      int64
	allocCalls int
	// ahead is the latest run-ahead allocation (runahead.go); aheadUsed counts its uses.
	ahead     *runAhead
	aheadUsed int
	// probing: the placement is preferPlainGPUs' probe, undone at once (no run-ahead).
	probing bool
	// claimRefs counts the gang pods that name each claim.
	claimRefs  map[claimKey]int
	jointCut   int // joint re-allocations stopped by their step budget
	bestDepth  int
	failReason map[string]int // reasons for the pod at bestDepth
	failPod    string
	budgetHit  bool
	stepsHit   bool
	guardHit   bool
	// plainFree is, per node index, its free non-partitionable whole GPUs;
	// preferPlain orders nodes that have some first (see preferPlainGPUs).
	plainFree   []int
	preferPlain bool
	// requiredLevel names the required topology keys and requiredDomains their domains
	// with free GPU units (for the message of a gang that fits none).
	requiredLevel   string
	requiredDomains []domainStat
}

func (s *Solver) newSearch(ctx context.Context, snap *snapshot.Snapshot, session *filters.Session, gang *Gang) (*search, error) {
	st := &search{
		ctx: ctx, s: s, snap: snap, session: session, gang: gang, start: time.Now(),
		placements: make([]*placed, len(gang.Pods)),
		onNode:     map[int]*nodeGang{},
		owner:      map[claimKey]int{},
		staticOK:   map[[2]int]string{},
		claims:     map[claimKey]*resourceapi.ResourceClaim{},
		failMemo:   map[string]struct{}{},
		claimRefs:  map[claimKey]int{},
	}
	keys := relevantLabelKeys(snap, gang)
	shapeIDs := map[uint64]int{}
	for _, gp := range gang.Pods {
		ps, err := session.Prepare(gp.Pod)
		if err != nil {
			return nil, err
		}
		requests := snapshot.PodRequests(gp.Pod)
		pi := &podInfo{
			pod:       gp.Pod,
			claims:    gp.Claims,
			consumers: gp.Consumers,
			filter:    ps,
			extended:  snap.ExtendedResources(requests),
		}
		if a := gp.Pod.Spec.Affinity; a != nil && a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			pi.requiredAffinity = true
			pi.orderMatters = true
		}
		for _, c := range gp.Pod.Spec.TopologySpreadConstraints {
			if c.WhenUnsatisfiable == v1.DoNotSchedule {
				pi.orderMatters = true
			}
		}
		for _, c := range gp.Claims {
			st.claims[claimKey{c.Namespace, c.Name}] = c
			st.claimRefs[claimKey{c.Namespace, c.Name}]++
		}
		sig := s.podSignature(gp, keys, requests)
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
		for _, n := range pi.extended {
			pi.gpuNeed += float64(n)
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
	return st, nil
}

// rejectedEverywhere is the message when some pod's PreFilter ruled out every node (an
// unbound immediate PVC, a missing PVC, a node name that does not exist).
func (st *search) rejectedEverywhere() string {
	for _, pi := range st.order {
		p := st.pods[pi]
		if r := p.filter.Rejected(); r != "" {
			return fmt.Sprintf("gang of %d pods does not fit: pod %s fits no node: %s", len(st.pods), p.pod.Name, r)
		}
	}
	return ""
}

// relevantLabelKeys are the pod label keys that some label selector of inter-pod affinity or
// topology spread may look at: the gang's own terms and the required anti-affinity of pods
// already placed. Only these labels make two pods different for the filters.
func relevantLabelKeys(snap *snapshot.Snapshot, gang *Gang) sets.Set[string] {
	keys := sets.New[string]()
	addSelector := func(sel *metav1.LabelSelector) {
		if sel == nil {
			return
		}
		for k := range sel.MatchLabels {
			keys.Insert(k)
		}
		for _, e := range sel.MatchExpressions {
			keys.Insert(e.Key)
		}
	}
	addTerms := func(terms []v1.PodAffinityTerm) {
		for _, t := range terms {
			addSelector(t.LabelSelector)
			keys.Insert(t.MatchLabelKeys...)
			keys.Insert(t.MismatchLabelKeys...)
		}
	}
	addWeighted := func(terms []v1.WeightedPodAffinityTerm) {
		for _, t := range terms {
			addSelector(t.PodAffinityTerm.LabelSelector)
		}
	}
	addPod := func(p *v1.Pod) {
		if a := p.Spec.Affinity; a != nil {
			if a.PodAffinity != nil {
				addTerms(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
				addWeighted(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
			}
			if a.PodAntiAffinity != nil {
				addTerms(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
				addWeighted(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
			}
		}
		for _, c := range p.Spec.TopologySpreadConstraints {
			addSelector(c.LabelSelector)
			keys.Insert(c.MatchLabelKeys...)
		}
	}
	for _, gp := range gang.Pods {
		addPod(gp.Pod)
	}
	nodes, _ := snap.Pods.NodeInfos().HavePodsWithRequiredAntiAffinityList()
	for _, ni := range nodes {
		for _, pi := range ni.GetPodsWithRequiredAntiAffinity() {
			addTerms(pi.GetPod().Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
		}
	}
	return keys
}

// podSignature hashes what decides where a pod fits: its unallocated claims' specs (immutable,
// so cached by UID), the identity of allocated claims, and every pod field a filter plugin
// reads (requests, node selection, tolerations, affinity, ports, volumes, spread, the labels
// some selector looks at).
func (s *Solver) podSignature(gp Pod, labelKeys sets.Set[string], requests v1.ResourceList) uint64 {
	// Claims are in the signature by identity or by their immutable spec; the pod's fields by
	// value: a pod's signature changes only with its resourceVersion or with which labels
	// matter. Pods of a cached signature must not have claims that changed allocation since
	// (their identity is in the signature), so the claim part is part of the key too.
	cacheKey := ""
	if gp.Pod.UID != "" && gp.Pod.ResourceVersion != "" {
		var b strings.Builder
		for _, k := range sets.List(labelKeys) {
			b.WriteString(k)
			b.WriteByte(',')
		}
		for _, c := range gp.Claims {
			fmt.Fprintf(&b, "|%s:%v:%v", c.UID, c.Status.Allocation != nil, gp.Consumers[c.UID].UID)
		}
		cacheKey = b.String()
		s.mu.Lock()
		e, ok := s.podSigs[gp.Pod.UID]
		s.mu.Unlock()
		if ok && e.resourceVersion == gp.Pod.ResourceVersion && e.keys == cacheKey {
			return e.sig
		}
	}
	sig := s.computePodSignature(gp, labelKeys, requests)
	if cacheKey != "" {
		s.mu.Lock()
		if len(s.podSigs) > 200000 {
			s.podSigs = map[types.UID]podSigEntry{}
		}
		s.podSigs[gp.Pod.UID] = podSigEntry{resourceVersion: gp.Pod.ResourceVersion, keys: cacheKey, sig: sig}
		s.mu.Unlock()
	}
	return sig
}

func (s *Solver) computePodSignature(gp Pod, labelKeys sets.Set[string], requests v1.ResourceList) uint64 {
	h := fnv.New64a()
	for _, c := range gp.Claims {
		if c.Status.Allocation != nil {
			fmt.Fprintf(h, "allocated:%s;", c.UID)
			continue
		}
		if _, shared := gp.Consumers[c.UID]; shared {
			fmt.Fprintf(h, "shared:%s;", c.UID)
		}
		s.mu.Lock()
		sig, ok := s.claimSigs[c.UID]
		s.mu.Unlock()
		if !ok || c.UID == "" {
			hh := fnv.New64a()
			b, _ := json.Marshal(c.Spec)
			_, _ = hh.Write(b)
			sig = hh.Sum64()
			if c.UID != "" {
				s.mu.Lock()
				if len(s.claimSigs) > 200000 {
					s.claimSigs = map[types.UID]uint64{}
				}
				s.claimSigs[c.UID] = sig
				s.mu.Unlock()
			}
		}
		fmt.Fprintf(h, "claim:%d;", sig)
	}
	p := gp.Pod
	var ports []v1.ContainerPort
	for _, c := range append(append([]v1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
		for _, port := range c.Ports {
			if port.HostPort > 0 {
				ports = append(ports, port)
			}
		}
	}
	labels := map[string]string{}
	for k := range labelKeys {
		if v, ok := p.Labels[k]; ok {
			labels[k] = v
		}
	}
	// Of the volumes, only those a filter plugin looks at (claims, CSI, and the in-tree disks
	// VolumeRestrictions checks), without their names: every pod has its own
	// service-account token volume, which must not make pods different.
	var volumes []v1.VolumeSource
	for _, vol := range p.Spec.Volumes {
		src := vol.VolumeSource
		if src.PersistentVolumeClaim != nil || src.Ephemeral != nil || src.CSI != nil || src.GCEPersistentDisk != nil ||
			src.AWSElasticBlockStore != nil || src.RBD != nil || src.ISCSI != nil {
			if src.Ephemeral != nil {
				// The claim of a generic ephemeral volume is named after the pod.
				volumes = append(volumes, v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: p.Name + "-" + vol.Name}})
				continue
			}
			volumes = append(volumes, src)
		}
	}
	spec := struct {
		R  v1.ResourceList
		N  map[string]string
		NN string
		A  *v1.Affinity
		T  []v1.Toleration
		P  []v1.ContainerPort
		V  []v1.VolumeSource
		S  []v1.TopologySpreadConstraint
		L  map[string]string
		NS string
	}{requests, p.Spec.NodeSelector, p.Spec.NodeName, p.Spec.Affinity, p.Spec.Tolerations, ports, volumes, p.Spec.TopologySpreadConstraints, labels, p.Namespace}
	b, _ := json.Marshal(spec)
	_, _ = h.Write(b)
	return h.Sum64()
}

// preferPlainGPUs decides whether bin-packing should try nodes with free plain
// (non-partitionable) GPUs before the others. Bin-packing alone puts a
// whole-GPU pod on the fullest node, which may be one whose free GPUs are all
// dynamic-MIG GPUs: taking them whole strands their MIG capacity while plain
// GPUs sit idle elsewhere. The preference applies only when the gang's hardest
// pod fits on the node with the most free plain GPUs (one probe, undone at
// once), so that gangs asking for MIG devices are not sent through every plain
// node first.
func (st *search) preferPlainGPUs() (bool, error) {
	if st.s.cfg.Spread || len(st.order) == 0 {
		return false, nil
	}
	st.plainFree = make([]int, len(st.snap.Nodes))
	best, bestFree := -1, 0
	for ni, n := range st.snap.Nodes {
		free := n.PlainGPUsFree()
		st.plainFree[ni] = free
		if free > bestFree {
			best, bestFree = ni, free
		}
	}
	if best < 0 {
		return false, nil
	}
	// The probe must leave no trace in the search's failure bookkeeping: a
	// failure here is not the gang's.
	depth, reasons, pod := st.bestDepth, st.failReason, st.failPod
	pi := st.order[0]
	st.probing = true
	ok, err := st.tryPlace(pi, best, 0)
	st.probing = false
	if ok {
		st.undo(pi)
	}
	st.bestDepth, st.failReason, st.failPod = depth, reasons, pod
	return ok, err
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
	// The keys are computed once per node, not per comparison. The snapshot's nodes are in
	// name order, so the index breaks ties as the name does, and the order is total (no
	// stable sort needed).
	type nodeKey struct {
		free  float64
		plain bool
		idx   int
	}
	keys := make([]nodeKey, len(subset))
	for i, ni := range subset {
		keys[i] = nodeKey{free: st.snap.Nodes[ni].GPUFree(), plain: st.preferPlain && st.plainFree[ni] > 0, idx: ni}
	}
	spread := st.s.cfg.Spread
	slices.SortFunc(keys, func(a, b nodeKey) int {
		if (a.free <= 0) != (b.free <= 0) {
			return boolFirst(a.free > 0)
		}
		if a.plain != b.plain {
			return boolFirst(a.plain)
		}
		if a.free != b.free {
			if spread {
				return boolFirst(a.free > b.free)
			}
			return boolFirst(a.free < b.free)
		}
		return cmp.Compare(a.idx, b.idx)
	})
	for i := range keys {
		subset[i] = keys[i].idx
	}
	return subset
}

// boolFirst orders a comparison whose first operand goes first when first is true.
func boolFirst(first bool) int {
	if first {
		return -1
	}
	return 1
}

func (st *search) outOfBudget() bool {
	switch {
	case st.tries >= st.s.cfg.MaxTries:
		st.budgetHit = true
	case st.steps >= st.s.cfg.MaxSteps:
		st.stepsHit = true
	case st.s.cfg.WallClockGuard > 0 && time.Since(st.start) > st.s.cfg.WallClockGuard:
		st.guardHit = true
	default:
		return false
	}
	return true
}

// run searches within one node set: depth-first over pods in search order, nodes in
// candidate order. Pods of equal shape are interchangeable, so a pod never goes to a node
// earlier in the candidate order than the previous pod of its shape: that cuts permutations
// of the same placement out of the search. Not for pods whose constraints are checked
// incrementally and can fail part-way (topology spread, pod affinity): for them the order of
// placement matters.
func (st *search) run(nodes []int) (bool, error) {
	pos := make([]int, len(st.order)) // candidate position chosen per depth
	depth := 0
	next := make([]int, len(st.order)) // next candidate position to try per depth
	for depth >= 0 {
		if depth == len(st.order) {
			return true, nil
		}
		if err := st.ctx.Err(); err != nil {
			return false, err
		}
		pi := st.order[depth]
		found, stopped := false, false
		for c := next[depth]; c < len(nodes); c++ {
			if st.outOfBudget() {
				stopped = true
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
				if nx := st.pods[st.order[depth]]; nx.shape == st.pods[pi].shape && !nx.orderMatters {
					next[depth] = pos[depth-1]
				} else {
					next[depth] = 0
				}
			}
			continue
		}
		if stopped {
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

// undoAll takes back every tentative placement, last first.
func (st *search) undoAll() {
	for len(st.stack) > 0 {
		st.undo(st.stack[len(st.stack)-1])
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
	reason, err := st.session.DynamicFilter(p.filter, node.Name())
	if err != nil {
		return false, err
	}
	if reason != "" {
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
			if !allocationReaches(st.placements[owner].resultFor(k), node.Node) {
				return fail("shared claim allocated for another node")
			}
			continue
		}
		toAllocate = append(toAllocate, c)
		toAllocateKeys = append(toAllocateKeys, k)
	}
	pl := &placed{node: ni}
	ext := st.extendedClaim(p, node)
	if ext != nil {
		toAllocate = append(toAllocate, ext.Claim)
	}
	if len(toAllocate) > 0 {
		if ext == nil {
			if ra, j, ok := st.fromAhead(pi, ni); ok {
				pl.owned, pl.results, pl.ahead, pl.aheadIdx = toAllocateKeys, ra.results[j], ra, j
				ok, err := st.record(pi, pl)
				if ok {
					st.aheadUsed++
				}
				return ok, err
			}
		}
		memo := st.memoKey(p.shape, ni)
		if _, bad := st.failMemo[memo]; bad {
			return fail("insufficient devices")
		}
		extra := st.sharedResults(ni)
		if ng := st.onNode[ni]; ng != nil {
			for _, other := range ng.pods {
				extra = append(extra, st.placements[other].allResults()...)
			}
		}
		res, a, err := st.snap.AllocateBounded(st.ctx, node, extra, toAllocate, st.s.cfg.MaxSteps-st.steps)
		st.allocCalls++
		st.steps += a.Steps
		if err != nil {
			return false, fmt.Errorf("pod %s on node %s: %w", klog.KObj(p.pod), node.Name(), err)
		}
		if a.Exhausted {
			st.stepsHit = true
			return fail("insufficient devices")
		}
		if res == nil && st.onNode[ni] != nil && st.jointUseful(st.onNode[ni], p) {
			ok, err := st.tryJoint(pi, ni, toAllocate, toAllocateKeys, ext)
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
		if ext != nil {
			ext.Allocation = &res[len(res)-1]
			res = res[:len(res)-1]
			pl.extended = ext
		}
		pl.owned, pl.results = toAllocateKeys, res
		ok, err := st.record(pi, pl)
		if ok && ext == nil {
			st.allocateAhead(depth, ni, a.Steps)
		}
		return ok, err
	}
	return st.record(pi, pl)
}

// resultFor returns the tentative allocation of claim k owned by this placement.
func (pl *placed) resultFor(k claimKey) *resourceapi.AllocationResult {
	for i, o := range pl.owned {
		if o == k {
			return &pl.results[i]
		}
	}
	return nil
}

// allResults are the device results this placement holds.
func (pl *placed) allResults() []resourceapi.AllocationResult {
	if pl.extended == nil {
		return pl.results
	}
	return append(append([]resourceapi.AllocationResult(nil), pl.results...), *pl.extended.Allocation)
}

// allocationReaches reports whether a (tentative) allocation is usable from node: a claim
// allocated to a node-local device is usable there only; one on network-attached devices
// wherever its node selector matches.
func allocationReaches(a *resourceapi.AllocationResult, node *v1.Node) bool {
	if a == nil || a.NodeSelector == nil {
		return true
	}
	sel, err := nodeaffinity.NewNodeSelector(a.NodeSelector)
	return err == nil && sel.Match(node)
}

// sharedResults are the network-attached devices the gang's pods on other nodes than ni hold
// tentatively: the allocator on ni must see them as taken (a device reachable from several
// nodes is still one device).
func (st *search) sharedResults(ni int) []resourceapi.AllocationResult {
	if !st.snap.HasSharedSlices() {
		return nil
	}
	var out []resourceapi.AllocationResult
	for _, other := range st.stack {
		pl := st.placements[other]
		if pl.node == ni {
			continue
		}
		for _, r := range pl.allResults() {
			var shared []resourceapi.DeviceRequestAllocationResult
			for i := range r.Devices.Results {
				if st.snap.SharedResult(&r.Devices.Results[i]) {
					shared = append(shared, r.Devices.Results[i])
				}
			}
			if len(shared) > 0 {
				out = append(out, resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: shared}})
			}
		}
	}
	return out
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
// pod from a whole GPU to a MIG device so that the new pod gets the whole GPU). The call is
// bounded by JointSteps allocator steps.
func (st *search) tryJoint(pi, ni int, claims []*resourceapi.ResourceClaim, keys []claimKey, ext *ExtendedClaim) (bool, error) {
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
		if pl.extended != nil {
			all = append(all, pl.extended.Claim)
		}
		spans = append(spans, span{other, from, len(all)})
	}
	from := len(all)
	all = append(all, claims...)
	budget := min(st.s.cfg.JointSteps, st.s.cfg.MaxSteps-st.steps)
	node := st.snap.Nodes[ni]
	res, a, err := st.snap.AllocateBounded(st.ctx, node, st.sharedResults(ni), all, budget)
	st.allocCalls++
	st.steps += a.Steps
	if err != nil {
		return false, fmt.Errorf("joint allocation on node %s: %w", node.Name(), err)
	}
	if a.Exhausted {
		st.jointCut++
		return false, nil
	}
	if res == nil {
		return false, nil
	}
	// The earlier pods' devices change: a run-ahead allocation made on top of them is void.
	if st.ahead != nil && st.ahead.node == ni {
		st.ahead = nil
	}
	for _, sp := range spans {
		pl := st.placements[sp.pod]
		n := len(pl.owned)
		pl.results = res[sp.from : sp.from+n]
		if pl.extended != nil {
			pl.extended.Allocation = &res[sp.from+n]
		}
	}
	pl := &placed{node: ni, owned: keys}
	mine := res[from:]
	if ext != nil {
		ext.Allocation = &mine[len(mine)-1]
		mine = mine[:len(mine)-1]
		pl.extended = ext
	}
	pl.results = mine
	return st.record(pi, pl)
}

// record makes a placement tentative: in the solver's bookkeeping and in the filters'
// session (the pod joins the view; its volumes are assumed).
func (st *search) record(pi int, pl *placed) (bool, error) {
	reason, err := st.session.Assume(st.pods[pi].filter, st.snap.Nodes[pl.node].Name())
	if err != nil {
		return false, err
	}
	if reason != "" {
		return false, nil
	}
	st.placements[pi] = pl
	ng := st.onNode[pl.node]
	if ng == nil {
		ng = &nodeGang{}
		st.onNode[pl.node] = ng
	}
	ng.pods = append(ng.pods, pi)
	for _, k := range pl.owned {
		st.owner[k] = pi
	}
	st.stack = append(st.stack, pi)
	return true, nil
}

// undo removes pod pi's placement, which must be the last one made. A joint re-allocation may
// have changed the devices of other pods on the node; those stay valid without pi (they were
// chosen together with it, and dropping a pod only frees devices).
func (st *search) undo(pi int) {
	pl := st.placements[pi]
	if pl == nil {
		return
	}
	if last := st.stack[len(st.stack)-1]; last != pi {
		panic(fmt.Sprintf("solver: undo of pod %d but %d was placed last", pi, last))
	}
	st.stack = st.stack[:len(st.stack)-1]
	st.session.Forget()
	st.dropAheadOver(pl)
	ng := st.onNode[pl.node]
	for i, other := range ng.pods {
		if other == pi {
			ng.pods = append(ng.pods[:i], ng.pods[i+1:]...)
			break
		}
	}
	if len(ng.pods) == 0 {
		delete(st.onNode, pl.node)
	}
	for _, k := range pl.owned {
		delete(st.owner, k)
	}
	st.placements[pi] = nil
}

// memoKey identifies "a pod of this shape joins these gang shapes on this node, with these
// network-attached devices taken by the gang elsewhere": the allocator's outcome is the same
// for every such state.
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
	if shared := st.sharedResults(ni); len(shared) > 0 {
		var ids []string
		for _, r := range shared {
			for _, d := range r.Devices.Results {
				ids = append(ids, d.Driver+"/"+d.Pool+"/"+d.Device+"/"+string(ptrDeref(d.ShareID)))
			}
		}
		sort.Strings(ids)
		fmt.Fprintf(&b, "|%s", strings.Join(ids, ","))
	}
	return b.String()
}

func ptrDeref(u *types.UID) types.UID {
	if u == nil {
		return ""
	}
	return *u
}

// staticCheck covers what does not change during the search: the static filter plugins
// (node name, unschedulable, taints, node affinity, volume zones) and claims allocated before
// the gang. Cached per (shape, node).
func (st *search) staticCheck(p *podInfo, ni int) string {
	key := [2]int{p.shape, ni}
	if r, ok := st.staticOK[key]; ok {
		return r
	}
	node := st.snap.Nodes[ni].Node
	r := st.session.StaticFilter(p.filter, node.Name)
	if r == "" {
		for _, c := range p.claims {
			if c.Status.Allocation != nil && !allocationReaches(c.Status.Allocation, node) {
				r = "claim allocated for another node"
				break
			}
		}
	}
	st.staticOK[key] = r
	return r
}

func (st *search) result() *Result {
	res := &Result{Tries: st.tries, Steps: st.steps, AllocatorCalls: st.allocCalls, RunAhead: st.aheadUsed}
	allocated := map[claimKey]bool{}
	for _, pi := range st.order {
		pl := st.placements[pi]
		p := st.pods[pi]
		node := st.snap.Nodes[pl.node].Name()
		out := Placement{Pod: p.pod, Node: node, Consumers: p.consumers, Volumes: st.session.VolumesOf(p.filter, node)}
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
		if pl.extended != nil {
			e := *pl.extended
			e.Allocation = pl.extended.Allocation.DeepCopy()
			out.Extended = &e
			res.GPUUnits += st.snap.AllocationUnits(e.Allocation)
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
		// The pod is not named: gangs of the same shape get the same message, whichever of
		// them was searched (a message that changed with that would be rewritten every cycle).
		fmt.Fprintf(&b, "; the next pod then fits nowhere (%s)", strings.Join(reasons, ", "))
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
	b.WriteString(st.explainTopology(plans))
	if st.budgetHit {
		fmt.Fprintf(&b, "; search budget of %d tries exhausted", st.s.cfg.MaxTries)
	}
	if st.stepsHit {
		fmt.Fprintf(&b, "; search budget of %d allocator steps exhausted", st.s.cfg.MaxSteps)
	}
	if st.jointCut > 0 {
		fmt.Fprintf(&b, "; %d joint device searches stopped at %d allocator steps", st.jointCut, st.s.cfg.JointSteps)
	}
	if st.guardHit {
		fmt.Fprintf(&b, "; search stopped by the wall-clock guard after %s", st.s.cfg.WallClockGuard)
	}
	return b.String()
}

// Signature identifies gangs that are interchangeable for the search on snap: the same
// multiset of pod shapes and the same topology constraint. Within one cycle capacity only
// shrinks, so a gang whose signature already failed fails again and need not be searched.
// Gangs with required inter-pod affinity get no signature (""): gangs placed before them can
// make them fit.
func (s *Solver) Signature(snap *snapshot.Snapshot, g *Gang) string {
	keys := relevantLabelKeys(snap, g)
	sigs := make([]uint64, 0, len(g.Pods))
	for _, p := range g.Pods {
		if a := p.Pod.Spec.Affinity; a != nil && a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return ""
		}
		sigs = append(sigs, s.podSignature(p, keys, snapshot.PodRequests(p.Pod)))
	}
	sort.Slice(sigs, func(i, j int) bool { return sigs[i] < sigs[j] })
	var b strings.Builder
	if g.Topology != nil {
		fmt.Fprintf(&b, "%s/%v/%v/%s/%v|", g.Topology.Key, g.Topology.Required, g.Topology.RequiredKeys, g.Topology.PreferredKey, g.Topology.Levels)
	}
	if len(g.Avoid) > 0 {
		avoid := make([]string, 0, len(g.Avoid))
		for n := range g.Avoid {
			avoid = append(avoid, n)
		}
		sort.Strings(avoid)
		fmt.Fprintf(&b, "avoid%v|", avoid)
	}
	for _, sig := range sigs {
		fmt.Fprintf(&b, "%x,", sig)
	}
	return b.String()
}
