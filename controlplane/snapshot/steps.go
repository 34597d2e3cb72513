package snapshot

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// errStepBudget ends an allocator call whose step budget ran out.
var errStepBudget = errors.New("allocator step budget exhausted")

// stepContext bounds the structured allocator by work. The allocator checks its context's
// Err once per search step (allocateOne, one device tried for one request), so counting
// those calls counts its steps; once the budget is spent Err reports errStepBudget and Done
// is closed (CEL evaluation watches Done). The parent's cancellation still applies.
type stepContext struct {
	context.Context
	limit int64 // 0: unbounded
	steps atomic.Int64
	once  sync.Once
	done  chan struct{}
}

func newStepContext(parent context.Context, limit int64) *stepContext {
	return &stepContext{Context: parent, limit: limit, done: make(chan struct{})}
}

func (c *stepContext) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if n := c.steps.Add(1); c.limit > 0 && n > c.limit {
		c.once.Do(func() { close(c.done) })
		return errStepBudget
	}
	return nil
}

func (c *stepContext) Done() <-chan struct{} {
	if c.limit == 0 {
		return c.Context.Done()
	}
	// Merge: the budget's channel, or the parent's. A goroutine per call would be costly;
	// the allocator only selects on Done inside CEL evaluation, where the parent's
	// cancellation is also reported through Err at the next step.
	return c.done
}

func (c *stepContext) exhausted() bool {
	return c.limit > 0 && c.steps.Load() > c.limit
}
