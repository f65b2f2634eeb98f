package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// This file is the flow of one call: validate, reserve or read,
// wait, run, complete or release. exec holds what every step needs and does
// not depend on the result type (the shared poll loop keeps one); flow[T]
// adds the action, its codec and its results.

// maxRounds bounds the reserve loop: heals and takeovers that keep losing
// races end in ErrInProgress instead of looping.
const maxRounds = 64

// do is the one path of Do, DoResult, DoWithCodec and Execute.
func do[T any](ctx context.Context, c *Coordinator, call Call, codec Codec[T], action func(context.Context) (T, error)) (Result[T], error) {
	ttl, err := c.check(call)
	if err != nil {
		return Result[T]{}, err
	}
	if !c.cfg.enabled {
		if c.tx != nil {
			return unprotectedTx(ctx, c.tx, call, action)
		}
		v, err := action(withDownstream(ctx, idemstore.Key{Operation: call.Operation, Key: call.Key}))
		return Result[T]{Value: v}, err
	}
	f := &flow[T]{
		exec:   exec{c: c, key: idemstore.Key{Operation: call.Operation, Key: call.Key}, fp: call.Fingerprint, ttl: ttl, fenced: c.cfg.fenced != nil && c.cfg.fenced[call.Operation]},
		codec:  codec,
		action: action,
	}
	f.newToken()
	if c.tx != nil {
		return f.transacted(ctx, c.tx)
	}
	if c.cfg.inFlight == InFlightRun {
		return f.unreserved(ctx)
	}
	return f.reserved(ctx)
}

// check validates call and returns the TTL its result is kept for.
func (c *Coordinator) check(call Call) (time.Duration, error) {
	if err := ValidateOperation(call.Operation); err != nil {
		return 0, err
	}
	if err := ValidateKey(call.Key); err != nil {
		return 0, err
	}
	if err := ValidateFingerprint(call.Fingerprint); err != nil {
		return 0, err
	}
	if call.TTL < 0 {
		return 0, invalid("TTL %v is negative", call.TTL)
	}
	// The operator's per-operation TTL wins over the call's, which wins over
	// the default, as in the Python idempotency-kit: an operator can shorten
	// a TTL that a service hard-codes.
	ttl, ok := c.cfg.operationTTLs[call.Operation]
	switch {
	case ok:
	case call.TTL > 0:
		ttl = call.TTL
	default:
		ttl = c.cfg.defaultTTL
	}
	ttl = ttl.Truncate(time.Millisecond)
	if ttl < c.cfg.minTTL || ttl > c.cfg.maxTTL {
		return 0, invalid("TTL %v is outside [%v, %v]", call.TTL, c.cfg.minTTL, c.cfg.maxTTL)
	}
	return ttl, nil
}

// flow is one protected call of Do, DoResult, DoWithCodec or Execute: one
// allocation for the call's state, its action and its results.
type flow[T any] struct {
	exec
	codec  Codec[T]
	action func(context.Context) (T, error)

	own     T      // the action's result
	payload []byte // own, encoded; once kept, what the record holds (x.state)
	encErr  error  // why own could not be encoded
	stored  T      // a stored result, decoded
}

// run runs the action and keeps its result, encoded when it succeeded. It
// returns the action's error.
func (f *flow[T]) run(ctx context.Context) error {
	v, err := f.action(withDownstream(ctx, f.key))
	f.own = v
	if err != nil {
		return err
	}
	f.payload, f.encErr = safeEncode(f.codec, v)
	return nil
}

// safeEncode encodes v, turning a panic of the codec into an error: the
// action has run, and nothing may raise after that (encoding/json panics on,
// for one, a struct that embeds a nil *time.Time).
func safeEncode[T any](codec Codec[T], v T) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("codec panicked: %v", p)
		}
	}()
	return codec.Encode(v)
}

// mine is the call's own result.
func (f *flow[T]) mine() Result[T] { return Result[T]{Value: f.own} }

// hit replays the stored result that readable decoded.
func (f *flow[T]) hit(ctx context.Context) (Result[T], error) {
	f.observe(ctx, idemevent.Event{Kind: idemevent.Hit})
	return Result[T]{Value: f.stored, Replayed: true}, nil
}

// readable reports whether rec is a completed record whose result decodes,
// keeping the decoded result; it reports a decode_error when not.
func (f *flow[T]) readable(ctx context.Context, rec idemstore.Record) bool {
	var err error
	if rec.State == idemstore.StateCompleted {
		var v T
		if v, err = f.codec.Decode(rec.Result); err == nil {
			f.stored = v
			return true
		}
		err = fmt.Errorf("idempotency: stored result of %s cannot be decoded: %w", f.key, err)
	} else {
		err = fmt.Errorf("idempotency: record of %s cannot be read", f.key)
	}
	f.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorDecode, Err: err})
	return false
}

// keep decides what the record of the action that ran holds: its encoded
// result, or, when that cannot be kept (the codec failed or panicked, or the
// result is over the size limit), a not-replayable record with the reason,
// so that the action is never run again for the key (docs/architecture.md,
// "One call", step 9).
func (f *flow[T]) keep(ctx context.Context) {
	var why string
	switch {
	case f.encErr != nil:
		why = "the result cannot be encoded: " + f.encErr.Error()
	case len(f.payload) > f.c.cfg.maxResultBytes:
		why = fmt.Sprintf("the result is %d bytes, more than the limit of %d", len(f.payload), f.c.cfg.maxResultBytes)
	default:
		f.state = idemstore.StateCompleted
		return
	}
	if len(why) > maxReasonLen {
		why = why[:maxReasonLen]
	}
	f.state, f.payload = idemstore.StateNotReplayable, []byte(why)
	f.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorRecordValidation,
		Err: fmt.Errorf("idempotency: %s of %s; the key is kept as completed and not replayable, so later calls get ErrNotReplayable", why, f.key)})
}

// maxReasonLen bounds the reason a not-replayable record keeps, so that an
// encoder's long message cannot make the record large.
const maxReasonLen = 256

// reserved is the flow of in-flight modes "wait" and "raise": reserve the
// key or read what holds it, and settle that record: run under our own
// reservation, replay a result, wait for a holder, or heal a record nobody
// can read. Every round writes with the compare-and-swap the last record
// calls for.
func (f *flow[T]) reserved(ctx context.Context) (Result[T], error) {
	return f.reservedAfter(ctx, nil)
}

// answer is what a Reserve of the call's key sent at sent returned.
type answer struct {
	rec     idemstore.Record
	written bool
	err     error
	sent    time.Time
}

// reservedAfter is reserved whose first round takes first, when not nil,
// as its Reserve's answer: the part of a batch's ReserveMany about the key.
func (f *flow[T]) reservedAfter(ctx context.Context, first *answer) (Result[T], error) {
	w := idemstore.Write{State: idemstore.StatePending, Token: f.token, Fingerprint: f.fp, TTL: f.c.cfg.lease}
	var deadline time.Time // of waiting; set when a holder is first seen
	for range maxRounds {
		var a answer
		if first != nil {
			a, first = *first, nil
		} else {
			a.sent = time.Now()
			a.rec, a.written, a.err = f.storeReserve(ctx, w)
		}
		rec, written, err, sent := a.rec, a.written, a.err, a.sent
		switch {
		case err != nil:
			return f.reserveFailed(ctx, err)
		case written || f.ours(rec, idemstore.StatePending):
			// The second case is our own reservation, met again because a
			// client retried the call after losing the first reply.
			return f.runReserved(ctx, sent)
		}
		if rec.State == idemstore.StatePending {
			// A wait ends on a record that is not pending.
			if rec, err = f.awaitHolder(ctx, rec, &deadline); err != nil {
				var se *StorageError
				if errors.As(err, &se) {
					return f.onStorageError(ctx, se)
				}
				return Result[T]{}, err
			}
		}
		if err := f.reuse(ctx, rec); err != nil {
			return Result[T]{}, err
		}
		if rec.State == idemstore.StateAbsent {
			// The holder released or its lease ran out (take over), or a
			// Reserve that did not write raced expiry: reserve again.
			w.Replace, w.ReplaceToken = false, ""
			continue
		}
		if rec.State == idemstore.StateNotReplayable {
			return Result[T]{}, f.notReplayable(ctx, rec)
		}
		if f.readable(ctx, rec) {
			return f.hit(ctx)
		}
		// Heal: take the record over with a compare-and-swap on its token,
		// so that of many healers only one runs.
		w.Replace, w.ReplaceToken = true, rec.Token
	}
	return Result[T]{}, f.inProgress(0)
}

// reserveFailed handles a Reserve that failed.
func (f *flow[T]) reserveFailed(ctx context.Context, err error) (Result[T], error) {
	if ctx.Err() != nil {
		// The caller hung up. The script may have run with its reply lost:
		// give the key back rather than leave it reserved for a lease.
		f.releaseLater(ctx)
		return Result[T]{}, ctx.Err()
	}
	se := f.storageFailed(ctx, idemevent.ErrorStorageReserve, idemevent.MethodReserve, err)
	if f.c.cfg.onStorageError == OnStorageErrorRaise && replyMayBeLost(err) {
		// The same, in the background: a refused call returns within one
		// storage timeout.
		f.releaseLater(ctx)
	}
	return f.onStorageError(ctx, se)
}

// awaitHolder handles a record that another caller holds, as the in-flight
// mode says: it returns an error at once (a reused key; mode "raise"), or
// waits until the record is not pending and returns that. deadline is the
// wait bound, set on the call's first wait.
func (f *flow[T]) awaitHolder(ctx context.Context, rec idemstore.Record, deadline *time.Time) (idemstore.Record, error) {
	if err := f.reuse(ctx, rec); err != nil {
		return idemstore.Record{}, err
	}
	if deadline.IsZero() {
		f.observe(ctx, idemevent.Event{Kind: idemevent.InFlight, Mode: f.c.cfg.inFlight.String()})
		if f.c.cfg.inFlight == InFlightRaise {
			return idemstore.Record{}, f.inProgress(rec.TTL)
		}
		*deadline = time.Now().Add(f.c.cfg.waitTimeout)
		if d, ok := ctx.Deadline(); ok && d.Before(*deadline) {
			*deadline = d
		}
	}
	return f.wait(ctx, *deadline, rec)
}

// onStorageError decides what a store failure before the action means.
// A store that answered with a conflict or a refusal is not down: the
// action does not run, whatever the mode.
func (f *flow[T]) onStorageError(ctx context.Context, se *StorageError) (Result[T], error) {
	if f.c.cfg.onStorageError == OnStorageErrorRaise || answered(se) {
		return Result[T]{}, se
	}
	f.observe(ctx, idemevent.Event{Kind: idemevent.Unprotected, Method: se.Method, Err: se})
	if err := f.run(ctx); err != nil {
		return f.mine(), err
	}
	f.keep(ctx)
	// In the background: the store just failed, and the caller should not
	// wait for it a second time.
	sctx := context.WithoutCancel(ctx)
	f.c.background(func() { f.saveUnprotected(sctx) })
	return f.mine(), nil
}

// saveUnprotected stores the result of an unprotected run, best effort, and
// only where nobody else wrote: the store just failed, and another caller may
// have reserved in the meantime.
func (f *flow[T]) saveUnprotected(ctx context.Context) {
	w := idemstore.Write{State: f.state, Token: f.token, Fingerprint: f.fp, Result: f.payload, TTL: f.ttl}
	rec, written, err := f.storeReserve(context.WithoutCancel(ctx), w)
	switch {
	case err != nil:
		f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodReserve, err)
	case written, f.ours(rec, f.state):
		f.observe(ctx, idemevent.Event{Kind: idemevent.Stored})
	case f.ours(rec, idemstore.StatePending):
		// Our own reservation, made by the Reserve whose reply was lost:
		// complete it.
		if ok, err := f.storeComplete(context.WithoutCancel(ctx), f.state, f.payload); err != nil {
			f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodComplete, err)
		} else if ok {
			f.observe(ctx, idemevent.Event{Kind: idemevent.Stored})
		}
		f.c.kick(f.key)
	}
}

// runReserved runs the action under this call's reservation, which the
// Reserve sent at sent made.
func (f *flow[T]) runReserved(ctx context.Context, sent time.Time) (Result[T], error) {
	f.observe(ctx, idemevent.Event{Kind: idemevent.Miss})
	res := Reservation{Operation: f.key.Operation, Key: f.key.Key, Token: f.token, Fence: f.fence}
	actx, cancel := context.WithCancelCause(context.WithValue(ctx, reservationKey{}, res))
	defer cancel(nil)
	r := f.startRenewer(ctx, cancel, sent)

	returned := false
	defer func() {
		if !returned { // the action panicked (or called runtime.Goexit)
			r.stop()
			f.release(ctx)
		}
	}()
	err := f.run(actx)
	returned = true
	lost := r.stop()

	if err != nil {
		f.release(ctx)
		return f.mine(), err
	}
	f.keep(ctx)
	if lost {
		return f.mine(), nil // reported by the renewer
	}
	// The reservation can be ours until a lease after the last renewal (or
	// the reservation) that was sent and confirmed.
	if !f.complete(ctx) {
		f.saveLater(ctx, r.deadline.Add(watchdogMargin(f.c.cfg.lease)))
	}
	return f.mine(), nil
}

// complete stores the action's result under this call's reservation, once,
// and wakes the waiters of this process. It reports whether the outcome is
// settled: false when the store failed, and the completion may or may not
// have been applied.
func (f *flow[T]) complete(ctx context.Context) (settled bool) {
	ok, err := f.storeComplete(context.WithoutCancel(ctx), f.state, f.payload)
	if err != nil {
		f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodComplete, err)
		return false
	}
	f.settle(ctx, ok)
	return true
}

// settle reports a completion that the store answered: applied (ok), or
// refused because the key is no longer our pending record.
func (f *flow[T]) settle(ctx context.Context, ok bool) {
	defer f.c.kick(f.key)
	if ok {
		f.observe(ctx, idemevent.Event{Kind: idemevent.Stored})
		return
	}
	switch ours, err := f.completedByUs(ctx); {
	case ours:
		// An earlier completion of ours was applied after all (its reply
		// was lost, or a client retried it).
		f.observe(ctx, idemevent.Event{Kind: idemevent.Stored})
	case err != nil:
		// The store refused the completion and then could not be read:
		// an earlier completion of ours may have been applied. Not a lost
		// lease, which only the record can show.
		f.storageFailed(ctx, idemevent.ErrorStorageGet, idemevent.MethodGet,
			fmt.Errorf("the completion of %s was refused, and whether an earlier one of this call was applied cannot be read (the result may or may not be stored): %w", f.key, err))
	default:
		f.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorLeaseLost,
			Err: fmt.Errorf("%w: %s was taken over before completion; the result is not stored", ErrLeaseLost, f.key)})
	}
}

// saveLater retries, in the background, a completion whose outcome is not
// known, while the reservation can still be ours: until expiry, a lease after
// the last renewal (or the reservation) that was sent and confirmed, extended
// by each renewal that goes through. Each round renews, then completes. The
// rounds back off from the poll interval to the renew interval, but never
// wait more than half the time left, so that they come closer together as
// the lease runs out and a store that comes back just before it is still
// asked in time. The expiry is this process's reckoning, not the store's:
// a round that comes due at or after it (the first attempt ended after it,
// or a starved process woke late) is still sent, once, within one storage
// timeout, so that the store says whether the record is still ours; the
// save is given up only when the store does not answer that round either.
// It never releases the key: a release could overtake a completion still on
// its way and destroy a result that exists. Both steps are owner-checked, so
// a retry is safe whatever became of the first, and so is a round after the
// expiry, which the store refuses if the record expired or was taken.
func (f *flow[T]) saveLater(ctx context.Context, expiry time.Time) {
	ctx = offRequestPath(context.WithoutCancel(ctx))
	f.c.background(func() {
		lease, timeout := f.c.cfg.lease, f.c.cfg.storageTimeout
		backoff := f.c.cfg.pollInterval
		notOurs := false // the last Renew found the key no longer our pending record
		for {
			wait := max(min(backoff, time.Until(expiry)/2), time.Millisecond)
			t := time.NewTimer(wait)
			<-t.C
			backoff = min(backoff*2, f.c.cfg.renewInterval)
			// final: the reservation could have expired by this process's
			// clock; the store decides in this round, and the loop ends
			// with it unless a renewal goes through.
			final := !time.Now().Before(expiry)
			at := time.Now()
			// Off the request path, a round may take what is left of the
			// reservation rather than one storage timeout, so that a starved
			// store that answers slowly still stores the result; a call
			// sent before the expiry may still be applied in time.
			// within is a round call's deadline: the expiry, or one
			// storage timeout from now if that is later.
			within := func() time.Time {
				if d := time.Now().Add(timeout); d.After(expiry) {
					return d
				}
				return expiry
			}
			rctx, cancel := context.WithDeadline(ctx, within())
			ok, err := f.storeRenewWithin(rctx)
			cancel()
			if err != nil {
				f.storageFailed(ctx, idemevent.ErrorStorageRenew, idemevent.MethodRenew, err)
				if final {
					break
				}
				continue
			}
			if ok { // still ours, for another lease: complete, within it
				expiry, final = at.Add(lease), false
			}
			notOurs = !ok
			// Complete even when Renew found the key no longer our
			// pending record (completed by a late completion of ours,
			// another caller's, or gone): Complete is owner-checked, and
			// a store that must have a completion acknowledged (a Redis
			// store with replica acknowledgement) acknowledges a late one
			// of ours only when it is sent again; reading the record
			// would see it on the master alone.
			cctx, cancel := context.WithDeadline(ctx, within())
			ok, err = f.storeCompleteWithin(cctx, f.state, f.payload)
			cancel()
			if err != nil {
				f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodComplete, err)
				if final {
					break
				}
				continue
			}
			f.settle(ctx, ok)
			return
		}
		if notOurs {
			// The completion sent again never answered, but the record
			// was no longer our pending one: settle on what it holds (a
			// late completion of ours, another caller's, or nothing), as
			// a store that does not acknowledge needs no resend.
			f.settle(ctx, false)
			return
		}
		f.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorStorageSave, Method: idemevent.MethodComplete,
			Err: fmt.Errorf("idempotency: the result of %s is not stored: the store failed until the reservation could have expired", f.key)})
		f.c.kick(f.key)
	})
}

// unreserved is the flow of in-flight mode "run": read, run, write if
// absent; a collision adopts the winner's result.
func (f *flow[T]) unreserved(ctx context.Context) (Result[T], error) {
	rec, err := f.storeGet(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return Result[T]{}, ctx.Err()
		}
		return f.onStorageError(ctx, f.storageFailed(ctx, idemevent.ErrorStorageGet, idemevent.MethodGet, err))
	}
	if err := f.reuse(ctx, rec); err != nil {
		return Result[T]{}, err
	}
	w := idemstore.Write{State: idemstore.StateCompleted, Token: f.token, Fingerprint: f.fp, TTL: f.ttl}
	switch rec.State {
	case idemstore.StateNotReplayable:
		return Result[T]{}, f.notReplayable(ctx, rec)
	case idemstore.StateCompleted, idemstore.StateUnreadable:
		if f.readable(ctx, rec) {
			return f.hit(ctx)
		}
		w.Replace, w.ReplaceToken = true, rec.Token
	case idemstore.StatePending:
		f.observe(ctx, idemevent.Event{Kind: idemevent.InFlight, Mode: InFlightRun.String()})
	}
	f.observe(ctx, idemevent.Event{Kind: idemevent.Miss})
	if err := f.run(ctx); err != nil {
		return f.mine(), err
	}
	f.keep(ctx)
	w.State, w.Result = f.state, f.payload
	winner, written, err := f.storeReserve(context.WithoutCancel(ctx), w)
	switch {
	case err != nil:
		f.storageFailed(ctx, idemevent.ErrorStorageSave, idemevent.MethodReserve, err)
		return f.mine(), nil
	case written, f.ours(winner, f.state):
		f.observe(ctx, idemevent.Event{Kind: idemevent.Stored})
		return f.mine(), nil
	}
	return f.adopt(ctx, winner)
}

// adopt settles a run-mode collision: the winner's result if it is complete
// and ours to replay, otherwise our own.
func (f *flow[T]) adopt(ctx context.Context, winner idemstore.Record) (Result[T], error) {
	if winner.State != idemstore.StateCompleted {
		return f.mine(), nil
	}
	if f.reusedBy(winner) {
		f.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorKeyReuse,
			Err: fmt.Errorf("%w: a concurrent caller stored another request under %s; keeping our own result", ErrKeyReuse, f.key)})
		return f.mine(), nil
	}
	v, err := f.codec.Decode(winner.Result)
	if err != nil {
		return f.mine(), nil
	}
	f.stored = v
	return f.hit(ctx)
}
