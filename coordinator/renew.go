package coordinator

import (
	"context"
	"fmt"
	"time"
)

// renewer keeps a running action's lease alive, and is its watchdog.
type renewer struct {
	cancel context.CancelFunc // stops the renewer's own store calls
	quit   chan struct{}
	done   chan struct{}
	// Written by the renewer goroutine before done is closed:
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
// cause ErrLeaseLost before another caller can take the key.
func (x *exec) startRenewer(ctx context.Context, cancelAction context.CancelCauseFunc, sent time.Time) *renewer {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &renewer{cancel: cancel, quit: make(chan struct{}), done: make(chan struct{})}
	limit := x.c.watchdogLimit()
	r.deadline = sent.Add(limit)
	go func() {
		defer close(r.done)
		t := time.NewTicker(x.c.cfg.renewInterval)
		defer t.Stop()
		wd := time.NewTimer(time.Until(r.deadline))
		defer wd.Stop()
		for {
			select {
			case <-r.quit:
				return
			case <-wd.C:
				r.expire(ctx, x, cancelAction, limit)
				return
			case <-t.C:
			}
			at := time.Now()
			// A renewal ends by the watchdog's deadline, so that a hung
			// store cannot hold the watchdog back.
			cctx, ccancel := context.WithDeadline(rctx, r.deadline)
			ok, err := x.storeRenew(cctx)
			ccancel()
			switch {
			case rctx.Err() != nil:
				return // stopped while renewing
			case err == nil && ok:
				r.deadline = at.Add(limit)
				wd.Reset(time.Until(r.deadline))
			case err == nil:
				r.lost = true
				lostErr := fmt.Errorf("%w: %s is owned by another caller or gone; the action is cancelled", ErrLeaseLost, x.key)
				x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorLeaseLost, Err: lostErr})
				cancelAction(ErrLeaseLost)
				return
			default:
				x.storageFailed(ctx, ErrorStorageRenew, MethodRenew, err)
				if !time.Now().Before(r.deadline) {
					r.expire(ctx, x, cancelAction, limit)
					return
				}
			}
		}
	}()
	return r
}

// expire is the watchdog firing.
func (r *renewer) expire(ctx context.Context, x *exec, cancelAction context.CancelCauseFunc, limit time.Duration) {
	r.expired = true
	err := fmt.Errorf("%w: no renewal of %s confirmed for %v (the lease %v less its margin): it may have expired, and the action is cancelled before another caller can take the key over",
		ErrLeaseLost, x.key, limit, x.c.cfg.lease)
	x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorLeaseLost, Err: err})
	cancelAction(ErrLeaseLost)
}

// stop stops the renewer and waits for it; it reports whether the lease was
// found lost. It is idempotent.
func (r *renewer) stop() (lost bool) {
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	r.cancel()
	<-r.done
	return r.lost
}
