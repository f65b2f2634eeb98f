package coordinator

import (
	"context"
	"errors"
	"time"
)

// Transactor is an optional interface of a Store that claims a key inside a
// database transaction and hands that transaction to the action, so that
// the action's writes through it, its result and the record commit together
// or not at all (idempg.Store). Over a Transactor, every call of the
// coordinator (Do, Execute, and so every adapter) takes this path instead
// of Reserve, Complete and Release:
//
//   - a read first (Get), outside any transaction: a replay takes no lock;
//   - Claim, which waits for a transaction that holds the key for as long
//     as the in-flight mode and the wait bound allow (mode run is treated as
//     wait: the claim is what makes the call exactly once);
//   - the action, with the claim's transaction in its context (the store's
//     accessor, such as idempg.Tx, takes it out);
//   - Claim.Commit with the result, or Claim.Rollback when the action
//     fails or panics: its writes are undone and the key is free.
//
// There is no lease to renew: the transaction holds the key for as long as
// it lives, and a holder that dies frees it when the database ends its
// connection. The on-storage-error mode does not apply: a store failure
// before the action returns a *StorageError and never runs the action, since
// writes through a transaction that could not begin cannot happen either;
// and a failed Commit returns a *StorageError with the action's result,
// since its writes did not commit (or, for a lost answer, may not have).
type Transactor interface {
	Store

	// Claim is Reserve in a transaction that stays open. If the key is free
	// (absent, or expired), or w.Replace is set and the record is not
	// pending and has token w.ReplaceToken, it writes w (a pending record)
	// in a new transaction and returns that transaction as an open Claim.
	// Otherwise it ends the transaction and returns the committed record
	// under the key, and a nil Claim. It waits up to wait for another
	// transaction that holds the key (wait <= 0: it does not wait), and
	// returns an error matching ErrInProgress when that transaction held it
	// throughout.
	Claim(ctx context.Context, key Key, w Write, wait time.Duration) (Claim, Record, error)

	// Begin begins a transaction with no record in it, for a call made while
	// the kill switch is off (WithEnabled(false)): the action still gets a
	// transaction, and its writes commit when it returns.
	Begin(ctx context.Context) (Claim, error)
}

// Claim is an open transaction of a Transactor, which holds a key (from
// Transactor.Claim) or none (from Transactor.Begin). The coordinator ends
// it exactly once, with Commit or Rollback.
type Claim interface {
	// Context returns ctx with the transaction in it, for the action.
	Context(ctx context.Context) context.Context

	// Commit writes c as the key's record in the transaction, in place of
	// the pending record the claim wrote, and commits. An error means that
	// nothing committed or, when the answer to the commit was lost, that
	// its outcome is unknown.
	Commit(ctx context.Context, c Completion) error

	// Rollback rolls the transaction back: the action's writes and the
	// claim are undone, and the key is free. It reports what went wrong
	// doing so, for the logs.
	Rollback(ctx context.Context) error
}

// transacted is the flow of a call over a Transactor (see Transactor).
func (f *flow[T]) transacted(ctx context.Context, tr Transactor) (Result[T], error) {
	began := time.Now()
	until := began.Add(f.c.cfg.waitTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	// A read first, outside any transaction: a replay costs one round trip
	// and takes no lock. Like the claim, it may wait for a connection up to
	// the wait bound: the store's connections are the ones the holders'
	// transactions hold, so waiting for one is waiting for a holder, not a
	// sign that the store is down.
	start := time.Now()
	sctx, cancel := context.WithDeadline(ctx, until.Add(f.c.cfg.storageTimeout))
	rec, err := f.c.store.Get(sctx, f.key)
	cancel()
	f.end(ctx, nil, start, MethodGet, err)
	if err != nil {
		return Result[T]{}, f.unclaimed(ctx, ErrorStorageGet, MethodGet, err)
	}
	w := Write{State: StatePending, Token: f.token, Fingerprint: f.fp, TTL: f.c.cfg.lease}
	var deadline time.Time // of a wait for a committed pending record
	for range maxRounds {
		if err := f.reuse(ctx, rec); err != nil {
			return Result[T]{}, err
		}
		switch rec.State {
		case StateNotReplayable:
			return Result[T]{}, f.notReplayable(ctx, rec)
		case StateCompleted, StateUnreadable:
			if f.readable(ctx, rec) {
				return f.hit(ctx)
			}
			// Heal: take the record over with a compare-and-swap on its
			// token, so that of many healers only one runs.
			w.Replace, w.ReplaceToken = true, rec.Token
		case StatePending:
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
		switch {
		case errors.Is(err, ErrInProgress):
			// Another transaction held the key past the wait.
			f.observe(ctx, Event{Kind: EventInFlight, Mode: f.c.cfg.inFlight})
			if f.c.cfg.inFlight != InFlightRaise {
				f.observe(ctx, Event{Kind: EventWaited, Outcome: WaitTimeout, Duration: time.Since(began)})
			}
			return Result[T]{}, f.inProgress(heldRetryAfter)
		case err != nil:
			return Result[T]{}, f.unclaimed(ctx, ErrorStorageReserve, MethodReserve, err)
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
// the on-storage-error mode (see Transactor).
func (f *flow[T]) unclaimed(ctx context.Context, t ErrorType, m Method, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return f.storageFailed(ctx, t, m, err)
}

// storeClaim claims the key; the call may wait for the lock up to wait,
// and has one storage timeout beyond it.
func (f *flow[T]) storeClaim(ctx context.Context, tr Transactor, w Write, wait time.Duration) (Claim, Record, error) {
	start := time.Now()
	sctx, cancel := context.WithDeadline(ctx, start.Add(wait+f.c.cfg.storageTimeout))
	claim, rec, err := tr.Claim(sctx, f.key, w, wait)
	cancel()
	if errors.Is(err, ErrInProgress) {
		f.end(ctx, nil, start, MethodReserve, nil)
	} else {
		f.end(ctx, nil, start, MethodReserve, err)
	}
	return claim, rec, err
}

// runClaimed runs the action in the claim's transaction, and commits its
// result with its writes, or rolls both back.
func (f *flow[T]) runClaimed(ctx context.Context, claim Claim) (Result[T], error) {
	f.observe(ctx, Event{Kind: EventMiss})
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
	err = claim.Commit(cctx, Completion{State: f.state, Result: f.payload, TTL: f.ttl})
	f.end(ctx, cancel, start, MethodComplete, err)
	if err != nil {
		return f.mine(), f.storageFailed(ctx, ErrorStorageSave, MethodComplete, err)
	}
	f.observe(ctx, Event{Kind: EventStored})
	f.c.kick(f.key)
	return f.mine(), nil
}

// rollback ends the claim's transaction without committing, reporting a
// failure to do so as a failed release.
func (f *flow[T]) rollback(ctx context.Context, claim Claim) {
	start := time.Now()
	err := claim.Rollback(context.WithoutCancel(ctx))
	f.end(ctx, nil, start, MethodRelease, err)
	if err != nil {
		f.storageFailed(ctx, ErrorStorageRelease, MethodRelease, err)
	}
}

// unprotectedTx runs action in a transaction of tr with no record: the
// kill switch is off, and nothing is reported.
func unprotectedTx[T any](ctx context.Context, tr Transactor, call Call, action func(context.Context) (T, error)) (Result[T], error) {
	claim, err := tr.Begin(ctx)
	if err != nil {
		return Result[T]{}, asStorageError(MethodReserve, Key{Operation: call.Operation, Key: call.Key}, err)
	}
	returned := false
	defer func() {
		if !returned {
			_ = claim.Rollback(context.WithoutCancel(ctx))
		}
	}()
	v, err := action(claim.Context(withDownstream(ctx, Key{Operation: call.Operation, Key: call.Key})))
	returned = true
	if err != nil {
		_ = claim.Rollback(context.WithoutCancel(ctx))
		return Result[T]{Value: v}, err
	}
	if err := claim.Commit(context.WithoutCancel(ctx), Completion{}); err != nil {
		return Result[T]{Value: v}, asStorageError(MethodComplete, Key{Operation: call.Operation, Key: call.Key}, err)
	}
	return Result[T]{Value: v}, nil
}
