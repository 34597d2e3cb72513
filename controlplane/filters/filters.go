// Package filters runs the kube-scheduler's own filter plugins
// (k8s.io/kubernetes/pkg/scheduler/framework/plugins) for the gang solver, on the solver's
// in-memory View instead of the kube-scheduler's cache. Node feasibility is therefore exactly
// the kube-scheduler's: node name, unschedulable, taints, node affinity, host ports, resources,
// inter-pod affinity and anti-affinity, topology spread, volume binding, volume restrictions,
// CSI volume limits and volume zones. Devices (DRA) are not here: the solver allocates them
// with the structured allocator.
//
// k8s.io/kubernetes is a heavy dependency; it is imported only by this package.
package filters

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	configv1 "k8s.io/kube-scheduler/config/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/parallelize"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/interpodaffinity"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeaffinity"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodename"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeports"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeunschedulable"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/podtopologyspread"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/tainttoleration"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumebinding"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumerestrictions"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/volumezone"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/utils/ptr"
)

// Plugin names, in the order the kube-scheduler's default profile runs their filters.
var (
	// staticPlugins depend only on the pod and the node: their verdict for a pod shape on a
	// node does not change while a gang is searched, so the solver caches it.
	staticPlugins = []string{names.NodeUnschedulable, names.NodeName, names.TaintToleration, names.NodeAffinity, names.VolumeZone}
	// dynamicPlugins depend on the pods on the node or in the cluster, including the gang's
	// tentative ones.
	dynamicPlugins = []string{names.NodePorts, names.NodeResourcesFit, names.VolumeRestrictions, names.NodeVolumeLimits, names.PodTopologySpread, names.InterPodAffinity, names.VolumeBinding}
	volumePlugins  = sets.New(names.VolumeZone, names.VolumeRestrictions, names.NodeVolumeLimits, names.VolumeBinding)
)

// Config says what the plugins may read.
type Config struct {
	// Informers provide namespaces (inter-pod affinity namespace selectors) and, when
	// Volumes is set, PVCs, PVs, StorageClasses, CSINodes, CSIDrivers and
	// CSIStorageCapacities. The plugins register their informers in New; the caller starts
	// the factory afterwards and waits for it to sync.
	Informers informers.SharedInformerFactory
	// Client is used by the volume binder to bind volumes (Bind).
	Client kubernetes.Interface
	// Volumes turns on the volume plugins (VolumeBinding, VolumeRestrictions,
	// NodeVolumeLimits, VolumeZone).
	Volumes bool
	// VolumeBindTimeout bounds Bind's wait for the PV controller. Default 10 minutes (the
	// kube-scheduler's default).
	VolumeBindTimeout time.Duration
	// Features of the plugins; nil: from the kube-scheduler feature gates' defaults.
	Features *feature.Features
	// Plugins, when not nil, restricts the plugins to these names (benchmarks measure the
	// filters' cost with an empty list). Nil: all of them.
	Plugins []string
}

// Filters is a set of instantiated filter plugins. Searches on it are serialised (Begin
// holds a lock until End) because the plugins read the View through one shared lister.
type Filters struct {
	lister  *currentView
	plugins map[string]fwk.Plugin
	static  []fwk.FilterPlugin
	dynamic []fwk.FilterPlugin
	pre     []fwk.PreFilterPlugin
	volumes *volumebinding.VolumeBinding
	mu      sync.Mutex
	// pending: parsed copies of pending pods (pendingInfo), guarded by mu.
	pending map[types.UID]pendingEntry
}

// initMetrics creates (without registering) the kube-scheduler's metric objects, which the
// plugins' helpers (the parallelizer) observe; unregistered metrics cost nothing.
var initMetrics sync.Once

// New instantiates the plugins.
func New(ctx context.Context, cfg Config) (*Filters, error) {
	initMetrics.Do(schedmetrics.InitMetrics)
	if cfg.Informers == nil {
		return nil, errors.New("filters: Informers is required")
	}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	if cfg.Features != nil {
		fts = *cfg.Features
	}
	f := &Filters{lister: &currentView{}, plugins: map[string]fwk.Plugin{}, pending: map[types.UID]pendingEntry{}}
	h := &handle{lister: f.lister, informers: cfg.Informers, client: cfg.Client, parallelizer: parallelize.NewParallelizer(parallelize.DefaultParallelism)}
	// NodeResourcesFit leaves an extended resource that a DeviceClass maps (DRA extended
	// resources) to DRA on nodes that do not advertise it; the mapping is the view's.
	h.dra = draManager{f.lister}
	if cfg.Volumes {
		h.csi = nodevolumelimits.NewCSIManager(cfg.Informers.Storage().V1().CSINodes().Lister())
	}
	timeout := cfg.VolumeBindTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	type factory func(context.Context, runtime.Object, fwk.Handle, feature.Features) (fwk.Plugin, error)
	args := map[string]runtime.Object{}
	var err error
	if args[names.NodeAffinity], err = defaulted(&configv1.NodeAffinityArgs{}, &config.NodeAffinityArgs{}); err != nil {
		return nil, err
	}
	if args[names.NodeResourcesFit], err = defaulted(&configv1.NodeResourcesFitArgs{}, &config.NodeResourcesFitArgs{}); err != nil {
		return nil, err
	}
	if args[names.InterPodAffinity], err = defaulted(&configv1.InterPodAffinityArgs{}, &config.InterPodAffinityArgs{}); err != nil {
		return nil, err
	}
	// No default constraints: the system defaults are ScheduleAnyway (scoring only) and would
	// need service and workload informers.
	if args[names.PodTopologySpread], err = defaulted(&configv1.PodTopologySpreadArgs{DefaultingType: configv1.ListDefaulting}, &config.PodTopologySpreadArgs{}); err != nil {
		return nil, err
	}
	if args[names.VolumeBinding], err = defaulted(&configv1.VolumeBindingArgs{BindTimeoutSeconds: ptr.To(int64(timeout.Seconds()))}, &config.VolumeBindingArgs{}); err != nil {
		return nil, err
	}
	factories := map[string]factory{
		names.NodeUnschedulable:  nodeunschedulable.New,
		names.NodeName:           nodename.New,
		names.TaintToleration:    tainttoleration.New,
		names.NodeAffinity:       nodeaffinity.New,
		names.NodePorts:          nodeports.New,
		names.NodeResourcesFit:   noderesources.NewFit,
		names.PodTopologySpread:  podtopologyspread.New,
		names.InterPodAffinity:   interpodaffinity.New,
		names.VolumeZone:         volumezone.New,
		names.VolumeRestrictions: volumerestrictions.New,
		names.NodeVolumeLimits:   nodevolumelimits.NewCSI,
		names.VolumeBinding:      volumebinding.New,
	}
	add := func(list []string, into *[]fwk.FilterPlugin) error {
		for _, name := range list {
			if volumePlugins.Has(name) && !cfg.Volumes {
				continue
			}
			if cfg.Plugins != nil && !slices.Contains(cfg.Plugins, name) {
				continue
			}
			p, err := factories[name](ctx, args[name], h, fts)
			if err != nil {
				return fmt.Errorf("plugin %s: %w", name, err)
			}
			f.plugins[name] = p
			*into = append(*into, p.(fwk.FilterPlugin))
			if pf, ok := p.(fwk.PreFilterPlugin); ok {
				f.pre = append(f.pre, pf)
			}
		}
		return nil
	}
	if err := add(staticPlugins, &f.static); err != nil {
		return nil, err
	}
	if err := add(dynamicPlugins, &f.dynamic); err != nil {
		return nil, err
	}
	if p, ok := f.plugins[names.VolumeBinding]; ok {
		f.volumes = p.(*volumebinding.VolumeBinding)
	}
	// The namespace informer is used by inter-pod affinity's namespace selectors.
	cfg.Informers.Core().V1().Namespaces().Informer()
	return f, nil
}

// defaulted applies the kube-scheduler's defaults to versioned plugin args and converts them
// to the internal type the plugins take.
func defaulted(versioned, internal runtime.Object) (runtime.Object, error) {
	scheme.Scheme.Default(versioned)
	if err := scheme.Scheme.Convert(versioned, internal, nil); err != nil {
		return nil, fmt.Errorf("plugin args %T: %w", versioned, err)
	}
	return internal, nil
}

// Plugins lists the instantiated filter plugins in the order they run.
func (f *Filters) Plugins() []string {
	var out []string
	for _, p := range f.static {
		out = append(out, p.Name())
	}
	for _, p := range f.dynamic {
		out = append(out, p.Name())
	}
	return out
}

// pendingInfo returns the parsed copy of a pending pod that tentative placements add to the
// view, kept across searches (parsing affinity terms and summing requests again for every
// search of a waiting gang is most of the cost of its placements). Searches are serialised and
// take every tentative placement back, so one copy per pod suffices; its spec.nodeName is set
// by each placement.
func (f *Filters) pendingInfo(pod *v1.Pod) (*framework.PodInfo, error) {
	if e, ok := f.pending[pod.UID]; ok && pod.UID != "" && e.resourceVersion == pod.ResourceVersion {
		return e.info, nil
	}
	info, err := framework.NewPodInfo(pod.DeepCopy())
	if err != nil {
		return nil, err
	}
	if pod.UID != "" {
		if len(f.pending) > 100000 {
			f.pending = map[types.UID]pendingEntry{}
		}
		f.pending[pod.UID] = pendingEntry{resourceVersion: pod.ResourceVersion, info: info}
	}
	return info, nil
}

type pendingEntry struct {
	resourceVersion string
	info            *framework.PodInfo
}

// Session is one search on a View. It holds the Filters' lock until End.
type Session struct {
	f    *Filters
	view *View
	ctx  context.Context
	// stack are the pods assumed in this session (tentative placements), with their states.
	stack  []stackEntry
	nextID uint64
	// volumeGen counts volume reservations and their reverts: the volume binder's PreFilter
	// state lists the available PersistentVolumes, so it is recomputed when this changed.
	volumeGen int
}

type stackEntry struct {
	id       uint64 // unique within the session
	node     string
	state    *PodState
	reserved bool
}

// Begin starts a search on view. End must be called.
func (f *Filters) Begin(ctx context.Context, view *View) *Session {
	f.mu.Lock()
	f.lister.view = view
	return &Session{f: f, view: view, ctx: ctx}
}

// End takes back every tentative placement (last in first out) and releases the lock.
func (s *Session) End() {
	for len(s.stack) > 0 {
		s.Forget()
	}
	s.f.lister.view = nil
	s.f.mu.Unlock()
}

// PodState is what PreFilter computed for one pod, kept in sync with the session's
// tentative placements.
type PodState struct {
	Pod   *v1.Pod
	state fwk.CycleState
	// nodes restricts the candidates (a PreFilterResult); nil: all nodes.
	nodes sets.Set[string]
	// rejected is set when PreFilter found the pod unschedulable everywhere.
	rejected *fwk.Status
	// applied are the stack entries whose AddPod has been run on state, in order.
	applied []appliedEntry
	// info is the pod parsed once (with the node of its current tentative placement), for
	// the view and the other pods' AddPod/RemovePod.
	info    *framework.PodInfo
	volumes bool
	// volumeGen is the session's volumeGen when VolumeBinding's PreFilter last ran.
	volumeGen int
	// extensions: some plugin that ran PreFilter for the pod keeps state that other pods'
	// placements change (PreFilterExtensions); without, there is nothing to sync.
	extensions bool
}

// Rejected returns why the pod fits no node at all, or "" when it may fit some.
func (p *PodState) Rejected() string {
	if p.rejected == nil {
		return ""
	}
	return statusMessage(p.rejected)
}

// Prepare runs every plugin's PreFilter for pod on the view as it is now (the session's
// tentative pods included). An error is bad input or an internal plugin error.
func (s *Session) Prepare(pod *v1.Pod) (*PodState, error) {
	ps := &PodState{Pod: pod, state: framework.NewCycleState()}
	skip := sets.New[string]()
	nodes, _ := s.view.NodeInfos().List()
	var result *fwk.PreFilterResult
	for _, pl := range s.f.pre {
		r, st := pl.PreFilter(s.ctx, ps.state, pod, nodes)
		switch {
		case st.IsSkip():
			skip.Insert(pl.Name())
			continue
		case st.IsRejected():
			st.SetPlugin(pl.Name())
			if ps.rejected == nil {
				ps.rejected = st
			}
			continue
		case !st.IsSuccess():
			return nil, fmt.Errorf("PreFilter %s for pod %s: %w", pl.Name(), klog.KObj(pod), st.AsError())
		}
		result = result.Merge(r)
	}
	ps.state.SetSkipFilterPlugins(skip)
	if !result.AllNodes() {
		ps.nodes = result.NodeNames
		if len(ps.nodes) == 0 && ps.rejected == nil {
			ps.rejected = fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "no node satisfies the pod's node name or affinity")
		}
	}
	ps.volumes = s.f.volumes != nil && !skip.Has(names.VolumeBinding) && hasPVC(pod)
	ps.volumeGen = s.volumeGen
	for _, pl := range s.f.pre {
		if pl.PreFilterExtensions() != nil && !skip.Has(pl.Name()) {
			ps.extensions = true
		}
	}
	// The pods this session assumed before Prepare are in the view already.
	for _, e := range s.stack {
		ps.applied = append(ps.applied, appliedEntry{id: e.id, state: e.state, node: e.node})
	}
	return ps, nil
}

func hasPVC(pod *v1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			return true
		}
	}
	return false
}

// StaticFilter runs the plugins whose verdict depends only on the pod and the node. It
// returns "" when the node passes, else the reason.
func (s *Session) StaticFilter(ps *PodState, node string) string {
	if ps.rejected != nil {
		return statusMessage(ps.rejected)
	}
	if ps.nodes != nil && !ps.nodes.Has(node) {
		return "node(s) didn't satisfy the pod's node name or affinity"
	}
	return s.run(ps, node, s.f.static)
}

// DynamicFilter runs the plugins that depend on the pods placed so far (the gang's tentative
// pods included). It returns "" when the node passes, else the reason.
func (s *Session) DynamicFilter(ps *PodState, node string) (string, error) {
	if err := s.sync(ps); err != nil {
		return "", err
	}
	if ps.volumes && ps.volumeGen != s.volumeGen {
		// Other pods' volumes were assumed or reverted since: list the free PVs again.
		nodes, _ := s.view.NodeInfos().List()
		if _, st := s.f.volumes.PreFilter(s.ctx, ps.state, ps.Pod, nodes); !st.IsSuccess() {
			if st.IsRejected() {
				return statusMessage(st), nil
			}
			return "", fmt.Errorf("PreFilter VolumeBinding for pod %s: %w", klog.KObj(ps.Pod), st.AsError())
		}
		ps.volumeGen = s.volumeGen
	}
	return s.run(ps, node, s.f.dynamic), nil
}

func (s *Session) run(ps *PodState, node string, plugins []fwk.FilterPlugin) string {
	ni := s.view.Node(node)
	if ni == nil {
		return "node not found"
	}
	skip := ps.state.GetSkipFilterPlugins()
	for _, pl := range plugins {
		if skip.Has(pl.Name()) {
			continue
		}
		if st := pl.Filter(s.ctx, ps.state, ps.Pod, ni); !st.IsSuccess() {
			st.SetPlugin(pl.Name())
			return statusMessage(st)
		}
	}
	return ""
}

// appliedEntry is a stack entry as applied to some pod's PreFilter state.
type appliedEntry struct {
	id    uint64
	state *PodState
	node  string
}

// sync brings the pod's PreFilter state up to date with the session's stack: RemovePod for
// entries that were taken back, AddPod for new ones (the framework's PreFilterExtensions).
func (s *Session) sync(ps *PodState) error {
	if !ps.extensions {
		return nil
	}
	common := 0
	for common < len(ps.applied) && common < len(s.stack) && ps.applied[common].id == s.stack[common].id {
		common++
	}
	skip := ps.state.GetSkipFilterPlugins()
	call := func(e appliedEntry, add bool) error {
		ni := s.view.Node(e.node)
		for _, pl := range s.f.pre {
			ext := pl.PreFilterExtensions()
			if ext == nil || skip.Has(pl.Name()) {
				continue
			}
			var st *fwk.Status
			if add {
				st = ext.AddPod(s.ctx, ps.state, ps.Pod, e.state.info, ni)
			} else {
				st = ext.RemovePod(s.ctx, ps.state, ps.Pod, e.state.info, ni)
			}
			if !st.IsSuccess() {
				return fmt.Errorf("%s of pod %s for %s: %w", pl.Name(), klog.KObj(e.state.Pod), klog.KObj(ps.Pod), st.AsError())
			}
		}
		return nil
	}
	for i := len(ps.applied) - 1; i >= common; i-- {
		if err := call(ps.applied[i], false); err != nil {
			return err
		}
	}
	ps.applied = ps.applied[:common]
	for i := common; i < len(s.stack); i++ {
		e := appliedEntry{id: s.stack[i].id, state: s.stack[i].state, node: s.stack[i].node}
		if err := call(e, true); err != nil {
			return err
		}
		ps.applied = append(ps.applied, e)
	}
	return nil
}

// Assume places pod tentatively on node: it is added to the view and, when it uses volumes,
// the volume binder assumes the volumes chosen by the last DynamicFilter of ps on node. A
// volume assumption that fails is returned as a reason (the node does not fit after all).
func (s *Session) Assume(ps *PodState, node string) (string, error) {
	s.nextID++
	entry := stackEntry{id: s.nextID, node: node, state: ps}
	if ps.volumes {
		if st := s.f.volumes.Reserve(s.ctx, ps.state, ps.Pod, node); !st.IsSuccess() {
			return "volumes: " + statusMessage(st), nil
		}
		entry.reserved = true
		s.volumeGen++
	}
	if ps.info == nil {
		info, err := s.f.pendingInfo(ps.Pod)
		if err != nil {
			return "", fmt.Errorf("pod %s: %w", klog.KObj(ps.Pod), err)
		}
		ps.info = info
	}
	// The pod is in no node now (a pod is placed at most once at a time): its copy can
	// carry the new node.
	ps.info.Pod.Spec.NodeName = node
	if err := s.view.assumeInfo(ps.info, node); err != nil {
		if entry.reserved {
			s.f.volumes.Unreserve(s.ctx, ps.state, ps.Pod, node)
			s.volumeGen++
		}
		return "", err
	}
	s.stack = append(s.stack, entry)
	return "", nil
}

// Forget takes back the last tentative placement.
func (s *Session) Forget() {
	e := s.stack[len(s.stack)-1]
	s.stack = s.stack[:len(s.stack)-1]
	if e.reserved {
		s.f.volumes.Unreserve(s.ctx, e.state.state, e.state.Pod, e.node)
		s.volumeGen++
	}
	if err := s.view.Forget(klog.FromContext(s.ctx)); err != nil {
		// Only possible when the view was changed behind the session's back.
		panic(fmt.Sprintf("filters: %v", err))
	}
}

// Depth is the number of tentative placements.
func (s *Session) Depth() int { return len(s.stack) }

// Volumes is what a placed pod needs done with its volumes: the volume binder's decisions
// for the pod on its node. The zero value (no volumes) does nothing.
type Volumes struct {
	f     *Filters
	state *PodState
	node  string
}

// VolumesOf returns the volume decisions of ps on node (from its last DynamicFilter there).
func (s *Session) VolumesOf(ps *PodState, node string) Volumes {
	if !ps.volumes {
		return Volumes{}
	}
	return Volumes{f: s.f, state: ps, node: node}
}

// Any reports whether there is anything to do.
func (v Volumes) Any() bool { return v.f != nil }

// Reserve assumes the volumes in the volume binder's cache (no API call), so that later
// searches do not pick the same PersistentVolumes. Undo with Unreserve.
func (v Volumes) Reserve(ctx context.Context) error {
	if v.f == nil {
		return nil
	}
	if st := v.f.volumes.Reserve(ctx, v.state.state, v.state.Pod, v.node); !st.IsSuccess() {
		return fmt.Errorf("assume volumes of pod %s on %s: %w", klog.KObj(v.state.Pod), v.node, st.AsError())
	}
	return nil
}

// Unreserve reverts Reserve.
func (v Volumes) Unreserve(ctx context.Context) {
	if v.f != nil {
		v.f.volumes.Unreserve(ctx, v.state.state, v.state.Pod, v.node)
	}
}

// Bind writes the volume decisions as the kube-scheduler's PreBind does (PV claimRef for a
// static binding, the selected-node annotation for provisioning) and waits until the PV
// controller has bound every claim, or the bind timeout passes.
func (v Volumes) Bind(ctx context.Context) error {
	if v.f == nil {
		return nil
	}
	// The binder checks the bindings against the node of the assumed pod.
	assumed := v.state.Pod.DeepCopy()
	assumed.Spec.NodeName = v.node
	if st := v.f.volumes.PreBind(ctx, v.state.state, assumed, v.node); !st.IsSuccess() {
		return fmt.Errorf("bind volumes of pod %s on %s: %w", klog.KObj(v.state.Pod), v.node, st.AsError())
	}
	return nil
}

// statusMessage renders a filter status as the kube-scheduler's event messages do.
func statusMessage(st *fwk.Status) string {
	reasons := st.Reasons()
	if len(reasons) == 0 {
		if err := st.AsError(); err != nil {
			return err.Error()
		}
		return st.Plugin()
	}
	sort.Strings(reasons)
	return strings.Join(reasons, ", ")
}

// currentView is the lister the plugins were given; it points at the session's view.
type currentView struct{ view *View }

func (c *currentView) NodeInfos() fwk.NodeInfoLister       { return c.view.NodeInfos() }
func (c *currentView) StorageInfos() fwk.StorageInfoLister { return c.view.StorageInfos() }
func (c *currentView) PodGroupStates() fwk.PodGroupStateLister {
	return c.view.PodGroupStates()
}
func (c *currentView) PodGroups() fwk.PodGroupLister { return c.view.PodGroups() }
func (c *currentView) CompositePodGroupStates() fwk.CompositePodGroupStateLister {
	return c.view.CompositePodGroupStates()
}
func (c *currentView) CompositePodGroups() fwk.CompositePodGroupLister {
	return c.view.CompositePodGroups()
}

// handle is the part of the framework's Handle that the filter plugins use. The embedded
// interface is nil: a plugin calling anything else panics, which the tests would show.
type handle struct {
	fwk.Handle
	lister       *currentView
	informers    informers.SharedInformerFactory
	client       kubernetes.Interface
	parallelizer fwk.Parallelizer
	dra          fwk.SharedDRAManager
	csi          fwk.CSIManager
}

func (h *handle) SnapshotSharedLister() fwk.SharedLister                 { return h.lister }
func (h *handle) SharedInformerFactory() informers.SharedInformerFactory { return h.informers }
func (h *handle) ClientSet() kubernetes.Interface                        { return h.client }
func (h *handle) Parallelizer() fwk.Parallelizer                         { return h.parallelizer }
func (h *handle) SharedDRAManager() fwk.SharedDRAManager                 { return h.dra }
func (h *handle) SharedCSIManager() fwk.CSIManager                       { return h.csi }

// draManager offers only the extended-resource mapping of the current view
// (NodeResourcesFit's use); claims, slices and classes are the solver's business.
type draManager struct{ lister *currentView }

func (d draManager) ResourceClaims() fwk.ResourceClaimTracker { return nil }
func (d draManager) ResourceSlices() fwk.ResourceSliceLister  { return nil }
func (d draManager) DeviceClasses() fwk.DeviceClassLister     { return nil }
func (d draManager) DeviceClassResolver() fwk.DeviceClassResolver {
	if d.lister.view == nil || d.lister.view.extended == nil {
		return noClasses{}
	}
	return d.lister.view.extended
}

type noClasses struct{}

func (noClasses) GetDeviceClass(v1.ResourceName) *resourceapi.DeviceClass { return nil }
