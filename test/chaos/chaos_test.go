// Package chaos is the chaos run (make chaos, docs/reliability.md): the real
// control plane, eight simulated GPU nodes each with tessera-node as a
// process, two tessera-scheduler replicas with leader election, a seeded load
// generator, faults at seeded random times and invariants checked every few
// seconds. It runs only when CHAOS_DURATION is set.
package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/draplugin/checkpoint"
)

// config of a run; every field has a default, the first two come from the
// environment.
type config struct {
	duration time.Duration // CHAOS_DURATION: how long load and faults run
	seed     uint64        // CHAOS_SEED: the load's and the faults' choices
	// maxWaiting gangs not yet fully bound at a time.
	maxWaiting int
	// Pods run for minRun to maxRun; a gang that waits cancelAfter may be cancelled.
	minRun, maxRun, cancelAfter time.Duration
	// See checker.
	period, grace, limitGrace time.Duration
	// Pause between faults.
	minGap, maxGap time.Duration
	checkEvery     time.Duration
	// faults: the kinds injected (CHAOS_FAULTS, a regexp of their names;
	// all by default), to repeat one kind often.
	faults []string
}

func configFromEnv(t *testing.T) config {
	raw := os.Getenv("CHAOS_DURATION")
	if raw == "" {
		t.Skip("the chaos run runs with CHAOS_DURATION set (make chaos)")
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d <= 0 {
		t.Fatalf("CHAOS_DURATION=%q: want a positive Go duration (15m)", raw)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED=%q: want an unsigned integer", s)
		}
	}
	faults := faultKinds
	if raw := os.Getenv("CHAOS_FAULTS"); raw != "" {
		re, err := regexp.Compile(raw)
		if err != nil {
			t.Fatalf("CHAOS_FAULTS=%q: %v", raw, err)
		}
		faults = nil
		for _, k := range faultKinds {
			if re.MatchString(k) {
				faults = append(faults, k)
			}
		}
		if len(faults) == 0 {
			t.Fatalf("CHAOS_FAULTS=%q matches none of the fault kinds %q", raw, faultKinds)
		}
	}
	return config{
		duration: d, seed: seed, faults: faults,
		// Short runs keep GPUs turning over (more gangs, prepares and
		// unprepares per minute) while 24 waiting gangs keep every queue
		// asking without wedging the scheduler.
		maxWaiting: 24, minRun: time.Second, maxRun: 8 * time.Second, cancelAfter: 90 * time.Second,
		// A 16-pod commit under injected latency (up to 2 s per request)
		// plus a Lease expiry (8 s) and a new leader's start on a loaded
		// 2-core machine stay well inside a minute; 90 s leaves room.
		period: 90 * time.Second, grace: 90 * time.Second, limitGrace: 60 * time.Second,
		minGap: 3 * time.Second, maxGap: 12 * time.Second,
		checkEvery: 3 * time.Second,
	}
}

func TestChaos(t *testing.T) {
	cfg := configFromEnv(t)
	t.Logf("chaos run: CHAOS_DURATION=%s CHAOS_SEED=%d", cfg.duration, cfg.seed)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	load := newLoadSampler()
	go load.run(ctx)

	e := setUp(t, ctx, cfg)
	tr, err := newTracker(e)
	if err != nil {
		t.Fatal(err)
	}
	gen := newLoadGen(e, tr)
	if err := gen.setUpQueues(ctx); err != nil {
		t.Fatal(err)
	}
	chk := newChecker(e, gen, tr)
	inj := newInjector(e, chk, tr)

	checkCtx, stopChecks := context.WithCancel(ctx)
	checksDone := make(chan struct{})
	go func() { defer close(checksDone); chk.run(checkCtx, cfg.checkEvery) }()
	runCtx, stopRun := context.WithTimeout(ctx, cfg.duration)
	defer stopRun()
	loadDone, faultsDone := make(chan struct{}), make(chan struct{})
	runStart := time.Now()
	go func() { defer close(loadDone); gen.run(runCtx) }()
	go func() { defer close(faultsDone); inj.run(runCtx) }()
	<-loadDone
	<-faultsDone // the fault under way ends first: every node is back
	runEnd := time.Now()
	e.logf("load and faults stopped after %s; draining", runEnd.Sub(runStart).Round(time.Second))

	drainStart := time.Now()
	leftover := e.drain(ctx, gen, chk)
	drained := time.Since(drainStart)
	_ = chk.check(ctx)
	stopChecks()
	<-checksDone
	for _, l := range leftover {
		chk.violate(invDrainLeftover, l, l)
	}

	rep := buildReport(e, cfg, gen, tr, chk, inj, load, runStart, runEnd, drained)
	rep.print(t)
	if path := os.Getenv("CHAOS_REPORT"); path != "" {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Errorf("write %s: %v", path, err)
		}
	}
	for inv, n := range rep.Invariants {
		if n != 0 {
			t.Errorf("invariant %q violated %d times", inv, n)
		}
	}
	if rep.Checks < 3 {
		t.Errorf("the invariants were checked %d times", rep.Checks)
	}
	if rep.GangsBound == 0 {
		t.Errorf("no gang was bound in the run")
	}
}

// drain deletes every gang and waits (up to 3 minutes) until no pod, no
// claim and no prepared claim is left; it returns what is left.
func (e *env) drain(ctx context.Context, gen *loadGen, chk *checker) []string {
	deadline := time.Now().Add(3 * time.Minute)
	var left []string
	for {
		gen.deleteAll(ctx)
		left = nil
		pods, err1 := e.kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		claims, err2 := e.kube.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err := errors.Join(err1, err2); err != nil {
			left = append(left, err.Error())
		} else {
			for _, p := range pods.Items {
				left = append(left, "pod "+p.Name+" ("+string(p.Status.Phase)+" on "+p.Spec.NodeName+")")
			}
			for _, c := range claims.Items {
				left = append(left, "claim "+c.Name)
			}
		}
		for _, n := range e.nodes {
			ck, err := checkpoint.Read(n.checkpointPath())
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				left = append(left, n.name+" checkpoint: "+err.Error())
			}
			if ck != nil {
				for uid, c := range ck.Data.Claims {
					left = append(left, fmt.Sprintf("%s checkpoint: %s (%v)", n.name, uid, c))
				}
			}
			if n.mode == modeMIG {
				instances, err := migInstances(ctx, n)
				if err != nil {
					left = append(left, n.name+" MIG instances: "+err.Error())
				}
				for gpu, gis := range instances {
					for _, gi := range gis {
						left = append(left, fmt.Sprintf("%s GPU %d: MIG instance %s", n.name, gpu, gi))
					}
				}
			}
			st, _ := readKubeletState(n.kubeletState())
			for uid, sp := range st {
				if !sp.Done {
					left = append(left, fmt.Sprintf("%s kubelet: pod %s prepared", n.name, uid))
				}
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		select {
		case <-ctx.Done():
			return append(left, ctx.Err().Error())
		case <-time.After(2 * time.Second):
		}
	}
}

// loadSampler samples the machine's load average (1 min) every 10 s.
type loadSampler struct{ samples chan float64 }

func newLoadSampler() *loadSampler { return &loadSampler{samples: make(chan float64, 100000)} }

func (s *loadSampler) run(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		if v, err := loadavg(); err == nil {
			select {
			case s.samples <- v:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *loadSampler) stats() (mean, max float64, n int) {
	for {
		select {
		case v := <-s.samples:
			mean += v
			max = math.Max(max, v)
			n++
		default:
			if n > 0 {
				mean /= float64(n)
			}
			return mean, max, n
		}
	}
}

func loadavg() (float64, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, fmt.Errorf("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}

// report is the run's result (docs/reliability.md shows one).
type report struct {
	Command        string            `json:"command"`
	Seed           uint64            `json:"seed"`
	Duration       string            `json:"duration"`
	Drain          string            `json:"drain"`
	Operations     int64             `json:"operations"`
	APIWrites      int64             `json:"apiWrites"`
	PodsSucceeded  int64             `json:"podsSucceeded"`
	FailedOps      int64             `json:"failedOperations"`
	GangsCreated   int64             `json:"gangsCreated"`
	GangsBound     int               `json:"gangsBound"`
	GangsCompleted int64             `json:"gangsCompleted"`
	GangsCancelled int64             `json:"gangsCancelled"`
	PodsCreated    int64             `json:"podsCreated"`
	PodsBound      int               `json:"podsBound"`
	QuotaEdits     int64             `json:"quotaEdits"`
	BindsPerMinute []int             `json:"bindsPerMinute"`
	Faults         map[string]int    `json:"faultsPerKind"`
	Recovery       map[string]string `json:"recoveryP50P99"`
	Landed         map[string]string `json:"landedWhereMeant"`
	FaultLog       []*faultRecord    `json:"faultLog"`
	Proxy          map[string]int64  `json:"proxyInjected"`
	Invariants     map[string]int    `json:"invariants"`
	Checks         int               `json:"checks"`
	Violations     []string          `json:"violations,omitempty"`
	LastCheckError string            `json:"lastCheckError,omitempty"`
	Load           string            `json:"machineLoad"`
	Periods        map[string]string `json:"periods"`
}

func buildReport(e *env, cfg config, gen *loadGen, tr *tracker, chk *checker, inj *injector, load *loadSampler, start, end time.Time, drained time.Duration) *report {
	counts, checks, details, lastErr := chk.snapshot()
	r := &report{
		Command:  fmt.Sprintf("make chaos CHAOS_DURATION=%s CHAOS_SEED=%d", cfg.duration, cfg.seed),
		Seed:     cfg.seed,
		Duration: end.Sub(start).Round(time.Second).String(), Drain: drained.Round(time.Second).String(),
		APIWrites: gen.ops.Load(), FailedOps: gen.failedOps.Load(),
		GangsCreated: gen.gangsCreated.Load(), GangsCompleted: gen.gangsDone.Load(), GangsCancelled: gen.cancelled.Load(),
		PodsCreated: gen.podsCreated.Load(), QuotaEdits: gen.quotaEdits.Load(),
		Faults: map[string]int{}, Recovery: map[string]string{}, Landed: map[string]string{}, Invariants: counts, Checks: checks, Violations: details,
		Proxy: map[string]int64{"429": e.proxy.tooMany.Load(), "500": e.proxy.internal.Load(), "409": e.proxy.conflict.Load(),
			"slow": e.proxy.slow.Load(), "watches dropped": e.proxy.droppedWatches.Load(),
			"applied, answered 500": e.proxy.applied500.Load(), "applied, cut": e.proxy.appliedCut.Load()},
		Periods: map[string]string{"gang partly bound": cfg.period.String(), "checkpoint/kubelet grace": cfg.grace.String(),
			"queue limit change grace": cfg.limitGrace.String(), "check every": cfg.checkEvery.String()},
	}
	if lastErr != nil {
		r.LastCheckError = lastErr.Error()
	}
	tr.mu.Lock()
	r.GangsBound = len(tr.gangBound)
	r.PodsSucceeded = int64(tr.completions)
	r.Operations = r.APIWrites + r.PodsSucceeded
	r.PodsBound = len(tr.binds)
	for _, b := range tr.binds {
		if b.Before(start) || b.After(end) {
			continue
		}
		m := int(b.Sub(start) / time.Minute)
		for len(r.BindsPerMinute) <= m {
			r.BindsPerMinute = append(r.BindsPerMinute, 0)
		}
		r.BindsPerMinute[m]++
	}
	tr.mu.Unlock()
	r.FaultLog = inj.snapshot()
	rec := map[string][]float64{}
	landed, aimed := map[string]int{}, map[string]int{}
	for _, f := range r.FaultLog {
		r.Faults[f.Kind]++
		if f.Landed != nil {
			aimed[f.Kind]++
			if *f.Landed {
				landed[f.Kind]++
			}
		}
		if f.Recovery >= 0 {
			rec[f.Kind] = append(rec[f.Kind], f.Recovery)
		}
	}
	for kind, n := range aimed {
		r.Landed[kind] = fmt.Sprintf("%d of %d", landed[kind], n)
	}
	for kind, v := range rec {
		sort.Float64s(v)
		r.Recovery[kind] = fmt.Sprintf("%.1fs / %.1fs (n=%d)", quantile(v, 0.5), quantile(v, 0.99), len(v))
	}
	mean, max, n := load.stats()
	r.Load = fmt.Sprintf("load average (1 min) mean %.1f, max %.1f over %d samples; %d CPUs", mean, max, n, runtime.NumCPU())
	return r
}

// quantile of sorted values (nearest rank).
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func (r *report) print(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n=== chaos run report ===\n%s\nrun %s, drain %s; %s\n", r.Command, r.Duration, r.Drain, r.Load)
	fmt.Fprintf(&b, "operations: %d (API writes %d, failed %d; pods run to completion %d); gangs created %d, fully bound %d, completed %d, cancelled %d; pods created %d, bound %d; quota edits %d\n",
		r.Operations, r.APIWrites, r.FailedOps, r.PodsSucceeded, r.GangsCreated, r.GangsBound, r.GangsCompleted, r.GangsCancelled, r.PodsCreated, r.PodsBound, r.QuotaEdits)
	fmt.Fprintf(&b, "pods bound per minute: %v\n", r.BindsPerMinute)
	fmt.Fprintf(&b, "faults (count, recovery p50/p99 until the next gang is bound, kills landed where meant):\n")
	for _, k := range faultKinds {
		fmt.Fprintf(&b, "  %-75s %3d  %s  %s\n", k, r.Faults[k], r.Recovery[k], r.Landed[k])
	}
	fmt.Fprintf(&b, "proxy injected: %v\n", r.Proxy)
	fmt.Fprintf(&b, "invariants (%d checks):\n", r.Checks)
	for _, inv := range invariants {
		fmt.Fprintf(&b, "  %-75s %d\n", inv, r.Invariants[inv])
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  ! %s\n", v)
	}
	if r.LastCheckError != "" {
		fmt.Fprintf(&b, "last check error (a check skipped): %s\n", r.LastCheckError)
	}
	t.Log(b.String())
}
