package coordinator

import (
	"context"
	"time"
)

// timed runs one store call under the storage timeout and reports its
// latency.
func timed[R any](x *exec, ctx context.Context, m Method, f func(context.Context) (R, error)) (R, error) {
	sctx, cancel := context.WithTimeout(ctx, x.c.cfg.storageTimeout)
	defer cancel()
	start := time.Now()
	r, err := f(sctx)
	x.observe(ctx, Event{Kind: EventStorageCall, Method: m, Duration: time.Since(start), Err: err})
	return r, err
}

type reserved struct {
	rec     Record
	written bool
}

func (x *exec) storeReserve(ctx context.Context, w Write) (Record, bool, error) {
	r, err := timed(x, ctx, MethodReserve, func(ctx context.Context) (reserved, error) {
		rec, ok, err := x.c.store.Reserve(ctx, x.key, w)
		return reserved{rec, ok}, err
	})
	return r.rec, r.written, err
}

func (x *exec) storeGet(ctx context.Context) (Record, error) {
	return timed(x, ctx, MethodGet, func(ctx context.Context) (Record, error) {
		return x.c.store.Get(ctx, x.key)
	})
}

func (x *exec) storeComplete(ctx context.Context, payload []byte) (bool, error) {
	return timed(x, ctx, MethodComplete, func(ctx context.Context) (bool, error) {
		return x.c.store.Complete(ctx, x.key, x.token, payload, x.ttl)
	})
}

func (x *exec) storeRelease(ctx context.Context) (bool, error) {
	return timed(x, ctx, MethodRelease, func(ctx context.Context) (bool, error) {
		return x.c.store.Release(ctx, x.key, x.token)
	})
}

func (x *exec) storeRenew(ctx context.Context) (bool, error) {
	return timed(x, ctx, MethodRenew, func(ctx context.Context) (bool, error) {
		return x.c.store.Renew(ctx, x.key, x.token, x.c.cfg.lease)
	})
}
