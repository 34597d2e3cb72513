package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	schedclient "github.com/tessera-gpu/tessera/controlplane/client"
	"github.com/tessera-gpu/tessera/deployments/examples/demo"
	"github.com/tessera-gpu/tessera/nodeagent/devicename"
	"github.com/tessera-gpu/tessera/sandbox/simkubelet"
)

// DemoResult is the outcome of the demo scenario, for the narration's summary
// and for the test that runs the scenario.
type DemoResult struct {
	// FirstGangScheduled is the time from the start of the sandbox to the
	// first gang bound.
	FirstGangScheduled time.Duration
	// Bound lists each gang's workload (namespace/kind/name) and when, from
	// the start of the scenario, all its pods were bound.
	Bound map[string]time.Duration
	// QuotaWait is the scheduler's message while team B's training gang
	// waited for quota ("" if it never did).
	QuotaWait string
	// Prepared and Unprepared count the simulated kubelets' plugin calls.
	Prepared, Unprepared int
	// DoublePrepared lists devices that were prepared for two claims at once.
	DoublePrepared []string
	// Outstanding lists claims still prepared after the scenario's cleanup.
	Outstanding []string
	// MPSCommands are the MPS and nvidia-smi commands the plugins ran.
	MPSCommands []string
}

// Expected gangs of the demo: workload → pods.
var demoGangs = map[string]int{
	"team-a/Job/train-a": 16,
	"team-b/Job/train-b": 10,
}

// OK reports whether the scenario ended as designed.
func (r DemoResult) OK() bool { return len(r.problems()) == 0 }

// Problems describes what went wrong.
func (r DemoResult) Problems() string { return strings.Join(r.problems(), "; ") }

func (r DemoResult) problems() []string {
	var p []string
	for w := range demoGangs {
		if _, ok := r.Bound[w]; !ok {
			p = append(p, w+" never bound")
		}
	}
	if r.QuotaWait == "" {
		p = append(p, "team-b/train-b never waited for quota")
	}
	if len(r.DoublePrepared) > 0 {
		p = append(p, "devices prepared twice: "+strings.Join(r.DoublePrepared, ", "))
	}
	if len(r.Outstanding) > 0 {
		p = append(p, "claims left prepared: "+strings.Join(r.Outstanding, ", "))
	}
	if r.Prepared == 0 || r.Prepared != r.Unprepared {
		p = append(p, fmt.Sprintf("%d prepares but %d unprepares", r.Prepared, r.Unprepared))
	}
	return p
}

// RunDemo runs the demo scenario: team A's 16-GPU training gang, team B's
// inference on MIG and notebooks on 10Gi fractions, and team B's 12-GPU gang
// that waits for quota until team A finishes. It narrates on the sandbox's
// output, removes the workloads at the end, and checks that every claim was
// unprepared and no device was prepared twice.
func (s *Sandbox) RunDemo(ctx context.Context) (DemoResult, error) {
	return s.RunDemoWith(ctx, DemoOptions{})
}

// DemoOptions are hooks into the demo scenario.
type DemoOptions struct {
	// BeforeCleanup, when set, runs once both training jobs completed, with
	// serve-b and the notebooks still running, before the workloads are
	// deleted (e.g. to record a baseline of the cluster after the scenario).
	// An error ends the scenario.
	BeforeCleanup func(context.Context) error
}

// RunDemoWith is RunDemo with hooks.
func (s *Sandbox) RunDemoWith(ctx context.Context, o DemoOptions) (DemoResult, error) {
	res := DemoResult{Bound: map[string]time.Duration{}}
	ap, err := newApplier(s.config)
	if err != nil {
		return res, err
	}
	sched, err := schedclient.NewForConfig(s.config)
	if err != nil {
		return res, err
	}
	begin := time.Now()
	say := func(format string, args ...any) {
		s.say("[%5.1fs] "+format, append([]any{time.Since(begin).Seconds()}, args...)...)
	}
	s.say("demo scenario (run times divided by %g)", s.opts.Speed)

	w := &gangWatcher{sched: sched, say: say, res: &res, begin: begin, seen: map[string]string{}}
	steps := []struct {
		file, what string
		await      func() bool // must hold before the next step
	}{
		{file: "10-team-b-inference.yaml", what: "team B deploys serve-b: 3 inference replicas on 1g MIG devices"},
		{file: "20-team-b-notebooks.yaml", what: "team B starts two notebooks with 10Gi of a shared GPU each (MPS limits)",
			await: func() bool { return s.podsRunning(ctx, "team-b", 5) }},
		{file: "30-team-a-training.yaml", what: "team A submits train-a: an indexed Job of 16 pods, one whole GPU each (one gang of 16)",
			await: func() bool { _, ok := res.Bound["team-a/Job/train-a"]; return ok }},
		{file: "40-team-b-training.yaml", what: "team B submits train-b: 10 pods of one GPU; with train-a running, research would exceed its limit of 24",
			await: func() bool { _, bound := res.Bound["team-b/Job/train-b"]; return bound || res.QuotaWait != "" }},
	}
	for _, step := range steps {
		say("%s", step.what)
		if err := s.applyDemoFile(ctx, ap, step.file); err != nil {
			return res, err
		}
		if step.await == nil {
			if err := w.poll(ctx); err != nil {
				return res, err
			}
			continue
		}
		if err := w.until(ctx, 3*time.Minute, step.await); err != nil {
			return res, fmt.Errorf("after %s: %w", step.file, err)
		}
		if res.FirstGangScheduled == 0 {
			res.FirstGangScheduled = time.Since(s.start)
			say("first gang bound %.1fs after the sandbox started", res.FirstGangScheduled.Seconds())
		}
	}
	if _, bound := res.Bound["team-b/Job/train-b"]; !bound {
		// The interesting moment: train-a runs, team B's services run, and
		// train-b waits for quota.
		say("what `tessera top --once` shows now:")
		s.printTop(ctx)
	}
	timeout := 4*time.Minute + time.Duration(float64(90*time.Second)/s.opts.Speed)
	err = w.until(ctx, timeout, func() bool {
		return s.jobDone(ctx, "team-a", "train-a") && s.jobDone(ctx, "team-b", "train-b") && s.podsRunning(ctx, "team-b", 5)
	})
	if err != nil {
		return res, fmt.Errorf("waiting for both training jobs to finish: %w", err)
	}
	say("train-a and train-b completed; serve-b and the notebooks are running")
	if o.BeforeCleanup != nil {
		if err := o.BeforeCleanup(ctx); err != nil {
			return res, fmt.Errorf("before cleanup: %w", err)
		}
	}

	say("cleaning up: deleting the workloads; the simulated kubelets unprepare every claim")
	if err := s.deleteDemoWorkloads(ctx); err != nil {
		return res, err
	}
	s.collectLedger(&res)
	if err := w.until(ctx, time.Minute, func() bool {
		s.collectLedger(&res)
		return len(res.Outstanding) == 0
	}); err != nil {
		return res, fmt.Errorf("claims still prepared after cleanup (%s): %w", strings.Join(res.Outstanding, ", "), err)
	}
	s.say("")
	s.say("demo summary:")
	s.say("  first gang bound %.1fs after start; train-a bound at %.1fs, train-b at %.1fs",
		res.FirstGangScheduled.Seconds(), res.Bound["team-a/Job/train-a"].Seconds(), res.Bound["team-b/Job/train-b"].Seconds())
	s.say("  train-b waited for quota: %q", res.QuotaWait)
	s.say("  %d claims prepared, %d unprepared, %d devices prepared twice", res.Prepared, res.Unprepared, len(res.DoublePrepared))
	if !res.OK() {
		s.say("  PROBLEMS: %s", res.Problems())
	}
	return res, nil
}

func (s *Sandbox) applyDemoFile(ctx context.Context, ap *applier, name string) error {
	data, err := fs.ReadFile(demo.FS, name)
	if err != nil {
		return err
	}
	objs, err := decode(name, data)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		s.scaleDurations(obj)
		if err := ap.apply(ctx, obj); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// scaleDurations divides the simulated run time of pod templates by Speed.
func (s *Sandbox) scaleDurations(obj *unstructured.Unstructured) {
	if s.opts.Speed == 1 {
		return
	}
	path := []string{"spec", "template", "metadata", "annotations"}
	ann, found, _ := unstructured.NestedStringMap(obj.Object, path...)
	if !found {
		return
	}
	if d, err := time.ParseDuration(ann[simkubelet.AnnotationDuration]); err == nil {
		ann[simkubelet.AnnotationDuration] = time.Duration(float64(d) / s.opts.Speed).String()
		_ = unstructured.SetNestedStringMap(obj.Object, ann, path...)
	}
}

func (s *Sandbox) jobDone(ctx context.Context, ns, name string) bool {
	job, err := s.client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func (s *Sandbox) podsRunning(ctx context.Context, ns string, want int) bool {
	pods, err := s.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	n := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning {
			n++
		}
	}
	return n >= want
}

func (s *Sandbox) deleteDemoWorkloads(ctx context.Context) error {
	bg := metav1.DeletePropagationBackground
	del := metav1.DeleteOptions{PropagationPolicy: &bg}
	for _, ns := range []string{"team-a", "team-b"} {
		if err := s.client.BatchV1().Jobs(ns).DeleteCollection(ctx, del, metav1.ListOptions{}); err != nil {
			return fmt.Errorf("delete jobs in %s: %w", ns, err)
		}
		if err := s.client.AppsV1().Deployments(ns).DeleteCollection(ctx, del, metav1.ListOptions{}); err != nil {
			return fmt.Errorf("delete deployments in %s: %w", ns, err)
		}
		if err := s.client.CoreV1().Pods(ns).DeleteCollection(ctx, del, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pods in %s: %w", ns, err)
		}
	}
	return nil
}

// collectLedger replays every node's prepare/unprepare calls in order: an
// exclusive device (a whole GPU, or a MIG device, which also excludes its
// whole GPU) must never be held by two claims at once.
func (s *Sandbox) collectLedger(res *DemoResult) {
	res.Prepared, res.Unprepared, res.DoublePrepared, res.Outstanding = 0, 0, nil, nil
	res.MPSCommands = nil
	for _, n := range s.nodes {
		holders := map[string]string{} // prepared exclusive device (pool/name) → claim
		held := map[string][]string{}  // claim → its exclusive devices
		for _, c := range n.kubelet.Ledger().Calls() {
			claim := c.Claim.String()
			if c.Unprepare {
				res.Unprepared++
				for _, k := range held[claim] {
					delete(holders, k)
				}
				delete(held, claim)
				continue
			}
			res.Prepared++
			for _, dev := range c.Devices {
				for held, other := range holders {
					if other != claim && conflicts(held, dev) {
						res.DoublePrepared = append(res.DoublePrepared, fmt.Sprintf("%s: %s of %s and %s of %s", n.name, held, other, dev, claim))
					}
				}
				if exclusive(dev) {
					holders[dev] = claim
					held[claim] = append(held[claim], dev)
				}
			}
		}
		for _, c := range n.kubelet.Ledger().Outstanding() {
			res.Outstanding = append(res.Outstanding, n.name+":"+c.Claim.String())
		}
		res.MPSCommands = append(res.MPSCommands, n.exec.Commands()...)
	}
	sort.Strings(res.Outstanding)
}

// exclusive reports whether a prepared device excludes other claims: whole
// GPUs and MIG devices do, shared GPUs (consumable capacity) do not.
func exclusive(poolDevice string) bool {
	name, err := parseDevice(poolDevice)
	return err != nil || name.Kind != devicename.KindShared
}

// conflicts reports whether two exclusive devices of one node overlap: the
// same device, or a whole GPU and a MIG device carved from it.
func conflicts(a, b string) bool {
	if a == b {
		return true
	}
	na, errA := parseDevice(a)
	nb, errB := parseDevice(b)
	if errA != nil || errB != nil || na.Minor != nb.Minor {
		return false
	}
	return (na.Kind == devicename.KindGPU && nb.Kind == devicename.KindMIG) ||
		(na.Kind == devicename.KindMIG && nb.Kind == devicename.KindGPU)
}

func parseDevice(poolDevice string) (devicename.Name, error) {
	_, dev, _ := strings.Cut(poolDevice, "/")
	return devicename.Parse(dev)
}

func (s *Sandbox) printTop(ctx context.Context) {
	s.say("")
	if err := renderTop(ctx, s.config, s.out); err != nil {
		s.say("(tessera top failed: %v)", err)
	}
	s.say("")
}

// gangWatcher narrates PodGroup changes and records when gangs bind and why
// they wait.
type gangWatcher struct {
	sched *schedclient.Client
	say   func(string, ...any)
	res   *DemoResult
	begin time.Time
	seen  map[string]string // PodGroup → last narrated state
}

func (w *gangWatcher) until(ctx context.Context, timeout time.Duration, done func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := w.poll(ctx); err != nil {
			return err
		}
		if done() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (w *gangWatcher) poll(ctx context.Context) error {
	list, err := w.sched.PodGroups(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list PodGroups: %w", err)
	}
	for _, pg := range list.Items {
		workload := pg.Namespace + "/" + pg.Name
		if pg.Spec.Workload != nil {
			workload = pg.Namespace + "/" + pg.Spec.Workload.Kind + "/" + pg.Spec.Workload.Name
		}
		state := string(pg.Status.Phase)
		msg := ""
		if c := meta.FindStatusCondition(pg.Status.Conditions, v1alpha1.PodGroupConditionScheduled); c != nil && c.Status != metav1.ConditionTrue &&
			c.Reason != v1alpha1.ReasonWaitingForMembers && c.Reason != v1alpha1.ReasonWaitingForClaims {
			// Waiting for the Job controller to create pods and the
			// resourceclaim controller their claims passes in a moment:
			// not worth narrating.
			msg = c.Message
			if c.Reason == v1alpha1.ReasonQuotaExceeded && workload == "team-b/Job/train-b" && w.res.QuotaWait == "" {
				w.res.QuotaWait = c.Message
			}
		}
		key := pg.Namespace + "/" + pg.Name
		bound := pg.Status.Scheduled >= pg.Spec.MinMember && pg.Spec.MinMember > 0
		summary := fmt.Sprintf("%s|%s|%t", state, msg, bound)
		if w.seen[key] == summary {
			continue
		}
		w.seen[key] = summary
		if _, gang := demoGangs[workload]; !gang {
			continue // one-pod gangs of the inference and notebook pods: no narration
		}
		switch {
		case bound:
			if _, ok := w.res.Bound[workload]; !ok {
				w.res.Bound[workload] = time.Since(w.begin)
				w.say("gang %s (queue %s): all %d pods bound at once", workload, pg.Spec.Queue, pg.Spec.MinMember)
			}
		case msg != "":
			w.say("gang %s (queue %s) waits: %s", workload, pg.Spec.Queue, msg)
		}
	}
	return nil
}
