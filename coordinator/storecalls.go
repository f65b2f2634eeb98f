package coordinator

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// begin starts one store call under the storage timeout; end reports its
// latency. (No closure per call: these run on every request.) When ctx ends
// by the storage timeout anyway, the call runs under ctx itself: no timer,
// no allocation. When ctx cannot end (a background context, or one the
// coordinator detached), the call runs under a deadline it shares with the
// calls of the same tick (see deadlines): no timer, at most one allocation.
// Only a context that can be cancelled and has no sooner deadline costs
// context.WithDeadline.
func (x *exec) begin(ctx context.Context) (context.Context, context.CancelFunc, time.Time) {
	now := time.Now()
	if d, ok := ctx.Deadline(); ok && !d.After(now.Add(x.c.cfg.storageTimeout)) {
		return ctx, nil, now
	}
	if ctx.Done() == nil {
		return x.c.deadlines.shared(ctx, now), nil, now
	}
	sctx, cancel := context.WithDeadline(ctx, now.Add(x.c.cfg.storageTimeout))
	return sctx, cancel, now
}

func (x *exec) end(ctx context.Context, cancel context.CancelFunc, start time.Time, m idemevent.Method, err error) {
	if cancel != nil {
		cancel()
	}
	x.observe(ctx, idemevent.Event{Kind: idemevent.StorageCall, Method: m, Duration: time.Since(start), Err: err})
}

func (x *exec) storeReserve(ctx context.Context, w idemstore.Write) (idemstore.Record, bool, error) {
	if x.fenced && w.State == idemstore.StatePending {
		return x.storeReserveFenced(ctx, w)
	}
	sctx, cancel, start := x.begin(ctx)
	rec, ok, err := x.c.store.Reserve(sctx, x.key, w)
	x.end(ctx, cancel, start, idemevent.MethodReserve, err)
	return rec, ok, err
}

// storeReserveFenced is storeReserve for a fenced operation's reservation:
// it keeps the fence the store handed out.
func (x *exec) storeReserveFenced(ctx context.Context, w idemstore.Write) (idemstore.Record, bool, error) {
	sctx, cancel, start := x.begin(ctx)
	rec, fence, ok, err := x.c.fencer.ReserveFenced(sctx, x.key, w)
	if err == nil && fence != 0 {
		x.fence = fence
	}
	x.end(ctx, cancel, start, idemevent.MethodReserve, err)
	return rec, ok, err
}

func (x *exec) storeGet(ctx context.Context) (idemstore.Record, error) {
	sctx, cancel, start := x.begin(ctx)
	rec, err := x.c.store.Get(sctx, x.key)
	x.end(ctx, cancel, start, idemevent.MethodGet, err)
	return rec, err
}

func (x *exec) storeComplete(ctx context.Context, st idemstore.State, payload []byte) (bool, error) {
	sctx, cancel, start := x.begin(ctx)
	ok, err := x.c.store.Complete(sctx, x.key, x.token, idemstore.Completion{State: st, Result: payload, TTL: x.ttl})
	x.end(ctx, cancel, start, idemevent.MethodComplete, err)
	return ok, err
}

// storeCompleteWithin is storeComplete bounded by ctx's own deadline rather
// than the storage timeout: for the background save rounds, which may use
// what is left of the reservation.
func (x *exec) storeCompleteWithin(ctx context.Context, st idemstore.State, payload []byte) (bool, error) {
	start := time.Now()
	ok, err := x.c.store.Complete(ctx, x.key, x.token, idemstore.Completion{State: st, Result: payload, TTL: x.ttl})
	x.end(ctx, nil, start, idemevent.MethodComplete, err)
	return ok, err
}

// storeRenewWithin renews the reservation, bounded by ctx's own deadline
// rather than the storage timeout: renewals and save rounds run off the
// request path (see storeCompleteWithin).
func (x *exec) storeRenewWithin(ctx context.Context) (bool, error) {
	start := time.Now()
	ok, err := x.c.store.Renew(ctx, x.key, x.token, x.c.cfg.lease)
	x.end(ctx, nil, start, idemevent.MethodRenew, err)
	return ok, err
}

func (x *exec) storeRelease(ctx context.Context) (bool, error) {
	sctx, cancel, start := x.begin(ctx)
	ok, err := x.c.store.Release(sctx, x.key, x.token)
	x.end(ctx, cancel, start, idemevent.MethodRelease, err)
	return ok, err
}

func (x *exec) storeWatch(ctx context.Context, w idemstore.Watcher) (idemstore.Record, <-chan struct{}, func(), error) {
	sctx, cancel, start := x.begin(ctx)
	rec, ch, stop, err := w.Watch(sctx, x.key)
	x.end(ctx, cancel, start, idemevent.MethodGet, err)
	return rec, ch, stop, err
}
