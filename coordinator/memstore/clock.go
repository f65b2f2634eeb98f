package memstore

import (
	"sync"
	"time"
)

// FakeClock is a clock that moves only when told to. Pass its Now method to
// WithClock to make a Store's records expire on the test's command. It is
// safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a FakeClock that reads start until it is advanced.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d. Records whose time to live ends at or
// before the new time are absent from then on.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
