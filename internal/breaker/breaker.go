// Package breaker is a circuit breaker for calls to one server: after a
// number of consecutive failures it opens, and calls fail at once for a
// cool-down; then one call at a time is let through as a probe, and the
// first probe that succeeds closes it again.
//
// A Breaker keeps no goroutine and reads no clock but time.Now, so tests
// drive it with testing/synctest's fake clock.
package breaker

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrOpen is the error of a call the breaker refused: the server failed too
// often in a row, and the cool-down has not passed (or another call is
// probing the server).
var ErrOpen = errors.New("breaker: circuit open")

// State is a breaker's state.
type State int

// The states of a breaker.
const (
	// Closed lets every call through, counting consecutive failures.
	Closed State = iota
	// Open refuses every call until the cool-down has passed.
	Open
	// HalfOpen lets one call through at a time, a probe, and refuses the
	// others.
	HalfOpen
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Outcome is what became of a call the breaker let through.
type Outcome int

// The outcomes of a call.
const (
	// Success: the server answered (an error reply is an answer).
	Success Outcome = iota
	// Failure: the server could not be reached or did not answer in time.
	Failure
	// Ignored: the call says nothing about the server (the caller gave up
	// first, the client was closed).
	Ignored
)

// Change is a change of a breaker's state, as OnChange receives it.
type Change struct {
	From, To State
	// Failures is the number of consecutive failures when the breaker
	// opened; 0 for other changes.
	Failures int
	// Err is the failure that opened the breaker (or failed the probe);
	// nil when it closes or starts probing.
	Err error
	// OpenFor is how long the breaker has been open (or half-open) since it
	// opened, when it closes or a probe fails; 0 when it opens.
	OpenFor time.Duration
}

// Config configures a Breaker.
type Config struct {
	// Failures is how many consecutive failures open the breaker; at least 1.
	Failures int
	// Cooldown is how long an open breaker refuses every call before it lets
	// a probe through, and how long after a failed probe the next one goes;
	// more than 0.
	Cooldown time.Duration
	// OnChange, if not nil, is called on every change of state, outside the
	// breaker's lock, in the order of the changes (for one breaker, calls
	// are not concurrent).
	OnChange func(Change)
}

// Breaker is a circuit breaker. Its methods are safe for concurrent use.
type Breaker struct {
	cfg Config

	mu       sync.Mutex
	state    State
	failures int       // consecutive failures while closed
	until    time.Time // while open: when the next probe may go
	openedAt time.Time // when it last opened from closed
	probing  bool      // while half-open: a probe is out
	lastErr  error     // the failure that opened it, or failed the last probe

	notify sync.Mutex // orders OnChange calls
}

// New returns a closed breaker. It returns an error when cfg.Failures is
// less than 1 or cfg.Cooldown is not positive.
func New(cfg Config) (*Breaker, error) {
	if cfg.Failures < 1 {
		return nil, fmt.Errorf("breaker: failures must be at least 1, got %d", cfg.Failures)
	}
	if cfg.Cooldown <= 0 {
		return nil, fmt.Errorf("breaker: cool-down must be positive, got %v", cfg.Cooldown)
	}
	return &Breaker{cfg: cfg}, nil
}

// Ticket is the permission of one call; hand it back to Done.
type Ticket struct{ probe bool }

// Probe reports whether the call is the breaker's probe.
func (t Ticket) Probe() bool { return t.probe }

// State returns the breaker's state now. An open breaker whose cool-down
// has passed is still Open until a call asks to go through.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Allow asks whether a call may go. It returns the call's ticket, for Done,
// or an error wrapping ErrOpen that says since when the server fails and
// the last failure.
func (b *Breaker) Allow() (Ticket, error) {
	b.mu.Lock()
	var change *Change
	switch b.state {
	case Closed:
		b.mu.Unlock()
		return Ticket{}, nil
	case Open:
		now := time.Now()
		if now.Before(b.until) {
			err := b.refusal(now)
			b.mu.Unlock()
			return Ticket{}, err
		}
		b.state, b.probing = HalfOpen, true
		change = &Change{From: Open, To: HalfOpen}
	case HalfOpen:
		if b.probing {
			err := b.refusal(time.Now())
			b.mu.Unlock()
			return Ticket{}, err
		}
		b.probing = true
	}
	b.unlockAndReport(change)
	return Ticket{probe: true}, nil
}

// refusal returns the error of a refused call; b.mu is held.
func (b *Breaker) refusal(now time.Time) error {
	if b.state == HalfOpen {
		return fmt.Errorf("%w for %v, probing: %w", ErrOpen, now.Sub(b.openedAt).Round(time.Millisecond), b.lastErr)
	}
	return fmt.Errorf("%w for %v, next probe in %v: %w", ErrOpen,
		now.Sub(b.openedAt).Round(time.Millisecond), b.until.Sub(now).Round(time.Millisecond), b.lastErr)
}

// Done reports the outcome of a call that Allow let through, with its error
// (nil on Success).
func (b *Breaker) Done(t Ticket, o Outcome, err error) {
	if o == Failure && err == nil {
		err = errors.New("breaker: failure")
	}
	b.mu.Lock()
	var change *Change
	now := time.Now()
	switch {
	case t.probe && b.state == HalfOpen:
		b.probing = false
		switch o {
		case Success:
			b.state, b.failures, b.lastErr = Closed, 0, nil
			change = &Change{From: HalfOpen, To: Closed, OpenFor: now.Sub(b.openedAt)}
		case Failure:
			b.state, b.until, b.lastErr = Open, now.Add(b.cfg.Cooldown), err
			change = &Change{From: HalfOpen, To: Open, Err: err, OpenFor: now.Sub(b.openedAt)}
		}
	case !t.probe && b.state == Closed:
		switch o {
		case Success:
			b.failures = 0
		case Failure:
			b.failures++
			if b.failures >= b.cfg.Failures {
				change = &Change{From: Closed, To: Open, Failures: b.failures, Err: err}
				b.state, b.until, b.openedAt, b.lastErr, b.failures = Open, now.Add(b.cfg.Cooldown), now, err, 0
			}
		}
	}
	// Anything else is a call that started in another state (a call let
	// through while closed that ends after the breaker opened): the probe
	// alone decides.
	b.unlockAndReport(change)
}

// unlockAndReport releases b.mu and calls OnChange with c, if any, in the
// order of the changes: b.notify is taken before b.mu is released.
func (b *Breaker) unlockAndReport(c *Change) {
	if c == nil || b.cfg.OnChange == nil {
		b.mu.Unlock()
		return
	}
	b.notify.Lock()
	b.mu.Unlock()
	defer b.notify.Unlock()
	b.cfg.OnChange(*c)
}
