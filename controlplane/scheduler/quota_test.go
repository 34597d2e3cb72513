package scheduler_test

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
)

func TestTwoQueuesWithinQuotaThenBorrowing(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	e.addNode("b", 8, false, nil)
	qa := e.addQueue("qa", "", "8", "16", 1)
	qb := e.addQueue("qb", "", "8", "16", 1)
	e.startScheduler(defaultOptions())
	a1 := e.gang("a1", qa, 8, gpuClaim)
	b1 := e.gang("b1", qb, 8, gpuClaim)
	e.waitBound(append(append([]*v1.Pod{}, a1...), b1...), 60*time.Second)
	e.markRunning()

	// A third gang over qa's quota: no idle GPU, it waits.
	a2 := e.gang("a2", qa, 4, gpuClaim)
	c := e.waitCondition("a2", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return c.Reason == v1alpha1.ReasonUnschedulable
	})
	t.Logf("a2 waits: %s", c.Message)
	// qb's gang finishes: qa borrows the idle GPUs beyond its quota.
	e.finish(b1)
	e.waitBound(a2, 60*time.Second)
	waitQueueGPU(t, e, qa, "12")
	waitQueueGPU(t, e, qb, "0")
	e.checkClaims()
}

// TestIdleCapacitySharedByWeight: 16 GPUs, qa (quota 4, weight 1) and qb (quota 4, weight 3)
// each submit 12 one-GPU gangs. Both get their quota, then the 8 idle GPUs go 1:3.
func TestIdleCapacitySharedByWeight(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	e.addNode("b", 8, false, nil)
	qa := e.addQueue("qa", "", "4", "", 1)
	qb := e.addQueue("qb", "", "4", "", 3)
	var all []*v1.Pod
	for i := 0; i < 12; i++ {
		all = append(all, e.gang(fmt.Sprintf("a%02d", i), qa, 1, gpuClaim)...)
		all = append(all, e.gang(fmt.Sprintf("b%02d", i), qb, 1, gpuClaim)...)
	}
	// All gangs exist before the scheduler starts, so the first cycle sees them together.
	e.startScheduler(defaultOptions())
	waitQueueGPU(t, e, qa, "6")
	waitQueueGPU(t, e, qb, "10")
	// The queues' status is written when the gangs are admitted; the bindings follow it, so
	// wait for them rather than count once (on a loaded machine they lag by a cycle).
	var n int
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		n = e.boundCount(all)
		return n >= 16, nil
	})
	if err != nil || n != 16 {
		t.Fatalf("%d pods bound, want 16", n)
	}
	waitQueueGPU(t, e, qa, "6")
	waitQueueGPU(t, e, qb, "10")
}

// TestFiftyGangsNeverExceedLimits submits 50 gangs at once into a queue hierarchy with limits
// and checks the limits after every binding the API server reports, also while gangs finish
// and others take their place.
func TestFiftyGangsNeverExceedLimits(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 4; i++ {
		e.addNode(fmt.Sprintf("n%d", i), 8, false, nil)
	}
	org := e.addQueue("org", "", "16", "24", 1)
	t1 := e.addQueue("t1", "org", "4", "10", 1)
	t2 := e.addQueue("t2", "org", "8", "", 2)
	t3 := e.addQueue("t3", "", "", "6", 1)
	limits := map[string]int{org: 24, t1: 10, t3: 6}
	parent := map[string]string{t1: org, t2: org}

	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	w, err := e.kube.CoreV1().Pods(e.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	queueOf := map[string]string{} // pod → queue
	gangSize := map[string]int{}
	bound := map[string]bool{} // pods holding a GPU (bound, not finished)
	var violations []string
	checks := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*v1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			holds := ev.Type != watch.Deleted && p.Spec.NodeName != "" && p.Status.Phase != v1.PodSucceeded
			bound[p.Name] = holds
			use := map[string]int{}
			for name, b := range bound {
				if b {
					q := queueOf[name]
					use[q]++
					if parent[q] != "" {
						use[parent[q]]++
					}
				}
			}
			checks++
			for q, lim := range limits {
				if use[q] > lim {
					violations = append(violations, fmt.Sprintf("queue %s uses %d GPUs, limit %d", q, use[q], lim))
				}
			}
			mu.Unlock()
		}
	}()

	e.reapTerminating() // gangs within quota may reclaim from borrowers: evicted pods go away
	e.startScheduler(defaultOptions())
	rng := rand.New(rand.NewSource(7))
	leaves := []string{t1, t2, t3}
	var pods []*v1.Pod
	for i := 0; i < 50; i++ {
		q := leaves[rng.Intn(len(leaves))]
		n := 1 + rng.Intn(4)
		name := fmt.Sprintf("g%02d", i)
		mu.Lock()
		for j := 0; j < n; j++ {
			queueOf[fmt.Sprintf("%s-%d", name, j)] = q
		}
		gangSize[name] = n
		mu.Unlock()
		pods = append(pods, e.gang(name, q, n, gpuClaim)...)
	}
	// Wait for the cluster to settle: the org at its limit (within one gang) and t3 too.
	settle := func() {
		if err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			use := map[string]int{}
			for name, b := range bound {
				if b {
					use[queueOf[name]]++
				}
			}
			return use[t1]+use[t2] >= 21 && use[t3] >= 3, nil
		}); err != nil {
			t.Fatalf("queues did not fill up to their limits")
		}
	}
	settle()
	time.Sleep(time.Second) // let any excess binding show up
	// Churn: every bound gang of t1 and t3 finishes; waiting gangs take their place.
	mu.Lock()
	var done []*v1.Pod
	for _, p := range pods {
		q := queueOf[p.Name]
		if bound[p.Name] && (q == t1 || q == t3) {
			done = append(done, p)
		}
	}
	boundBefore := map[string]bool{}
	for name, b := range bound {
		if b {
			boundBefore[name] = true
		}
	}
	mu.Unlock()
	e.finish(done)
	// Waiting gangs of t1 and t3 take the freed capacity.
	if err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		newly := map[string]int{}
		for name, b := range bound {
			if b && !boundBefore[name] {
				newly[queueOf[name]]++
			}
		}
		return newly[t1] > 0 && newly[t3] > 0, nil
	}); err != nil {
		t.Fatalf("no waiting gang took the freed capacity")
	}
	time.Sleep(time.Second) // let any excess binding show up
	e.checkClaims()
	cancel()
	w.Stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("limit exceeded %d times, first: %s", len(violations), violations[0])
	}
	t.Logf("invariant checked after %d pod events; %d gangs", checks, len(gangSize))
}

// TestStarvingGangGoesFirst: a gang of 8 waits for a full node while one-GPU gangs keep
// arriving. Once it has waited past the starvation timeout, the small gangs are held back, so
// the capacity that frees up goes to the large gang instead of being taken piecemeal.
func TestStarvingGangGoesFirst(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	opts := defaultOptions()
	opts.StarvationTimeout = time.Second
	e.startScheduler(opts)
	blocker := e.gang("blocker", q, 4, gpuClaim)
	e.waitBound(blocker, 60*time.Second)
	big := e.gang("big", q, 8, gpuClaim)
	e.waitCondition("big", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, nil)
	time.Sleep(1500 * time.Millisecond) // past the starvation timeout
	var small []*v1.Pod
	for i := 0; i < 4; i++ {
		small = append(small, e.gang(fmt.Sprintf("small%d", i), q, 1, gpuClaim)...)
	}
	c := e.waitCondition("small0", v1alpha1.PodGroupConditionScheduled, metav1.ConditionFalse, func(c metav1.Condition) bool {
		return strings.Contains(c.Message, "waits behind gang "+e.ns+"/big")
	})
	t.Logf("small gang: %s", c.Message)
	if n := e.boundCount(small); n != 0 {
		t.Fatalf("%d small gangs took the capacity the starving gang waits for", n)
	}
	e.finish(blocker)
	e.waitBound(big, 60*time.Second)
	if n := e.boundCount(small); n != 0 {
		t.Fatalf("%d small gangs bound on a full node", n)
	}
	e.checkClaims()
}
