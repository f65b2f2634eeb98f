package coordinator

import (
	"context"
	"fmt"
	"time"
)

// renewer keeps a running action's lease alive.
type renewer struct {
	cancel context.CancelFunc // stops the renewer's own store calls
	quit   chan struct{}
	done   chan struct{}
	lost   bool // written by the renewer goroutine before done is closed
}

// startRenewer renews the lease every renew interval until stop. A renewal
// that finds the lease lost cancels the action's context with cause
// ErrLeaseLost; a renewal that fails is reported and retried at the next tick.
func (x *exec) startRenewer(ctx context.Context, cancelAction context.CancelCauseFunc) *renewer {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &renewer{cancel: cancel, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		t := time.NewTicker(x.c.cfg.renewInterval)
		defer t.Stop()
		for {
			select {
			case <-r.quit:
				return
			case <-t.C:
			}
			ok, err := x.storeRenew(rctx)
			switch {
			case rctx.Err() != nil:
				return // stopped while renewing
			case err != nil:
				x.storageFailed(ctx, ErrorStorageRenew, MethodRenew, err)
			case !ok:
				r.lost = true
				lostErr := fmt.Errorf("%w: %s is owned by another caller or gone; the action is cancelled", ErrLeaseLost, x.key)
				x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorLeaseLost, Err: lostErr})
				cancelAction(ErrLeaseLost)
				return
			}
		}
	}()
	return r
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
