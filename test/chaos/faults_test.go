package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
	"github.com/tessera-gpu/tessera/sandbox/cluster"
)

// The fault kinds.
const (
	faultLeaderKill      = "kill -9 of the leading scheduler (mid-commit)"
	faultLeaderStop      = "SIGTERM of the leading scheduler (mid-commit: a rolling update)"
	faultAPIServer       = "kube-apiserver restart (kill -9)"
	faultEtcd            = "etcd restart (kill -9)"
	faultNodeKillPrepare = "kill -9 of tessera-node mid-prepare (MIG)"
	faultKillPrepWhole   = "kill -9 of tessera-node mid-prepare (whole GPU)"
	faultKillPrepMPS     = "kill -9 of tessera-node mid-prepare (MPS share)"
	faultKillPrepTS      = "kill -9 of tessera-node mid-prepare (time-sliced GPU)"
	faultNodeKillUnprep  = "kill -9 of tessera-node mid-unprepare"
	faultKubelet         = "kubelet restart (plugin re-registration)"
	faultNodeDelete      = "node deleted with running pods"
	faultGPULost         = "GPU lost and back"
	faultAPIProxy        = "API errors and latency (proxy: 429, 500, 409, slow, dropped watches)"
	faultAPIApplied      = "API writes applied but answered 500 or cut (proxy)"
)

var faultKinds = []string{faultLeaderKill, faultLeaderStop, faultAPIServer, faultEtcd, faultNodeKillPrepare, faultKillPrepWhole, faultKillPrepMPS, faultKillPrepTS, faultNodeKillUnprep,
	faultKubelet, faultNodeDelete, faultGPULost, faultAPIProxy, faultAPIApplied}

// faultRecord is one injected fault.
type faultRecord struct {
	Seq      int     `json:"seq"`
	Kind     string  `json:"kind"`
	Target   string  `json:"target"`
	Start    float64 `json:"startSeconds"`
	End      float64 `json:"endSeconds"`
	Note     string  `json:"note,omitempty"`
	Recovery float64 `json:"recoverySeconds"` // -1: no gang bound after it within the run
	// Landed: the kill landed where it is meant to (mid-commit,
	// mid-prepare, mid-unprepare); nil for the other kinds.
	Landed *bool     `json:"landed,omitempty"`
	end    time.Time `json:"-"`
	Err    string    `json:"error,omitempty"`
}

// injector injects faults one at a time, at seeded random times, until its
// context ends.
type injector struct {
	e   *env
	c   *checker
	tr  *tracker
	rng *rand.Rand

	mu      sync.Mutex
	records []*faultRecord

	prepareKills   int // killNodeAt(prepare) calls so far (run's goroutine only)
	unprepareKills int // mid-unprepare kills so far (run's goroutine only)
}

func newInjector(e *env, c *checker, tr *tracker) *injector {
	return &injector{e: e, c: c, tr: tr, rng: rand.New(rand.NewPCG(e.seed, 2))}
}

func (in *injector) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(in.rng.Int64N(int64(hi-lo)))
}

func (in *injector) run(ctx context.Context) {
	// Every kind in turn, in a seeded order per round, so that a short run
	// still sees each kind.
	var order []string
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(in.between(in.e.cfg.minGap, in.e.cfg.maxGap)):
		}
		if len(order) == 0 {
			order = append([]string(nil), in.e.cfg.faults...)
			in.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		kind := order[0]
		order = order[1:]
		rec := &faultRecord{Seq: seq, Kind: kind, Start: time.Since(in.e.start).Seconds(), Recovery: -1}
		in.e.logf("fault #%d (seed %d): %s", seq, in.e.seed, kind)
		// The fault runs to its end (every node and replica back) even
		// when the run ends meanwhile.
		err := in.inject(in.e.ctx, kind, rec)
		rec.end = time.Now()
		rec.End = time.Since(in.e.start).Seconds()
		if err != nil {
			rec.Err = err.Error()
			in.e.logf("fault #%d: %v", seq, err)
		}
		in.e.logf("fault #%d done: %s %s", seq, rec.Target, rec.Note)
		in.mu.Lock()
		in.records = append(in.records, rec)
		in.mu.Unlock()
	}
}

func (in *injector) inject(ctx context.Context, kind string, rec *faultRecord) error {
	switch kind {
	case faultLeaderKill:
		return in.killLeader(ctx, rec, false)
	case faultLeaderStop:
		return in.killLeader(ctx, rec, true)
	case faultAPIServer:
		rec.Target = cluster.ComponentAPIServer
		return in.e.cp.Restart(ctx, cluster.ComponentAPIServer)
	case faultEtcd:
		rec.Target = cluster.ComponentEtcd
		return in.e.cp.Restart(ctx, cluster.ComponentEtcd)
	case faultNodeKillPrepare:
		return in.killNodeAt(ctx, rec, true)
	case faultNodeKillUnprep:
		// In turn on a MIG device's destroy, a time-sliced claim's
		// unprepare (a whole GPU's time slice reset) and an MPS share's
		// (its control daemon's quit).
		in.unprepareKills++
		switch in.unprepareKills % 3 {
		case 2:
			return in.killMidPrepare(ctx, rec, unprepTimeSliced)
		case 0:
			return in.killMidPrepare(ctx, rec, unprepMPS)
		}
		return in.killNodeAt(ctx, rec, false)
	case faultKillPrepWhole, faultKillPrepMPS, faultKillPrepTS:
		return in.killMidPrepare(ctx, rec, kind)
	case faultKubelet:
		n := in.pickNode(false)
		rec.Target = n.name
		in.c.nodeFault(n.name, true)
		defer in.c.nodeFault(n.name, false)
		n.mu.Lock()
		defer n.mu.Unlock()
		n.stopKubelet()
		time.Sleep(in.between(time.Second, 3*time.Second))
		n.startKubelet(in.e.kube)
		return nil
	case faultNodeDelete:
		return in.deleteNode(ctx, rec)
	case faultGPULost:
		n := in.pickNode(false)
		gpu := in.rng.IntN(gpusPerNode)
		rec.Target = fmt.Sprintf("%s GPU %d", n.name, gpu)
		in.c.nodeFault(n.name, true)
		defer in.c.nodeFault(n.name, false)
		if err := nvmlbackend.SendControl(ctx, n.controlSocket(), "lost "+strconv.Itoa(gpu)); err != nil {
			return err
		}
		time.Sleep(in.between(8*time.Second, 15*time.Second))
		return nvmlbackend.SendControl(ctx, n.controlSocket(), "back "+strconv.Itoa(gpu))
	case faultAPIProxy:
		rec.Target = "proxy"
		before := [5]int64{in.e.proxy.tooMany.Load(), in.e.proxy.internal.Load(), in.e.proxy.conflict.Load(), in.e.proxy.slow.Load(), in.e.proxy.droppedWatches.Load()}
		in.e.proxy.setFaults(true)
		time.Sleep(in.between(15*time.Second, 30*time.Second))
		in.e.proxy.setFaults(false)
		rec.Note = fmt.Sprintf("429: %d, 500: %d, 409: %d, slow: %d, watches dropped: %d",
			in.e.proxy.tooMany.Load()-before[0], in.e.proxy.internal.Load()-before[1], in.e.proxy.conflict.Load()-before[2],
			in.e.proxy.slow.Load()-before[3], in.e.proxy.droppedWatches.Load()-before[4])
		return nil
	case faultAPIApplied:
		rec.Target = "proxy"
		before := [2]int64{in.e.proxy.applied500.Load(), in.e.proxy.appliedCut.Load()}
		in.e.proxy.applied.Store(true)
		time.Sleep(in.between(15*time.Second, 30*time.Second))
		in.e.proxy.applied.Store(false)
		rec.Note = fmt.Sprintf("writes applied, answered 500: %d, applied, cut before the answer: %d",
			in.e.proxy.applied500.Load()-before[0], in.e.proxy.appliedCut.Load()-before[1])
		return nil
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// killLeader waits (up to 15 s) for a claim allocation to be written — the
// leader is committing a gang — and kills it with SIGKILL at once, or, with
// graceful, stops it as the kubelet does a pod of a rolling update (SIGTERM,
// SIGKILL after the 30 s grace period); a new replica takes its slot, as a
// Deployment would start one.
func (in *injector) killLeader(ctx context.Context, rec *faultRecord, graceful bool) error {
	var leader *replica
	for range 100 {
		if leader = in.e.leader(ctx); leader != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if leader == nil {
		return fmt.Errorf("no leader")
	}
	rec.Target = fmt.Sprintf("replica %d (pid %d)", leader.slot, leader.cmd.Process.Pid)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	w, err := in.e.kube.ResourceV1().ResourceClaims(namespace).Watch(wctx, metav1.ListOptions{})
	mid := false
	if err == nil {
	loop:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					break loop
				}
				if cl, isClaim := ev.Object.(*resourceapi.ResourceClaim); isClaim && ev.Type == watch.Modified && cl.Status.Allocation != nil && len(cl.Status.ReservedFor) > 0 {
					mid = true
					break loop
				}
			case <-wctx.Done():
				break loop
			}
		}
		w.Stop()
	}
	verb := "killed"
	if graceful {
		took, exited := leader.stop(30 * time.Second)
		verb = fmt.Sprintf("stopped (exited %s after SIGTERM)", took.Round(10*time.Millisecond))
		if !exited {
			verb = "stopped (SIGKILL: still running 30s after SIGTERM)"
		}
	} else {
		leader.kill()
	}
	rec.Landed = &mid
	rec.Note = verb + " after a claim allocation was written (mid-commit)"
	if !mid {
		rec.Note = "no commit within 15s: " + verb + " idle"
	}
	time.Sleep(time.Second)
	r, err := in.e.startReplica(leader.slot)
	if err != nil {
		return err
	}
	in.e.replicas[leader.slot] = r
	// Recovered once a replica leads again.
	for range 300 {
		if in.e.leader(ctx) != nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("no new leader within 60s")
}

// pickNode picks a node at random (withPods: one with running pods, if any).
func (in *injector) pickNode(withPods bool) *chaosNode {
	if withPods {
		var busy []*chaosNode
		running := map[string]bool{}
		for _, obj := range in.tr.store.List() {
			if p := obj.(*v1.Pod); p.Status.Phase == v1.PodRunning {
				running[p.Spec.NodeName] = true
			}
		}
		for _, n := range in.e.nodes {
			if running[n.name] {
				busy = append(busy, n)
			}
		}
		sort.Slice(busy, func(i, j int) bool { return busy[i].name < busy[j].name })
		if len(busy) > 0 {
			return busy[in.rng.IntN(len(busy))]
		}
	}
	return in.e.nodes[in.rng.IntN(len(in.e.nodes))]
}

// killNodeAt kills a MIG node's tessera-node with SIGKILL mid-prepare or
// mid-unprepare, at a crash point in the mock machine (not in tessera): a
// hold on its control socket parks, at the call's entry, a prepare's GPU
// instance create (CreateGpuInstanceWithPlacement, the first side effect,
// after PrepareStarted is checkpointed) or, on every other prepare kill, its
// compute instance create (CreateComputeInstance: the GPU instance exists,
// the checkpoint knows only its placement), or an unprepare's compute
// instance destroy (DestroyComputeInstance, the unprepare's first), and the
// process is killed while the call is parked. The machine keeps its
// instances over the restart (the mock's state file), so the next
// tessera-node meets what the killed one left. The hold is armed on
// every MIG node and the first node where a call parks (within 30 s) is
// killed; the others are released. The kill is counted as landed when a
// call was parked and the checkpoint shows the claim in the state the crash
// is meant to hit (PrepareStarted; still PrepareCompleted, for an
// unprepare). tessera-node starts again after 1–3 s on the same directories
// (the hold dies with the process).
func (in *injector) killNodeAt(ctx context.Context, rec *faultRecord, prepare bool) error {
	method, want := "DestroyComputeInstance", checkpoint.PrepareCompleted
	if prepare {
		method, want = "CreateGpuInstanceWithPlacement", checkpoint.PrepareStarted
		if in.prepareKills++; in.prepareKills%2 == 0 {
			method = "CreateComputeInstance"
		}
	}
	candidates := in.nodesOf(modeMIG)
	var errs []error
	for _, c := range candidates {
		if err := nvmlbackend.SendControl(ctx, c.controlSocket(), "hold "+method); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	var n *chaosNode
	var gpus []string
	for deadline := time.Now().Add(30 * time.Second); n == nil && len(errs) == 0 && time.Now().Before(deadline); {
		for _, c := range candidates {
			out, err := nvmlbackend.QueryControl(ctx, c.controlSocket(), "held "+method)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
				break
			}
			if out != "0" {
				n, gpus = c, strings.Fields(out)[1:]
				break
			}
		}
		if n == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if n == nil {
		n = in.pickMIGNode()
	}
	rec.Target = n.name
	n.mu.Lock()
	defer n.mu.Unlock()
	in.c.nodeFault(n.name, true)
	defer in.c.nodeFault(n.name, false)
	landed := false
	if gpus != nil {
		// Parked: the state is what it will be at the kill.
		inState := claimsAt(n.checkpointPath(), gpus, want, !prepare)
		landed = inState > 0
		rec.Note = fmt.Sprintf("killed with %s parked on GPU %s; checkpoint: %d claim(s) with a MIG device there %s, instance created %v",
			method, strings.Join(gpus, " "), inState, want, !prepare)
	}
	before, _ := migInstances(ctx, n)
	n.killPlugin()
	for _, c := range candidates {
		if c == n {
			continue
		}
		if err := nvmlbackend.SendControl(ctx, c.controlSocket(), "release "+method); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	rec.Landed = &landed
	if rec.Note == "" {
		rec.Note = fmt.Sprintf("no %s within 30s on %d MIG nodes: killed anyway", method, len(candidates))
	}
	if err := errors.Join(errs...); err != nil {
		rec.Note += fmt.Sprintf(" (control socket: %v)", err)
	}
	time.Sleep(in.between(time.Second, 3*time.Second))
	if err := n.startPlugin(ctx); err != nil {
		return err
	}
	// What the machine kept over the restart, and the new plugin's recovery
	// left (it rolls back an instance of a prepare cut short).
	after, _ := migInstances(ctx, n)
	total, kept := 0, 0
	for gpu, gis := range before {
		total += len(gis)
		for _, gi := range gis {
			if slices.Contains(after[gpu], gi) {
				kept++
			}
		}
	}
	rec.Note += fmt.Sprintf("; MIG instances before the kill %d, still there after the restart %d", total, kept)
	return nil
}

// claimsAt counts the checkpoint's claims in state with a MIG device on one
// of gpus whose instance is (created) or is not yet created.
func claimsAt(path string, gpus []string, state checkpoint.ClaimState, created bool) int {
	ck, err := checkpoint.Read(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range ck.Data.Claims {
		if c == nil || c.State != state {
			continue
		}
		for _, d := range c.Devices {
			if d.MIG != nil && d.MIG.Created == created && slices.Contains(gpus, d.MIG.ParentUUID) {
				n++
				break
			}
		}
	}
	return n
}

// pickMIGNode picks a dynamic-MIG node at random, preferring one with
// running pods.
func (in *injector) pickMIGNode() *chaosNode {
	running := map[string]bool{}
	for _, obj := range in.tr.store.List() {
		if p := obj.(*v1.Pod); p.Status.Phase == v1.PodRunning {
			running[p.Spec.NodeName] = true
		}
	}
	var mig, busy []*chaosNode
	for _, n := range in.e.nodes {
		if n.mode == modeMIG {
			mig = append(mig, n)
			if running[n.name] {
				busy = append(busy, n)
			}
		}
	}
	if len(busy) > 0 {
		return busy[in.rng.IntN(len(busy))]
	}
	return mig[in.rng.IntN(len(mig))]
}

// deleteNode deletes a node with running pods (the machine is gone: its
// tessera-node and kubelet die with it). The pod garbage collector removes
// its pods (force-deleting them here after 90 s if it has not); then a new
// machine of the same name joins, with empty disks.
func (in *injector) deleteNode(ctx context.Context, rec *faultRecord) error {
	n := in.pickNode(true)
	rec.Target = n.name
	n.mu.Lock()
	defer n.mu.Unlock()
	in.c.nodeFault(n.name, true)
	defer in.c.nodeFault(n.name, false)
	n.killPlugin()
	n.stopKubelet()
	if err := in.e.kube.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete node: %w", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	forced := 0
	for {
		pods, err := in.e.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
		if err == nil && len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) && err == nil {
			for _, p := range pods.Items {
				if err := in.e.kube.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err == nil || apierrors.IsNotFound(err) {
					forced++
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	rec.Note = fmt.Sprintf("pods force-deleted by the test: %d", forced)
	if err := n.newDir(); err != nil {
		return err
	}
	n.startKubelet(in.e.kube)
	return n.startPlugin(ctx)
}

// records returns the faults injected so far, with their recovery times
// (until the next gang was fully bound).
func (in *injector) snapshot() []*faultRecord {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, r := range in.records {
		if t, ok := in.tr.firstGangBoundAfter(r.end); ok {
			r.Recovery = t.Sub(r.end).Seconds()
		}
	}
	return append([]*faultRecord(nil), in.records...)
}
