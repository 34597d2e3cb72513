package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "github.com/tessera-gpu/tessera/controlplane/api/v1alpha1"
	"github.com/tessera-gpu/tessera/controlplane/fixture"
	"github.com/tessera-gpu/tessera/controlplane/scheduler"
)

// writeCounter counts the requests that change something (every verb but GET), by method and
// path, as they leave the scheduler's client.
type writeCounter struct {
	rt     http.RoundTripper
	mu     sync.Mutex
	writes map[string]int
}

func (c *writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		key := req.Method + " " + req.URL.Path
		if strings.HasSuffix(req.URL.Path, "/events") && req.GetBody != nil {
			if body, err := req.GetBody(); err == nil {
				b, _ := io.ReadAll(body)
				var ev struct{ Reason, Message string }
				if json.Unmarshal(b, &ev) == nil {
					key += " (" + ev.Reason + ": " + trim(ev.Message) + ")"
				}
			}
		}
		c.mu.Lock()
		c.writes[key]++
		c.mu.Unlock()
	}
	return c.rt.RoundTrip(req)
}

func (c *writeCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.writes
	c.writes = map[string]int{}
	return w
}

// TestWaitingGangsCauseNoWrites: 100 gangs that do not fit wait for five minutes of scheduler
// time. After the first cycles have written their statuses, pod conditions and Events, not a
// single write leaves the scheduler (counted at its HTTP transport). The clock is a fake one
// stepped one period (1s) at a time, so the five minutes — 300 cycles, with backoffs
// expiring and gangs retried — pass in seconds; every cycle runs the real decision and
// effects code against the real API server.
func TestWaitingGangsCauseNoWrites(t *testing.T) {
	e := newEnv(t)
	e.addNode("a", 8, false, nil)
	q := e.addQueue("q", "", "", "", 1)
	for i := range 100 {
		e.gang(fmt.Sprintf("g%03d", i), q, 2, func(ns, name string) *resourceapi.ResourceClaim { return fixture.GPUClaim(ns, name, 8) })
	}
	counter := &writeCounter{writes: map[string]int{}}
	st := e.startStepped(func(rt http.RoundTripper) http.RoundTripper { counter.rt = rt; return counter })
	s := st.s
	// step advances the scheduler's time by one period and waits for the cycle it triggers
	// and for every write that cycle queued.
	step := func() { t.Helper(); st.cycle(true) }
	// Until every gang says why it waits.
	if err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		step()
		list, err := e.sc.PodGroups(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, pg := range list.Items {
			if c := findCondition(pg.Status.Conditions, v1alpha1.PodGroupConditionScheduled); c == nil || c.Reason != v1alpha1.ReasonUnschedulable {
				return false, nil
			}
		}
		return len(list.Items) == 100, nil
	}); err != nil {
		t.Fatalf("gangs did not all become Unschedulable: %v", err)
	}
	for range 3 { // the last statuses and pod conditions land
		step()
	}
	// Events go out through client-go's event broadcaster, in the background: wait until
	// the first cycles' Events are all sent (half a second without a write).
	setup := counter.take()
	for {
		time.Sleep(500 * time.Millisecond)
		more := counter.take()
		if len(more) == 0 {
			break
		}
		for k, n := range more {
			setup[k] += n
		}
	}
	t.Logf("first cycles wrote %d requests", total(setup))

	for range 300 {
		step()
	}
	// The control plane is shared: other tests' leftovers (namespaces being deleted, their
	// pods going away) are real changes and may be written about. Only what concerns this
	// test's gangs counts: its namespace, its queue, anything cluster-wide but other queues.
	w := counter.take()
	for k, n := range w {
		mine := strings.Contains(k, "/namespaces/"+e.ns+"/") || strings.Contains(k, "/queues/"+q) ||
			(!strings.Contains(k, "/namespaces/") && !strings.Contains(k, "/queues/"))
		if !mine {
			t.Logf("not counted (another test's objects): %d × %s", n, k)
			delete(w, k)
		}
	}
	if len(w) > 0 {
		var lines []string
		for k, n := range w {
			lines = append(lines, fmt.Sprintf("%d × %s", n, k))
		}
		sort.Strings(lines)
		t.Fatalf("%d writes in 5 minutes of waiting:\n%s", total(w), strings.Join(lines, "\n"))
	}
	if s.Cycles() < 300 {
		t.Fatalf("only %d cycles ran", s.Cycles())
	}
}

func trim(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

func total(w map[string]int) int {
	n := 0
	for _, v := range w {
		n += v
	}
	return n
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

var _ = scheduler.Options{}
