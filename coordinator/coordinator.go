package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Coordinator runs actions once per idempotency key. Create one with New and
// share it: it is safe for concurrent use, and callers in one process that
// wait on the same key share one poll loop.
type Coordinator struct {
	store Store
	cfg   config
	obs   Observer

	mu    sync.Mutex
	polls map[Key]*poll
	loops int        // running poll loops; guarded by mu
	idle  *sync.Cond // on mu: broadcast when loops drops to 0
}

// New returns a Coordinator over store. It returns an error, and no
// Coordinator, when store is nil, a mode is unknown, or a duration or limit
// makes no sense; the error says which.
func New(store Store, opts ...Option) (*Coordinator, error) {
	if store == nil {
		return nil, errors.New("idempotency: invalid coordinator configuration: store is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Coordinator{store: store, cfg: cfg, obs: cfg.observer, polls: make(map[Key]*poll)}
	c.idle = sync.NewCond(&c.mu)
	return c, nil
}

// Close waits until the poll loops that waiting callers shared have exited.
// A loop stops when its last waiter leaves, and exits once its read in flight
// returns, within one storage timeout; Close lets an application (the fx
// module does it on stop) or a test with goleak wait for that. It does not
// stop calls in progress, and the Coordinator stays usable. It returns nil.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.loops > 0 {
		c.idle.Wait()
	}
	return nil
}

// Enabled reports whether the coordinator protects calls (see WithEnabled).
func (c *Coordinator) Enabled() bool { return c.cfg.enabled }

// InFlight returns the in-flight mode.
func (c *Coordinator) InFlight() InFlightMode { return c.cfg.inFlight }

// OnStorageError returns the on-storage-error mode.
func (c *Coordinator) OnStorageError() StorageErrorMode { return c.cfg.onStorageError }

// Lease returns the reservation lease.
func (c *Coordinator) Lease() time.Duration { return c.cfg.lease }

// runner is a call's action: run runs it (payload is its encoded result,
// unstorable an error that keeps the payload from being stored, such as an
// encoding failure, err the action's own error); decode checks, and keeps, a
// stored result.
type runner interface {
	run(ctx context.Context) (payload []byte, unstorable, err error)
	decode(stored []byte) error
}

// maxRounds bounds the reserve loop: heals and takeovers that keep losing
// races end in ErrInProgress instead of looping.
const maxRounds = 64

func (c *Coordinator) execute(ctx context.Context, call Call, act runner) (Result, error) {
	if err := ValidateOperation(call.Operation); err != nil {
		return Result{}, err
	}
	if call.Key != "" {
		if err := ValidateKey(call.Key); err != nil {
			return Result{}, err
		}
	}
	if err := validateFingerprint(call.Fingerprint); err != nil {
		return Result{}, err
	}
	ttl, err := c.resolveTTL(call)
	if err != nil {
		return Result{}, err
	}
	if call.Key == "" || !c.cfg.enabled {
		payload, _, err := act.run(ctx)
		return Result{Value: payload}, err
	}
	key := Key{Operation: call.Operation, Key: call.Key}
	x := &exec{c: c, key: key, fp: call.Fingerprint, ttl: ttl, token: newToken(), act: act}
	if c.cfg.inFlight == InFlightRun {
		return x.unreserved(ctx)
	}
	return x.reserved(ctx)
}

func (c *Coordinator) resolveTTL(call Call) (time.Duration, error) {
	ttl := call.TTL
	switch {
	case ttl < 0:
		return 0, invalid("TTL %v is negative", ttl)
	case ttl == 0:
		if t, ok := c.cfg.operationTTLs[call.Operation]; ok {
			ttl = t
		} else {
			ttl = c.cfg.defaultTTL
		}
	}
	ttl = ttl.Truncate(time.Millisecond)
	if ttl < c.cfg.minTTL || ttl > c.cfg.maxTTL {
		return 0, invalid("TTL %v is outside [%v, %v]", call.TTL, c.cfg.minTTL, c.cfg.maxTTL)
	}
	return ttl, nil
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	var h [32]byte
	hex.Encode(h[:], b[:])
	return string(h[:])
}

// exec is the state of one protected call.
type exec struct {
	c     *Coordinator
	key   Key
	fp    string
	ttl   time.Duration
	token string
	act   runner
}

func (x *exec) observe(ctx context.Context, e Event) {
	e.Key = x.key
	x.c.obs.Observe(ctx, e)
}

// storageFailed reports a store failure and returns it as a *StorageError.
func (x *exec) storageFailed(ctx context.Context, t ErrorType, m Method, err error) *StorageError {
	se := asStorageError(m, err)
	x.observe(ctx, Event{Kind: EventError, ErrorType: t, Method: m, Err: se})
	return se
}

// reusedBy reports whether rec belongs to another request: both
// fingerprints are set and differ.
func (x *exec) reusedBy(rec Record) bool {
	return x.fp != "" && rec.Fingerprint != "" && x.fp != rec.Fingerprint
}

// ours reports whether rec is this call's own record in state st, written by
// a store call whose reply was lost (or that a client retried).
func (x *exec) ours(rec Record, st State) bool {
	return rec.State == st && rec.Token == x.token
}

// reuse returns a *KeyReuseError when rec belongs to another request.
func (x *exec) reuse(ctx context.Context, rec Record) error {
	if !x.reusedBy(rec) {
		return nil
	}
	err := &KeyReuseError{Key: x.key, Stored: rec.Fingerprint, Got: x.fp}
	x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorKeyReuse, Err: err})
	return err
}

// readable reports whether a completed record can be replayed, reporting a
// decode_error when it cannot.
func (x *exec) readable(ctx context.Context, rec Record) bool {
	var err error
	if rec.State == StateCompleted {
		if err = x.act.decode(rec.Result); err == nil {
			return true
		}
		err = fmt.Errorf("idempotency: stored result of %s cannot be decoded: %w", x.key, err)
	} else {
		err = fmt.Errorf("idempotency: record of %s cannot be read", x.key)
	}
	x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorDecode, Err: err})
	return false
}

func (x *exec) hit(ctx context.Context, rec Record) (Result, error) {
	x.observe(ctx, Event{Kind: EventHit})
	return Result{Value: rec.Result, Replayed: true}, nil
}

// reserved is the flow of in-flight modes "wait" and "raise".
func (x *exec) reserved(ctx context.Context) (Result, error) {
	c := x.c
	w := Write{State: StatePending, Token: x.token, Fingerprint: x.fp, TTL: c.cfg.lease}
	var deadline time.Time // of waiting; set when a holder is first seen
reserve:
	for range maxRounds {
		rec, written, err := x.storeReserve(ctx, w)
		if err != nil {
			if ctx.Err() != nil {
				// The caller hung up. The script may have run with its
				// reply lost: give the key back rather than leave it
				// reserved for a lease.
				x.release(ctx)
				return Result{}, ctx.Err()
			}
			se := x.storageFailed(ctx, ErrorStorageReserve, MethodReserve, err)
			if x.c.cfg.onStorageError == StorageErrorRaise && replyMayBeLost(err) {
				x.release(ctx)
			}
			return x.onStorageError(ctx, se)
		}
		if written || x.ours(rec, StatePending) {
			// The second case is our own reservation, met again because a
			// client retried the call after losing the first reply.
			return x.runReserved(ctx)
		}
		// Settle rec: the record Reserve found, then the one a wait ends on.
		for {
			if err := x.reuse(ctx, rec); err != nil {
				return Result{}, err
			}
			switch rec.State {
			case StateCompleted, StateUnreadable:
				if x.readable(ctx, rec) {
					return x.hit(ctx, rec)
				}
				// Heal: take the record over with a compare-and-swap on
				// its token, so that of many healers only one runs.
				w.Replace, w.ReplaceToken = true, rec.Token
				continue reserve
			case StatePending:
				if deadline.IsZero() {
					x.observe(ctx, Event{Kind: EventInFlight, Mode: c.cfg.inFlight})
					if c.cfg.inFlight == InFlightRaise {
						return Result{}, &InProgressError{Key: x.key, RetryAfter: rec.TTL}
					}
					deadline = time.Now().Add(c.cfg.waitTimeout)
					if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
						deadline = d
					}
				}
				next, err := x.wait(ctx, deadline, rec)
				if err != nil {
					var se *StorageError
					if errors.As(err, &se) {
						return x.onStorageError(ctx, se)
					}
					return Result{}, err
				}
				if next.State == StateAbsent {
					w.Replace, w.ReplaceToken = false, ""
					continue reserve // take over
				}
				rec = next
				continue
			}
			// StateAbsent from a Reserve that did not write: a store bug or
			// a race with expiry; try again.
			continue reserve
		}
	}
	return Result{}, &InProgressError{Key: x.key}
}

// onStorageError decides what a store failure before the action means.
func (x *exec) onStorageError(ctx context.Context, se *StorageError) (Result, error) {
	if x.c.cfg.onStorageError == StorageErrorRaise {
		return Result{}, se
	}
	x.observe(ctx, Event{Kind: EventUnprotected, Method: se.Method, Err: se})
	payload, unstorable, err := x.act.run(ctx)
	if err != nil {
		return Result{}, err
	}
	if x.storable(ctx, payload, unstorable) {
		// Best effort, and only where nobody else wrote: the store just
		// failed, and another caller may have reserved in the meantime.
		w := Write{State: StateCompleted, Token: x.token, Fingerprint: x.fp, Result: payload, TTL: x.ttl}
		rec, written, err := x.storeReserve(context.WithoutCancel(ctx), w)
		switch {
		case err != nil:
			x.storageFailed(ctx, ErrorStorageSave, MethodReserve, err)
		case written, x.ours(rec, StateCompleted):
			x.observe(ctx, Event{Kind: EventStored})
		case x.ours(rec, StatePending):
			// Our own reservation, made by the Reserve whose reply was
			// lost: complete it.
			if ok, err := x.storeComplete(context.WithoutCancel(ctx), payload); err != nil {
				x.storageFailed(ctx, ErrorStorageSave, MethodComplete, err)
			} else if ok {
				x.observe(ctx, Event{Kind: EventStored})
			}
			x.c.kick(x.key)
		}
	}
	return Result{Value: payload}, nil
}

// replyMayBeLost reports whether a failed store call may have been carried
// out with its reply lost: a timeout, as opposed to a refused connection.
func replyMayBeLost(err error) bool {
	var timeout interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &timeout) && timeout.Timeout()
}

// storable reports whether payload may be stored, reporting why not.
func (x *exec) storable(ctx context.Context, payload []byte, unstorable error) bool {
	var err error
	switch {
	case unstorable != nil:
		err = fmt.Errorf("idempotency: result of %s cannot be encoded: %w", x.key, unstorable)
	case len(payload) > x.c.cfg.maxResultBytes:
		err = fmt.Errorf("idempotency: result of %s is %d bytes, more than the limit of %d", x.key, len(payload), x.c.cfg.maxResultBytes)
	default:
		return true
	}
	x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorRecordValidation, Err: err})
	return false
}

// runReserved runs the action under this call's reservation.
func (x *exec) runReserved(ctx context.Context) (Result, error) {
	x.observe(ctx, Event{Kind: EventMiss})
	actx, cancel := context.WithCancelCause(context.WithValue(ctx, leaseKey{}, Lease{Key: x.key, Token: x.token}))
	defer cancel(nil)
	r := x.startRenewer(ctx, cancel)

	returned := false
	defer func() {
		if !returned { // the action panicked (or called runtime.Goexit)
			r.stop()
			x.release(ctx)
		}
	}()
	payload, unstorable, err := x.act.run(actx)
	returned = true
	lost := r.stop()

	if err != nil {
		x.release(ctx)
		return Result{}, err
	}
	if !x.storable(ctx, payload, unstorable) {
		x.release(ctx)
		return Result{Value: payload}, nil
	}
	if lost {
		return Result{Value: payload}, nil // reported by the renewer
	}
	ok, err := x.storeComplete(context.WithoutCancel(ctx), payload)
	switch {
	case err != nil:
		x.storageFailed(ctx, ErrorStorageSave, MethodComplete, err)
		x.release(ctx) // let waiters take over now rather than after the lease
	case !ok && x.completedByUs(ctx):
		// A client retried the call after losing the first reply.
		x.observe(ctx, Event{Kind: EventStored})
	case !ok:
		x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorLeaseLost,
			Err: fmt.Errorf("%w: %s was taken over before completion; the result is not stored", ErrLeaseLost, x.key)})
	default:
		x.observe(ctx, Event{Kind: EventStored})
	}
	x.c.kick(x.key)
	return Result{Value: payload}, nil
}

// completedByUs reports whether the key holds the result this call
// completed: a refused completion is checked before it is called a lost lease.
func (x *exec) completedByUs(ctx context.Context) bool {
	rec, err := x.storeGet(context.WithoutCancel(ctx))
	return err == nil && x.ours(rec, StateCompleted)
}

// release gives the reservation up, best effort.
func (x *exec) release(ctx context.Context) {
	if _, err := x.storeRelease(context.WithoutCancel(ctx)); err != nil {
		x.storageFailed(ctx, ErrorStorageRelease, MethodRelease, err)
	}
	x.c.kick(x.key)
}

// unreserved is the flow of in-flight mode "run".
func (x *exec) unreserved(ctx context.Context) (Result, error) {
	rec, err := x.storeGet(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		se := x.storageFailed(ctx, ErrorStorageGet, MethodGet, err)
		return x.onStorageError(ctx, se)
	}
	if err := x.reuse(ctx, rec); err != nil {
		return Result{}, err
	}
	w := Write{State: StateCompleted, Token: x.token, Fingerprint: x.fp, TTL: x.ttl}
	switch rec.State {
	case StateCompleted, StateUnreadable:
		if x.readable(ctx, rec) {
			return x.hit(ctx, rec)
		}
		w.Replace, w.ReplaceToken = true, rec.Token
	case StatePending:
		x.observe(ctx, Event{Kind: EventInFlight, Mode: InFlightRun})
	}
	x.observe(ctx, Event{Kind: EventMiss})
	payload, unstorable, err := x.act.run(ctx)
	if err != nil {
		return Result{}, err
	}
	own := Result{Value: payload}
	if !x.storable(ctx, payload, unstorable) {
		return own, nil
	}
	w.Result = payload
	winner, written, err := x.storeReserve(context.WithoutCancel(ctx), w)
	switch {
	case err != nil:
		x.storageFailed(ctx, ErrorStorageSave, MethodReserve, err)
		return own, nil
	case written, x.ours(winner, StateCompleted):
		x.observe(ctx, Event{Kind: EventStored})
		return own, nil
	}
	// A collision: adopt the winner's result if it is complete and ours to
	// replay; otherwise keep our own.
	if winner.State != StateCompleted {
		return own, nil
	}
	if x.reusedBy(winner) {
		x.observe(ctx, Event{Kind: EventError, ErrorType: ErrorKeyReuse,
			Err: fmt.Errorf("%w: a concurrent caller stored another request under %s; keeping our own result", ErrKeyReuse, x.key)})
		return own, nil
	}
	if x.act.decode(winner.Result) != nil {
		return own, nil
	}
	return x.hit(ctx, winner)
}
