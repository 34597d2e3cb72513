package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/contract"
	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

// The invariants, each a counter that must stay 0.
const (
	invDeviceOverCapacity  = "device allocated beyond its capacity"
	invQueueOverLimit      = "queue above its GPU limit"
	invGangPartlyBound     = "gang partly bound longer than the period"
	invPreparedOnWrongNode = "claim prepared on a node it is not allocated to"
	invDeletedPodPrepared  = "ended or deleted pod's claim still prepared after the grace period"
	invCheckpointNoClaim   = "checkpoint entry without a claim"
	invPreparedNotInCkpt   = "claim prepared (kubelet) but missing from the checkpoint"
	invMIGOrphan           = "MIG instance tessera created that no claim owns"
	invBoundPodClaimFree   = "bound pod's claim not allocated and reserved for it"
	invDrainLeftover       = "left after the drain (pods, claims, checkpoint entries)"
)

var invariants = []string{invDeviceOverCapacity, invQueueOverLimit, invGangPartlyBound, invPreparedOnWrongNode,
	invDeletedPodPrepared, invCheckpointNoClaim, invPreparedNotInCkpt, invMIGOrphan, invBoundPodClaimFree, invDrainLeftover}

// checker evaluates the invariants every few seconds from consistent lists
// of the API server (direct, not through the fault proxy) and the nodes'
// files. Conditions that are legitimately true for a moment (a gang whose
// bindings are in flight, a claim whose unprepare is under way) count only
// once they have held for longer than their period or grace; each violation
// is counted once, by a key naming what violated it.
type checker struct {
	e  *env
	l  *loadGen
	tr *tracker
	// period: a gang may be partly bound this long (its commit's bindings
	// in flight, or a new leader finishing them). grace: a checkpoint or
	// kubelet condition may hold this long after the node last recovered
	// from a fault. limitGrace: decisions made under a queue's old limit
	// may still bind this long after the limit changed.
	period, grace, limitGrace time.Duration

	mu      sync.Mutex
	counts  map[string]int
	counted map[string]bool
	since   map[string]time.Time
	details []string
	checks  int
	lastErr error
	// settled is when each node last came back from a fault; a node in a
	// fault now is absent from it (its files are not checked).
	settled map[string]time.Time
	// bound: the pods bound (not ended, not being deleted) in the previous
	// check's pod list.
	bound map[types.UID]bool
}

func newChecker(e *env, l *loadGen, tr *tracker) *checker {
	c := &checker{e: e, l: l, tr: tr, period: e.cfg.period, grace: e.cfg.grace, limitGrace: e.cfg.limitGrace,
		counts: map[string]int{}, counted: map[string]bool{}, since: map[string]time.Time{}, settled: map[string]time.Time{}}
	for _, n := range e.nodes {
		c.settled[n.name] = time.Now()
	}
	return c
}

// nodeFault marks a node in a fault (down: true) or back from it.
func (c *checker) nodeFault(node string, down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if down {
		delete(c.settled, node)
	} else {
		c.settled[node] = time.Now()
	}
}

func (c *checker) violate(inv, key, detail string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counted[inv+"|"+key] {
		return
	}
	c.counted[inv+"|"+key] = true
	c.counts[inv]++
	line := fmt.Sprintf("%.1fs %s: %s", time.Since(c.e.start).Seconds(), inv, detail)
	if len(c.details) < 100 {
		c.details = append(c.details, line)
	}
	c.e.logf("INVARIANT VIOLATED %s", line)
}

// held reports whether the condition key has held continuously, since
// no earlier than from, for longer than d; seen lists the keys that hold now.
func (c *checker) held(key string, from time.Time, d time.Duration, seen map[string]bool) bool {
	seen[key] = true
	c.mu.Lock()
	defer c.mu.Unlock()
	first, ok := c.since[key]
	if !ok {
		first = time.Now()
		c.since[key] = first
	}
	if from.After(first) {
		first = from
	}
	return time.Since(first) > d
}

func (c *checker) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.check(ctx); err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
		}
	}
}

// check evaluates every invariant once.
func (c *checker) check(ctx context.Context) error {
	slices, err := c.e.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claims, err := c.e.kube.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods, err := c.e.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	queues, err := c.e.ts.Queues().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	c.checkDevices(slices.Items, claims.Items)
	c.checkQueues(slices.Items, claims.Items, pods.Items, queues.Items)
	c.checkGangs(pods.Items, seen)
	c.checkNodes(claims.Items, pods.Items, seen)
	c.checkBoundPods(claims.Items, pods.Items)
	c.mu.Lock()
	for k := range c.since {
		if !seen[k] {
			delete(c.since, k) // the condition cleared
		}
	}
	c.checks++
	c.mu.Unlock()
	return nil
}

type devKey struct{ pool, device string }

// checkBoundPods: a bound pod holds its claims — each allocated and
// reserved for it — or their devices are free for another claim while the
// pod runs or is about to (the scheduler writes the claims before it
// binds). Exact without a grace: the claims are listed before the pods, and
// a pod bound (not ended, not being deleted) in the previous check and in
// this one was bound and not ended when the claims were listed (a binding
// and a phase do not go back, a deletion is not withdrawn), so its claims
// were reserved for it then.
func (c *checker) checkBoundPods(claims []resourceapi.ResourceClaim, pods []v1.Pod) {
	byName := map[string]*resourceapi.ResourceClaim{}
	for i := range claims {
		byName[claims[i].Name] = &claims[i]
	}
	bound := map[types.UID]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || p.DeletionTimestamp != nil {
			continue
		}
		bound[p.UID] = true
		if !c.bound[p.UID] {
			continue
		}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			cl := byName[*st.ResourceClaimName]
			reserved := false
			if cl != nil && cl.Status.Allocation != nil {
				for _, r := range cl.Status.ReservedFor {
					reserved = reserved || r.UID == p.UID
				}
			}
			if !reserved {
				what := "gone"
				if cl != nil {
					what = fmt.Sprintf("allocated %v, reserved for %v", cl.Status.Allocation != nil, cl.Status.ReservedFor)
				}
				c.violate(invBoundPodClaimFree, string(p.UID)+"/"+*st.ResourceClaimName,
					fmt.Sprintf("pod %s (%s) is bound to %s, its claim %s is %s", p.Name, p.Status.Phase, p.Spec.NodeName, *st.ResourceClaimName, what))
			}
		}
	}
	c.mu.Lock()
	c.bound = bound
	c.mu.Unlock()
}

// checkDevices: no device is held exclusively by two claims, or exclusively
// by one while shared by another; the shares of a device stay within its
// consumable capacity; and the exclusive allocations of a node's devices stay
// within the counters of its partitionable GPUs (a whole GPU and a MIG
// device carved from it, or two overlapping MIG placements, exceed them).
func (c *checker) checkDevices(slices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim) {
	devices := map[devKey]*resourceapi.Device{}
	counterCap := map[string]resource.Quantity{} // pool/set/counter → capacity
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != contract.DriverName {
			continue
		}
		for j := range s.Spec.Devices {
			devices[devKey{s.Spec.Pool.Name, s.Spec.Devices[j].Name}] = &s.Spec.Devices[j]
		}
		for _, cs := range s.Spec.SharedCounters {
			for name, ctr := range cs.Counters {
				counterCap[s.Spec.Pool.Name+"/"+cs.Name+"/"+name] = ctr.Value
			}
		}
	}
	exclusive := map[devKey][]string{}
	shared := map[devKey][]string{}
	consumed := map[devKey]map[resourceapi.QualifiedName]*resource.Quantity{}
	counterUse := map[string]*resource.Quantity{}
	counterUsers := map[string][]string{}
	for i := range claims {
		cl := &claims[i]
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != contract.DriverName || (r.AdminAccess != nil && *r.AdminAccess) {
				continue
			}
			k := devKey{r.Pool, r.Device}
			if r.ShareID == nil {
				exclusive[k] = append(exclusive[k], cl.Name)
				d := devices[k]
				if d == nil {
					continue
				}
				for _, cc := range d.ConsumesCounters {
					for name, ctr := range cc.Counters {
						ck := r.Pool + "/" + cc.CounterSet + "/" + name
						if counterUse[ck] == nil {
							counterUse[ck] = resource.NewQuantity(0, resource.BinarySI)
						}
						counterUse[ck].Add(ctr.Value)
						counterUsers[ck] = append(counterUsers[ck], cl.Name+":"+r.Device)
					}
				}
				continue
			}
			shared[k] = append(shared[k], cl.Name)
			if consumed[k] == nil {
				consumed[k] = map[resourceapi.QualifiedName]*resource.Quantity{}
			}
			for name, q := range r.ConsumedCapacity {
				if consumed[k][name] == nil {
					consumed[k][name] = resource.NewQuantity(0, resource.BinarySI)
				}
				consumed[k][name].Add(q)
			}
		}
	}
	for k, holders := range exclusive {
		if len(holders) > 1 || len(shared[k]) > 0 {
			sort.Strings(holders)
			c.violate(invDeviceOverCapacity, k.pool+"/"+k.device+"/"+strings.Join(holders, ","),
				fmt.Sprintf("%s/%s held exclusively by %v and shared by %v", k.pool, k.device, holders, shared[k]))
		}
	}
	for k, use := range consumed {
		d := devices[k]
		if d == nil {
			continue
		}
		for name, q := range use {
			if capacity, ok := d.Capacity[name]; ok && q.Cmp(capacity.Value) > 0 {
				holders := append([]string(nil), shared[k]...)
				sort.Strings(holders)
				c.violate(invDeviceOverCapacity, k.pool+"/"+k.device+"/"+string(name)+"/"+strings.Join(holders, ","),
					fmt.Sprintf("%s/%s: %s %s consumed by %v, capacity %s", k.pool, k.device, q.String(), name, holders, capacity.Value.String()))
			}
		}
	}
	for ck, use := range counterUse {
		if capacity, ok := counterCap[ck]; ok && use.Cmp(capacity) > 0 {
			users := counterUsers[ck]
			sort.Strings(users)
			c.violate(invDeviceOverCapacity, ck+"/"+strings.Join(users, ","),
				fmt.Sprintf("counter %s: %s used by %v, capacity %s", ck, use.String(), users, capacity.String()))
		}
	}
}

// usable reports whether a pod holds its devices now: bound, not ended and
// not being deleted.
func usable(p *v1.Pod) bool {
	return p.Spec.NodeName != "" && p.DeletionTimestamp == nil && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed
}

// checkQueues: a queue's usage (GPU units, contract.Costs, of the claims of
// its bound, running pods) is above its limit only if every pod counted
// was bound before the limit last changed (plus limitGrace). Exact: pods
// do not come back from the end, so all pods counted now already held
// their devices when the newest of them was bound; if that bind came after
// the limit took effect, the scheduler admitted a gang above the limit.
func (c *checker) checkQueues(slices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim, pods []v1.Pod, queues []v1alpha1.Queue) {
	ptrs := make([]*resourceapi.ResourceSlice, len(slices))
	for i := range slices {
		ptrs[i] = &slices[i]
	}
	costs := contract.Costs(ptrs)
	byName := map[string]*resourceapi.ResourceClaim{}
	for i := range claims {
		byName[claims[i].Name] = &claims[i]
	}
	usage := map[string]float64{}
	newest := map[string]time.Time{}
	newestPod := map[string]string{}
	parent := map[string]string{}
	for _, q := range queues {
		parent[q.Name] = q.Spec.Parent
	}
	for i := range pods {
		p := &pods[i]
		if !usable(p) {
			continue
		}
		units := 0.0
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil || byName[*st.ResourceClaimName] == nil || byName[*st.ResourceClaimName].Status.Allocation == nil {
				continue
			}
			for _, r := range byName[*st.ResourceClaimName].Status.Allocation.Devices.Results {
				if cost, ok := costs[contract.DeviceRef{Driver: r.Driver, Pool: r.Pool, Device: r.Device}]; ok {
					units += cost.Result(&r)
				}
			}
		}
		bound := c.tr.boundTime(p.Name)
		if bound.IsZero() {
			bound = time.Now()
		}
		for q := p.Labels[v1alpha1.QueueLabel]; q != ""; q = parent[q] {
			usage[q] += units
			if bound.After(newest[q]) {
				newest[q], newestPod[q] = bound, p.Name
			}
		}
	}
	for _, q := range queues {
		if q.Spec.Resources.GPU == nil || q.Spec.Resources.GPU.Limit == nil {
			continue
		}
		limit := q.Spec.Resources.GPU.Limit.AsApproximateFloat64()
		changed := c.l.limitChangedAt(q.Name)
		if usage[q.Name] > limit+1e-6 && newest[q.Name].After(changed.Add(c.limitGrace)) {
			c.violate(invQueueOverLimit, q.Name+"/"+newestPod[q.Name],
				fmt.Sprintf("queue %s uses %.3f GPUs, limit %.0f (since %.1fs); newest pod %s bound at %.1fs",
					q.Name, usage[q.Name], limit, changed.Sub(c.e.start).Seconds(), newestPod[q.Name], newest[q.Name].Sub(c.e.start).Seconds()))
		}
	}
}

// checkGangs: a gang whose pods all exist (none deleted) is bound entirely
// or not at all, except for at most one period.
func (c *checker) checkGangs(pods []v1.Pod, seen map[string]bool) {
	type g struct{ pods, bound int }
	gangs := map[string]*g{}
	broken := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		name := p.Annotations[v1alpha1.PodGroupAnnotation]
		if gangs[name] == nil {
			gangs[name] = &g{}
		}
		gangs[name].pods++
		if p.Spec.NodeName != "" {
			gangs[name].bound++
		}
		if p.DeletionTimestamp != nil {
			broken[name] = true
		}
	}
	c.l.mu.Lock()
	sizes := map[string]int{}
	for name, gg := range c.l.gangs {
		if !gg.deleted {
			sizes[name] = gg.size
		}
	}
	c.l.mu.Unlock()
	for name, gg := range gangs {
		size := sizes[name]
		if size == 0 || broken[name] || gg.pods != size || gg.bound == 0 || gg.bound == size {
			continue
		}
		if c.held("gang/"+name, time.Time{}, c.period, seen) {
			c.violate(invGangPartlyBound, name, fmt.Sprintf("gang %s: %d of %d pods bound for more than %s", name, gg.bound, size, c.period))
		}
	}
}

// kubeletState is the simulated kubelet's state file (its DRA checkpoint).
type kubeletState map[types.UID]struct {
	Claims map[string][]struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"claims"`
	Done bool `json:"done"`
}

func readKubeletState(path string) (kubeletState, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st kubeletState
	return st, json.Unmarshal(data, &st)
}

// checkNodes compares each node's checkpoint with the API server and with
// its kubelet's state.
func (c *checker) checkNodes(claims []resourceapi.ResourceClaim, pods []v1.Pod, seen map[string]bool) {
	byUID := map[types.UID]*resourceapi.ResourceClaim{}
	for i := range claims {
		byUID[claims[i].UID] = &claims[i]
	}
	podByUID := map[types.UID]*v1.Pod{}
	for i := range pods {
		podByUID[pods[i].UID] = &pods[i]
	}
	for _, n := range c.e.nodes {
		ckptPath, statePath, name := n.checkpointPath(), n.kubeletState(), n.name
		c.mu.Lock()
		settled, ok := c.settled[name]
		c.mu.Unlock()
		if !ok {
			continue // in a fault now
		}
		ckpt, err := checkpoint.Read(ckptPath)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			continue // being replaced, or the node's directory just went
		}
		entries := map[types.UID]*checkpoint.Claim{}
		if ckpt != nil {
			entries = ckpt.Data.Claims
		}
		for uid, e := range entries {
			if e == nil {
				continue
			}
			cl := byUID[uid]
			switch {
			case cl == nil:
				if c.held("noclaim/"+name+"/"+string(uid), settled, c.grace, seen) {
					c.violate(invCheckpointNoClaim, name+"/"+string(uid), fmt.Sprintf("%s: checkpoint entry %s/%s (%s, %s) has no claim for %s", name, e.Namespace, e.Name, uid, e.State, c.grace))
				}
			case cl.Status.Allocation != nil && e.State == checkpoint.PrepareCompleted:
				for _, r := range cl.Status.Allocation.Devices.Results {
					if r.Driver == contract.DriverName && r.Pool != name {
						c.violate(invPreparedOnWrongNode, name+"/"+string(uid), fmt.Sprintf("claim %s prepared on %s, allocated %s/%s", cl.Name, name, r.Pool, r.Device))
					}
				}
			}
			if cl != nil {
				live := false
				for _, ref := range cl.Status.ReservedFor {
					if p := podByUID[ref.UID]; p != nil && p.DeletionTimestamp == nil && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
						live = true
					}
				}
				if !live && c.held("ended/"+name+"/"+string(uid), settled, c.grace, seen) {
					c.violate(invDeletedPodPrepared, name+"/"+string(uid), fmt.Sprintf("%s: claim %s still prepared (%s) %s after its pods ended or went", name, cl.Name, e.State, c.grace))
				}
			}
		}
		if n.mode == modeMIG {
			c.checkMIG(n, entries, settled, seen)
		}
		st, err := readKubeletState(statePath)
		if err != nil {
			continue
		}
		for podUID, sp := range st {
			if sp.Done {
				continue
			}
			for _, cs := range sp.Claims[contract.DriverName] {
				e := entries[types.UID(cs.UID)]
				if (e == nil || e.State != checkpoint.PrepareCompleted) && c.held("missing/"+name+"/"+cs.UID, settled, c.grace, seen) {
					c.violate(invPreparedNotInCkpt, name+"/"+cs.UID, fmt.Sprintf("%s: kubelet has claim %s prepared for pod %s, checkpoint has %v", name, cs.Name, podUID, e))
				}
			}
		}
	}
}

func (c *checker) snapshot() (map[string]int, int, []string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, inv := range invariants {
		out[inv] = c.counts[inv]
	}
	return out, c.checks, append([]string(nil), c.details...), c.lastErr
}

// migInstances lists a MIG node's instances per GPU index, from its mock
// machine's control socket (GPU.Instances), as "gi<ID>" keys.
func migInstances(ctx context.Context, n *chaosNode) (map[int][]string, error) {
	out := map[int][]string{}
	for i := range gpusPerNode {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		reply, err := nvmlbackend.QueryControl(ctx, n.controlSocket(), "instances "+strconv.Itoa(i))
		cancel()
		if err != nil {
			return nil, err
		}
		for _, in := range strings.Fields(reply) {
			// "<profile>@<start>(gi<ID>/ci<ID>)"
			_, rest, ok := strings.Cut(in, "(")
			if gi, _, ok2 := strings.Cut(rest, "/"); ok && ok2 {
				out[i] = append(out[i], gi)
			}
		}
	}
	return out, nil
}

// checkMIG: every MIG instance on the node's GPUs (all created by tessera:
// the GPUs are in dynamic MIG mode and a new machine has no instances; the
// machine keeps them over tessera-node restarts) is recorded, created, in
// the plugin's checkpoint, except for the moment between its creation and
// the checkpoint's write.
func (c *checker) checkMIG(n *chaosNode, entries map[types.UID]*checkpoint.Claim, settled time.Time, seen map[string]bool) {
	owned := map[string]bool{}
	for _, e := range entries {
		if e == nil {
			continue
		}
		for _, d := range e.Devices {
			if d.MIG != nil && d.MIG.Created {
				owned[fmt.Sprintf("%d/gi%d", d.MIG.ParentMinor, d.MIG.GIID)] = true
			}
		}
	}
	instances, err := migInstances(c.e.ctx, n)
	if err != nil {
		return // restarting
	}
	for gpu, gis := range instances {
		for _, gi := range gis {
			key := fmt.Sprintf("%d/%s", gpu, gi)
			if !owned[key] && c.held("mig/"+n.name+"/"+key, settled, c.grace, seen) {
				c.violate(invMIGOrphan, n.name+"/"+key, fmt.Sprintf("%s: MIG instance %s on GPU %d is in no checkpoint entry for %s", n.name, gi, gpu, c.grace))
			}
		}
	}
}
