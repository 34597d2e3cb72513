package health_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/tessera-gpu/tessera/nodeagent/health"
	"github.com/tessera-gpu/tessera/nodeagent/nvmlbackend"
)

func next(t *testing.T, ch <-chan health.Event) health.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	return health.Event{}
}

func TestBroadcasterOrderStateAndReplay(t *testing.T) {
	b := health.NewBroadcaster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow := b.Subscribe(ctx) // never read until the end: must not block Publish
	fast := b.Subscribe(ctx)
	for i := 0; i < 1000; i++ {
		b.Publish(health.Event{UUID: "GPU-a", Kind: health.KindXID, XID: uint64(i)})
	}
	for i := 0; i < 1000; i++ {
		if ev := next(t, fast); ev.XID != uint64(i) {
			t.Fatalf("event %d has XID %d: out of order", i, ev.XID)
		}
	}
	b.Publish(health.Event{UUID: "GPU-b", Kind: health.KindLost})
	b.Publish(health.Event{UUID: "GPU-b", Kind: health.KindECC})
	b.Publish(health.Event{UUID: "GPU-b", Kind: health.KindLost, Healthy: true})
	if c := b.Conditions("GPU-b"); len(c) != 1 || c[0].Kind != health.KindECC {
		t.Fatalf("GPU-b conditions %v, want only ecc", c)
	}
	if c := b.Conditions("GPU-a"); len(c) != 1 || c[0].XID != 999 {
		t.Fatalf("GPU-a conditions %v, want the last XID", c)
	}
	// A late subscriber first gets the current conditions.
	late := b.Subscribe(ctx)
	got := []health.Event{next(t, late), next(t, late)}
	if got[0].UUID != "GPU-a" || got[1].UUID != "GPU-b" || got[1].Kind != health.KindECC {
		t.Fatalf("replay %v", got)
	}
	b.Publish(health.Event{UUID: "GPU-a", Healthy: true})
	if ev := next(t, late); !ev.Healthy || ev.UUID != "GPU-a" {
		t.Fatalf("got %v", ev)
	}
	if u := b.Unhealthy(); len(u) != 1 || u[0].UUID != "GPU-b" {
		t.Fatalf("unhealthy %v", u)
	}
	// The slow subscriber still gets everything, in order.
	if ev := next(t, slow); ev.XID != 0 {
		t.Fatalf("slow subscriber starts with %v", ev)
	}
	cancel()
	for range slow {
	}
	for range late {
	}
}

func TestBroadcasterConcurrent(t *testing.T) {
	b := health.NewBroadcaster()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := b.Subscribe(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				b.Inject(health.Event{UUID: fmt.Sprintf("GPU-%d", w), Kind: health.KindXID, XID: 48})
				_ = b.Unhealthy()
			}
		}()
	}
	wg.Wait()
	for i := 0; i < 800; i++ {
		next(t, ch)
	}
	if n := len(b.Unhealthy()); n != 8 {
		t.Fatalf("%d unhealthy, want 8", n)
	}
}

func startMonitor(t *testing.T, opts health.MonitorOptions) (*nvmlbackend.Mock, *health.Broadcaster, <-chan health.Event) {
	t.Helper()
	mock, err := nvmlbackend.NewMock("dgxh100", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range mock.GPUs() {
		opts.GPUs = append(opts.GPUs, g.UUID)
	}
	b := health.NewBroadcaster()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	events := b.Subscribe(ctx)
	m := health.NewMonitor(mock, b, opts)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("monitor: %v", err)
		}
		// The monitor freed its event set: nothing is registered any more.
		if err := mock.InjectXID(mock.GPUs()[0].UUID, 48); err == nil {
			t.Error("event set still registered after the monitor stopped")
		}
	})
	// Wait for registration (the first injection succeeds once it is done).
	deadline := time.Now().Add(10 * time.Second)
	for mock.InjectXID(mock.GPUs()[1].UUID, 13) != nil {
		if time.Now().After(deadline) {
			t.Fatal("monitor never registered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return mock, b, events
}

func TestMonitorXIDsAndECC(t *testing.T) {
	mock, b, events := startMonitor(t, health.MonitorOptions{ExtraBenignXIDs: []uint64{94}, ProbeInterval: time.Hour, WaitTimeout: 20 * time.Millisecond})
	gpus := mock.GPUs()
	// Benign XIDs (13 above, the default 43 and the extra 94) give no
	// event; the critical 48 after them is the first one seen.
	for _, x := range []uint64{43, 94, 48} {
		if err := mock.InjectXID(gpus[0].UUID, x); err != nil {
			t.Fatal(err)
		}
	}
	ev := next(t, events)
	if ev.UUID != gpus[0].UUID || ev.Kind != health.KindXID || ev.XID != 48 || ev.Healthy {
		t.Fatalf("got %v, want XID 48 on GPU 0", ev)
	}
	if err := mock.InjectECC(gpus[1].UUID, true); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events); ev.UUID != gpus[1].UUID || ev.Kind != health.KindECC {
		t.Fatalf("got %v, want ECC on GPU 1", ev)
	}
	if err := mock.InjectXID(gpus[1].UUID, 79); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events); ev.Kind != health.KindLost {
		t.Fatalf("XID 79 gave %v, want gpu-lost", ev)
	}
	if len(b.Conditions(gpus[1].UUID)) != 2 {
		t.Fatalf("GPU 1 conditions %v", b.Conditions(gpus[1].UUID))
	}
}

func TestMonitorProbesLostAndRecovery(t *testing.T) {
	mock, b, events := startMonitor(t, health.MonitorOptions{ProbeInterval: 20 * time.Millisecond, WaitTimeout: 20 * time.Millisecond, XIDRecovery: 200 * time.Millisecond})
	gpus := mock.GPUs()
	if err := mock.SetLost(gpus[0].UUID, true); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events); ev.Kind != health.KindLost || ev.Healthy || ev.UUID != gpus[0].UUID {
		t.Fatalf("got %v, want GPU 0 lost", ev)
	}
	if err := mock.SetLost(gpus[0].UUID, false); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, events); ev.Kind != health.KindLost || !ev.Healthy {
		t.Fatalf("got %v, want GPU 0 back", ev)
	}
	// Coming back was a GPU reset, which dropped the event registration:
	// the monitor registers again, so an XID on GPU 0 is still seen.
	deadline := time.Now().Add(5 * time.Second)
	for mock.InjectXID(gpus[0].UUID, 48) != nil {
		if time.Now().After(deadline) {
			t.Fatal("events of GPU 0 never registered again after its reset")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ev := next(t, events); ev.Kind != health.KindXID || ev.UUID != gpus[0].UUID {
		t.Fatalf("got %v, want XID 48 on GPU 0", ev)
	}
	if ev := next(t, events); ev.Kind != health.KindXID || !ev.Healthy {
		t.Fatalf("got %v, want GPU 0's XID cleared", ev)
	}
	// An XID clears after the recovery period once the GPU answers.
	if err := mock.InjectXID(gpus[1].UUID, 48); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if ev := next(t, events); ev.Kind != health.KindXID || ev.Healthy {
		t.Fatalf("got %v", ev)
	}
	if ev := next(t, events); ev.Kind != health.KindXID || !ev.Healthy {
		t.Fatalf("got %v, want the XID cleared", ev)
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Fatalf("XID cleared after %s, before the recovery period", time.Since(start))
	}
	if u := b.Unhealthy(); len(u) != 0 {
		t.Fatalf("still unhealthy: %v", u)
	}
}

// TestMonitorGPULostAtStart: a GPU that does not answer when the monitor
// starts is reported lost instead of failing the monitor, and watched once
// it answers.
func TestMonitorGPULostAtStart(t *testing.T) {
	mock, err := nvmlbackend.NewMock("dgxh100", 2)
	if err != nil {
		t.Fatal(err)
	}
	gpus := mock.GPUs()
	_ = mock.SetLost(gpus[1].UUID, true)
	b := health.NewBroadcaster()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	events := b.Subscribe(ctx)
	m := health.NewMonitor(mock, b, health.MonitorOptions{GPUs: []string{gpus[0].UUID, gpus[1].UUID}, ProbeInterval: 20 * time.Millisecond, WaitTimeout: 20 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("monitor: %v", err)
		}
	}()
	if ev := next(t, events); ev.Kind != health.KindLost || ev.UUID != gpus[1].UUID || ev.Healthy {
		t.Fatalf("got %v, want GPU 1 lost", ev)
	}
	_ = mock.SetLost(gpus[1].UUID, false)
	if ev := next(t, events); ev.Kind != health.KindLost || !ev.Healthy {
		t.Fatalf("got %v, want GPU 1 back", ev)
	}
	deadline := time.Now().Add(5 * time.Second)
	for mock.InjectXID(gpus[1].UUID, 48) != nil {
		if time.Now().After(deadline) {
			t.Fatal("events of GPU 1 never registered")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
