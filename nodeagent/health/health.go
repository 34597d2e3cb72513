// Package health turns NVML XID and ECC events and device probes into GPU
// health events, and broadcasts them to every component that cares: the node
// agent taints the GPU's devices in its ResourceSlices, the DRA plugin feeds
// the kubelet's WatchHealthStatus, the device plugin flips devices Unhealthy.
package health

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Kind says what is wrong with a GPU.
type Kind string

const (
	// KindXID is a critical XID error reported by the driver.
	KindXID Kind = "xid"
	// KindECC is an uncorrectable (double-bit) ECC memory error.
	KindECC Kind = "ecc"
	// KindLost is a GPU that fell off the bus or no longer answers NVML.
	KindLost Kind = "gpu-lost"
)

// Event is a change of one condition of one GPU.
type Event struct {
	// UUID of the physical GPU ("GPU-...").
	UUID string
	Kind Kind
	// XID is the XID error code for KindXID.
	XID uint64
	// Healthy false raises the condition, true clears it. A healthy event
	// with an empty Kind clears every condition of the GPU.
	Healthy bool
	Time    time.Time
	Message string
}

func (e Event) String() string {
	state := "unhealthy"
	if e.Healthy {
		state = "healthy"
	}
	kind := string(e.Kind)
	if kind == "" {
		kind = "all"
	}
	if e.Kind == KindXID && !e.Healthy {
		kind = fmt.Sprintf("xid %d", e.XID)
	}
	return fmt.Sprintf("GPU %s %s (%s)", e.UUID, state, kind)
}

// Broadcaster keeps the current health of every GPU and hands every event to
// every subscriber, in order, without dropping any.
// The zero value is not usable; use NewBroadcaster.
type Broadcaster struct {
	mu    sync.Mutex
	state map[string]map[Kind]Event
	subs  map[*subscriber]struct{}
}

// NewBroadcaster returns a broadcaster where every GPU is healthy.
func NewBroadcaster() *Broadcaster {
	return &Broadcaster{state: map[string]map[Kind]Event{}, subs: map[*subscriber]struct{}{}}
}

type subscriber struct {
	mu     sync.Mutex
	queue  []Event
	notify chan struct{}
}

// Subscribe returns a channel that first receives one unhealthy event for each
// condition that holds now, then every published event. The channel is closed
// after ctx is done.
func (b *Broadcaster) Subscribe(ctx context.Context) <-chan Event {
	out := make(chan Event)
	s := &subscriber{notify: make(chan struct{}, 1)}
	b.mu.Lock()
	s.queue = append(s.queue, b.currentLocked()...)
	b.subs[s] = struct{}{}
	b.mu.Unlock()
	if len(s.queue) > 0 {
		s.notify <- struct{}{}
	}

	go func() {
		defer close(out)
		defer func() {
			b.mu.Lock()
			delete(b.subs, s)
			b.mu.Unlock()
		}()
		for {
			s.mu.Lock()
			if len(s.queue) == 0 {
				s.mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-s.notify:
					continue
				}
			}
			ev := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case out <- ev:
			}
		}
	}()
	return out
}

// Publish records the event and delivers it to every subscriber. It never
// blocks on a slow subscriber.
func (b *Broadcaster) Publish(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	conds := b.state[ev.UUID]
	switch {
	case !ev.Healthy:
		if conds == nil {
			conds = map[Kind]Event{}
			b.state[ev.UUID] = conds
		}
		conds[ev.Kind] = ev
	case ev.Kind == "":
		delete(b.state, ev.UUID)
	default:
		delete(conds, ev.Kind)
		if len(conds) == 0 {
			delete(b.state, ev.UUID)
		}
	}
	for s := range b.subs {
		s.mu.Lock()
		s.queue = append(s.queue, ev)
		s.mu.Unlock()
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

// Inject publishes an event that did not come from NVML. It is the test seam
// for the health path (the go-nvml mock has no event source) and lets an
// operator-facing component mark a GPU by hand.
func (b *Broadcaster) Inject(ev Event) { b.Publish(ev) }

// Conditions returns the unhealthy conditions of one GPU, ordered by kind.
func (b *Broadcaster) Conditions(uuid string) []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Event
	for _, ev := range b.state[uuid] {
		out = append(out, ev)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

// Unhealthy returns every unhealthy condition, ordered by GPU and kind.
func (b *Broadcaster) Unhealthy() []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.currentLocked()
}

func (b *Broadcaster) currentLocked() []Event {
	var out []Event
	for _, conds := range b.state {
		for _, ev := range conds {
			out = append(out, ev)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UUID != out[j].UUID {
			return out[i].UUID < out[j].UUID
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}
