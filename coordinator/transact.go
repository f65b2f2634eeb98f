package coordinator

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// transacted is the flow of a call over an idemstore.Transactor (see there).
func (f *flow[T]) transacted(ctx context.Context, tr idemstore.Transactor) (Result[T], error) {
	began := time.Now()
	until := began.Add(f.c.cfg.waitTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	// A read first, outside any transaction, when recent calls mostly found
	// a record (see readOrder): a replay costs one round trip and takes no
	// lock. Like the claim, it may wait for a connection up to the wait
	// bound: the store's connections are the ones the holders' transactions
	// hold, so waiting for one is waiting for a holder, not a sign that the
	// store is down. Otherwise the claim comes first, and reads the record
	// that holds the key in its own round trip.
	readFirst := f.c.order.readFirst()
	sampled := readFirst // whether found has heard of this call
	var rec idemstore.Record
	var err error
	if readFirst {
		start := time.Now()
		sctx, cancel := context.WithDeadline(ctx, until.Add(f.c.cfg.storageTimeout))
		rec, err = f.c.store.Get(sctx, f.key)
		cancel()
		f.end(ctx, nil, start, idemevent.MethodGet, err)
		if err != nil {
			return Result[T]{}, f.unclaimed(ctx, idemevent.ErrorStorageGet, idemevent.MethodGet, err)
		}
		f.c.order.found(rec.State != idemstore.StateAbsent)
	}
	w := idemstore.Write{State: idemstore.StatePending, Token: f.token, Fingerprint: f.fp, TTL: f.c.cfg.lease}
	var deadline time.Time // of a wait for a committed pending record
	for range maxRounds {
		if err := f.reuse(ctx, rec); err != nil {
			return Result[T]{}, err
		}
		switch rec.State {
		case idemstore.StateNotReplayable:
			return Result[T]{}, f.notReplayable(ctx, rec)
		case idemstore.StateCompleted, idemstore.StateUnreadable:
			if f.readable(ctx, rec) {
				return f.hit(ctx)
			}
			// Heal: take the record over with a compare-and-swap on its
			// token, so that of many healers only one runs.
			w.Replace, w.ReplaceToken = true, rec.Token
		case idemstore.StatePending:
			// A pending record that committed (a coordinator's Reserve over
			// the same store): wait for it as for any holder, by reading.
			if rec, err = f.awaitHolder(ctx, rec, &deadline); err != nil {
				var se *StorageError
				if errors.As(err, &se) {
					return Result[T]{}, se
				}
				return Result[T]{}, err
			}
			continue
		default:
			w.Replace, w.ReplaceToken = false, ""
		}
		claim, existing, err := f.storeClaim(ctx, tr, w, f.lockWait(ctx, until))
		if !sampled && err == nil {
			f.c.order.found(claim == nil && existing.State != idemstore.StateAbsent)
			sampled = true
		}
		switch {
		case errors.Is(err, ErrInProgress):
			// Another transaction held the key past the wait.
			f.observe(ctx, idemevent.Event{Kind: idemevent.InFlight, Mode: f.c.cfg.inFlight.String()})
			if f.c.cfg.inFlight != InFlightRaise {
				f.observe(ctx, idemevent.Event{Kind: idemevent.Waited, Outcome: idemevent.WaitTimeout, Duration: time.Since(began)})
			}
			return Result[T]{}, f.inProgress(heldRetryAfter)
		case err != nil:
			return Result[T]{}, f.unclaimed(ctx, idemevent.ErrorStorageReserve, idemevent.MethodReserve, err)
		case claim != nil:
			return f.runClaimed(ctx, claim)
		}
		rec = existing
	}
	return Result[T]{}, f.inProgress(0)
}

// heldRetryAfter is InProgressError.RetryAfter for a key that another
// transaction holds: nothing says how long it will run.
const heldRetryAfter = time.Second

// lockWait is how long a claim may wait for a transaction that holds the
// key: not at all in mode raise; in the other modes until the wait bound,
// ending a little before ctx's deadline, so that a caller whose deadline is
// the bound hears ErrInProgress rather than its context's error.
func (f *flow[T]) lockWait(ctx context.Context, until time.Time) time.Duration {
	if f.c.cfg.inFlight == InFlightRaise {
		return 0
	}
	wait := time.Until(until)
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)*9/10)
	}
	return max(wait, 0)
}

// unclaimed is the error of a read or a claim that failed before the
// action: ctx's error when ctx has ended, else a *StorageError, whatever
// the on-storage-error mode (see idemstore.Transactor).
func (f *flow[T]) unclaimed(ctx context.Context, t idemevent.ErrorType, m idemevent.Method, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return f.storageFailed(ctx, t, m, err)
}

// storeClaim claims the key; the call may wait for the lock up to wait,
// and has one storage timeout beyond it.
func (f *flow[T]) storeClaim(ctx context.Context, tr idemstore.Transactor, w idemstore.Write, wait time.Duration) (idemstore.Claim, idemstore.Record, error) {
	start := time.Now()
	sctx, cancel := context.WithDeadline(ctx, start.Add(wait+f.c.cfg.storageTimeout))
	claim, rec, err := tr.Claim(sctx, f.key, w, wait)
	cancel()
	if errors.Is(err, ErrInProgress) {
		f.end(ctx, nil, start, idemevent.MethodReserve, nil)
	} else {
		f.end(ctx, nil, start, idemevent.MethodReserve, err)
	}
	return claim, rec, err
}

// runClaimed runs the action in the claim's transaction, and commits its
// result with its writes, or rolls both back.
func (f *flow[T]) runClaimed(ctx context.Context, claim idemstore.Claim) (Result[T], error) {
	f.observe(ctx, idemevent.Event{Kind: idemevent.Miss})
	res := Reservation{Operation: f.key.Operation, Key: f.key.Key, Token: f.token}
	actx := claim.Context(context.WithValue(ctx, reservationKey{}, res))
	returned := false
	defer func() {
		if !returned { // the action panicked (or called runtime.Goexit)
			f.rollback(ctx, claim)
		}
	}()
	err := f.run(actx)
	returned = true
	if err != nil {
		f.rollback(ctx, claim)
		return f.mine(), err
	}
	f.keep(ctx)
	// The commit is not cut short by a caller that hung up: the action ran,
	// and its writes and result are best kept. It has one storage timeout,
	// on a timer of its own: begin's shared deadline measured slower on
	// this path (a first run's median 449µs against 328µs on PostgreSQL).
	start := time.Now()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.c.cfg.storageTimeout)
	err = claim.Commit(cctx, idemstore.Completion{State: f.state, Result: f.payload, TTL: f.ttl})
	f.end(ctx, cancel, start, idemevent.MethodComplete, err)
	if err != nil {
		return f.mine(), f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodComplete, err)
	}
	f.observe(ctx, idemevent.Event{Kind: idemevent.Stored})
	f.c.kick(f.key)
	return f.mine(), nil
}

// rollback ends the claim's transaction without committing, reporting a
// failure to do so as a failed release.
func (f *flow[T]) rollback(ctx context.Context, claim idemstore.Claim) {
	start := time.Now()
	err := claim.Rollback(context.WithoutCancel(ctx))
	f.end(ctx, nil, start, idemevent.MethodRelease, err)
	if err != nil {
		f.storageFailed(ctx, idemevent.ErrorStorageRelease, idemevent.MethodRelease, err)
	}
}

// unprotectedTx runs action in a transaction of tr with no record: the
// kill switch is off, and nothing is reported.
func unprotectedTx[T any](ctx context.Context, tr idemstore.Transactor, call Call, action func(context.Context) (T, error)) (Result[T], error) {
	claim, err := tr.Begin(ctx)
	if err != nil {
		return Result[T]{}, asStorageError(idemevent.MethodReserve, idemstore.Key{Operation: call.Operation, Key: call.Key}, err)
	}
	returned := false
	defer func() {
		if !returned {
			_ = claim.Rollback(context.WithoutCancel(ctx))
		}
	}()
	v, err := action(claim.Context(withDownstream(ctx, idemstore.Key{Operation: call.Operation, Key: call.Key})))
	returned = true
	if err != nil {
		_ = claim.Rollback(context.WithoutCancel(ctx))
		return Result[T]{Value: v}, err
	}
	if err := claim.Commit(context.WithoutCancel(ctx), idemstore.Completion{}); err != nil {
		return Result[T]{Value: v}, asStorageError(idemevent.MethodComplete, idemstore.Key{Operation: call.Operation, Key: call.Key}, err)
	}
	return Result[T]{Value: v}, nil
}

// readOrder chooses, for a call over a Transactor, between a read first
// and a claim first. A read first answers a replay in one statement, but
// costs a first run a round trip more; a claim first answers a replay with
// a transaction that it rolls back, and costs a first run nothing more. So
// the coordinator reads first while most of its recent calls found a
// record there, and claims first otherwise: a service whose calls are
// mostly first runs, as a payment's are, runs them without the read, and
// a storm of retries is answered by reads. The order changes only the cost
// of a call, never its outcome: the claim reads the record that holds the
// key as the read does, and the call treats both the same.
//
// found's answers weigh in an exponential moving average, in units of
// 1/orderScale, each new one with 1/2^orderShift of the weight; calls race
// on it without a lock, and a lost update only delays the switch. It
// starts at claim first. On PostgreSQL the two orders cost the same at a
// share of replays of about a half for a lone caller, and above eight
// tenths for 64 (docs/performance.md, "Read first or claim first").
type readOrder struct{ score atomic.Int32 }

const (
	orderScale = 1 << 10
	orderShift = 4
	// readFirstShare is the share of calls that found a record, in units
	// of 1/orderScale, above which calls read first: a half.
	readFirstShare = orderScale / 2
)

// readFirst reports whether the next call should read first.
func (o *readOrder) readFirst() bool { return o.score.Load() > readFirstShare }

// found records whether a call found a record under its key at its first
// look (the read, or the claim when it came first).
func (o *readOrder) found(yes bool) {
	s := o.score.Load()
	if yes {
		s += (orderScale - s) >> orderShift
	} else {
		s -= s >> orderShift
	}
	o.score.Store(s)
}
