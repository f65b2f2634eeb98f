package coordinator

import (
	"context"
	"sync/atomic"
	"time"
)

// The storage timeout's deadline, without a timer or an allocation per store
// call. context.WithDeadline costs five allocations and a timer on every
// call; here the calls that start within one tick share one deadline, the
// end of their storage timeout rounded up to the tick, and one channel,
// closed by one timer when it passes. A call is still bounded by the storage
// timeout: by it and at most one tick more.
//
// This holds for the calls whose context cannot be cancelled (its Done is
// nil: context.Background, context.WithoutCancel, values on top of them) and
// for the calls the coordinator detaches on purpose (a save, a release).
// Under a context that can be cancelled, a store call must end when that
// context ends, too: begin uses context.WithDeadline for it.

// deadlines hands out shared deadlines; a Coordinator has one.
type deadlines struct {
	timeout time.Duration
	tick    time.Duration
	cur     atomic.Pointer[deadline] // the latest deadline handed out
}

// newDeadlines returns the deadlines of storage timeout d. The tick is a
// thousandth of d, and at least a millisecond: a deadline is at most that
// much later than d asks, and under any load at most about a thousand of
// them (a timer and a channel each) wait at once.
func newDeadlines(d time.Duration) *deadlines {
	return &deadlines{timeout: d, tick: max(d/1000, time.Millisecond)}
}

// at returns the deadline of a store call that starts at now: now plus the
// storage timeout, rounded up to the tick. Calls in the same tick share it.
//
// Whether a call may share the latest deadline is decided on the monotonic
// clock alone (now comes from time.Now): the deadline must not be before the
// call's own end, nor a tick or more after it. A step of the wall clock (an
// NTP correction) changes only where the ticks fall, never how long a call
// may take.
func (ds *deadlines) at(now time.Time) *deadline {
	due := now.Add(ds.timeout)
	cur := ds.cur.Load()
	if cur.covers(due, ds.tick) {
		return cur
	}
	end := due
	if r := due.UnixNano() % int64(ds.tick); r != 0 {
		end = due.Add(ds.tick - time.Duration(r))
	}
	d := &deadline{at: end, done: make(chan struct{})}
	if !ds.cur.CompareAndSwap(cur, d) {
		if won := ds.cur.Load(); won.covers(due, ds.tick) {
			return won
		}
	}
	time.AfterFunc(end.Sub(now), d.expire)
	return d
}

// deadline is one shared deadline. It is a context.Context too: the store
// call's context when the caller's is context.Background itself, which has
// no values to keep.
type deadline struct {
	at   time.Time     // with a monotonic reading
	done chan struct{} // closed by a timer at at
}

func (d *deadline) expire() { close(d.done) }

// covers reports whether d may be the deadline of a call due to end at due:
// d is not before due and less than a tick after it.
func (d *deadline) covers(due time.Time, tick time.Duration) bool {
	if d == nil {
		return false
	}
	late := d.at.Sub(due)
	return late >= 0 && late < tick
}

func (d *deadline) Deadline() (time.Time, bool) { return d.at, true }
func (d *deadline) Done() <-chan struct{}       { return d.done }
func (d *deadline) Value(any) any               { return nil }
func (d *deadline) String() string              { return "coordinator.storageDeadline" }

func (d *deadline) Err() error {
	select {
	case <-d.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// storageCtx is a store call's context under a shared deadline: the values
// of the caller's context, and the deadline's end.
type storageCtx struct {
	context.Context // the caller's: its values
	d               *deadline
}

func (c *storageCtx) Deadline() (time.Time, bool) { return c.d.Deadline() }
func (c *storageCtx) Done() <-chan struct{}       { return c.d.done }
func (c *storageCtx) Err() error                  { return c.d.Err() }
func (c *storageCtx) String() string              { return "coordinator.storageContext" }

// shared returns ctx under the shared deadline of a call that starts at
// now. It does not end when ctx does: the caller has checked that ctx
// cannot end, or detaches the call on purpose.
func (ds *deadlines) shared(ctx context.Context, now time.Time) context.Context {
	d := ds.at(now)
	if ctx == context.Background() || ctx == context.TODO() {
		return d
	}
	return &storageCtx{Context: ctx, d: d}
}
