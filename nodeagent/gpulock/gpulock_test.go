package gpulock_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/nodeagent/gpulock"
)

// TestLocksSerializePerGPU: holders of one GPU's lock never overlap, while
// another GPU's lock is free meanwhile.
func TestLocksSerializePerGPU(t *testing.T) {
	l := gpulock.New()
	var inside atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			unlock := l.Lock("GPU-a")
			defer unlock()
			if n := inside.Add(1); n != 1 {
				t.Errorf("%d holders of GPU-a at once", n)
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
		})
	}
	unlock := l.Lock("GPU-a")
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Lock("GPU-b")()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("GPU-b blocked by GPU-a's lock")
	}
	unlock()
	wg.Wait()
	var none *gpulock.Locks
	none.Lock("GPU-a")() // a nil set locks nothing
}
