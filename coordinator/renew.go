package coordinator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
)

// renewer keeps a running action's lease alive, and is its watchdog. It
// costs one timer until the action has run for one renew interval: most
// actions end sooner, and never start its goroutine.
type renewer struct {
	x            *exec
	ctx          context.Context // the call's
	cancelAction context.CancelCauseFunc
	limit        time.Duration
	timer        *time.Timer // starts run after one renew interval

	mu      sync.Mutex
	stopped bool               // stop was called
	cancel  context.CancelFunc // ends run; set by run
	done    chan struct{}      // closed when run returns; set by run

	// Written by run before done is closed, or by startRenewer:
	lost     bool      // a renewal found the key owned by another caller or gone
	expired  bool      // the watchdog fired: the lease may have expired
	deadline time.Time // the watchdog's deadline when the renewer stopped
}

// watchdogLimit is how long after a renewal (or the reservation) was sent the
// watchdog waits for the next one to be confirmed: the lease less its margin.
func (c *Coordinator) watchdogLimit() time.Duration {
	return c.cfg.lease - watchdogMargin(c.cfg.lease)
}

// startRenewer renews the lease every renew interval until stop, starting
// from a reservation sent at sent. A renewal that finds the lease lost
// cancels the action's context with cause ErrLeaseLost; a renewal that fails
// is reported and retried at the next tick. The watchdog: when no renewal has
// been confirmed for the lease less its margin, measured on the monotonic
// clock from when the last confirmed renewal (or the reservation) was sent,
// the lease may have expired, and the action's context is cancelled with
// cause ErrLeaseLost before another caller can take the key. (New checks
// that the first renewal, one renew interval after the reservation, comes
// before the watchdog's first deadline.)
func (x *exec) startRenewer(ctx context.Context, cancelAction context.CancelCauseFunc, sent time.Time) *renewer {
	r := &renewer{x: x, ctx: ctx, cancelAction: cancelAction, limit: x.c.watchdogLimit()}
	r.deadline = sent.Add(r.limit)
	r.timer = time.AfterFunc(x.c.cfg.renewInterval, r.run)
	return r
}

// run is the renewer once the action has run for one renew interval: it
// renews at once, then at every tick.
func (r *renewer) run() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	rctx, cancel := context.WithCancel(offRequestPath(context.WithoutCancel(r.ctx)))
	r.cancel, r.done = cancel, make(chan struct{})
	r.mu.Unlock()
	defer close(r.done)

	x := r.x
	t := time.NewTicker(x.c.cfg.renewInterval)
	defer t.Stop()
	wd := time.NewTimer(time.Until(r.deadline))
	defer wd.Stop()
	for {
		at := time.Now()
		// A renewal ends by the watchdog's deadline, so that a hung store
		// cannot hold the watchdog back; off the request path, it may take
		// until then rather than one storage timeout, so that a starved
		// store that answers slowly still keeps the lease.
		cctx, ccancel := context.WithDeadline(rctx, r.deadline)
		ok, err := x.storeRenewWithin(cctx)
		ccancel()
		switch {
		case rctx.Err() != nil:
			return // stopped while renewing
		case err == nil && ok:
			r.deadline = at.Add(r.limit)
			wd.Reset(time.Until(r.deadline))
		case err == nil:
			r.lost = true
			lostErr := fmt.Errorf("%w: %s is owned by another caller or gone; the action is cancelled", ErrLeaseLost, x.key)
			x.observe(r.ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorLeaseLost, Err: lostErr})
			r.cancelAction(ErrLeaseLost)
			return
		default:
			x.storageFailed(r.ctx, idemevent.ErrorStorageRenew, idemevent.MethodRenew, err)
			if !time.Now().Before(r.deadline) {
				r.expire()
				return
			}
		}
		select {
		case <-rctx.Done():
			return
		case <-wd.C:
			r.expire()
			return
		case <-t.C:
		}
	}
}

// expire is the watchdog firing.
func (r *renewer) expire() {
	r.expired = true
	x := r.x
	err := fmt.Errorf("%w: no renewal of %s confirmed for %v (the lease %v less its margin): it may have expired, and the action is cancelled before another caller can take the key over",
		ErrLeaseLost, x.key, r.limit, x.c.cfg.lease)
	x.observe(r.ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorLeaseLost, Err: err})
	r.cancelAction(ErrLeaseLost)
}

// stop stops the renewer and waits for it; it reports whether the lease was
// found lost. It is idempotent.
func (r *renewer) stop() (lost bool) {
	if r.timer.Stop() {
		return false // run never started, and now never will
	}
	r.mu.Lock()
	r.stopped = true
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if done == nil {
		return false // run started, saw stopped, and returned
	}
	cancel()
	<-done
	return r.lost
}
