package coordinator

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
	"unsafe"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// newToken gives the call its owner token: 64 random bits, hex encoded.
// What a token must be is unique among the reservations of one key that can
// exist at once (two callers that held one key with equal tokens could act
// on each other's reservation): with 64 random bits the chance of that is
// 2^-64 per pair of callers of a key. The bits come from math/rand/v2's
// global generator, ChaCha8 seeded from the operating system for each thread
// of the runtime: far cheaper than crypto/rand, and unpredictable enough for
// a value that only ever identifies a reservation to the store. A store
// keeps it in 8 bytes (redisrepo packs hex). The token's bytes live in the
// call's state (the flow, already allocated): no allocation of its own.
func (x *exec) newToken() {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	hex.Encode(x.tok[:], b[:])
	x.token = unsafe.String(&x.tok[0], len(x.tok))
}

// exec is the part of a protected call that does not depend on its result
// type: the key, the reservation's token, the store calls and the events.
type exec struct {
	c     *Coordinator
	key   idemstore.Key
	fp    string
	ttl   time.Duration
	token string          // the owner token: tok's bytes
	tok   [16]byte        // never changed after newToken
	state idemstore.State // what the action's record becomes: completed, or not replayable
	// fenced says that the operation's reservations carry a fence
	// (WithFencedOperations); fence is the one of this call's reservation.
	fenced bool
	fence  uint64
}

func (x *exec) observe(ctx context.Context, e idemevent.Event) {
	e.Key = x.key
	x.c.obs.Observe(ctx, e)
}

// storageFailed reports a store failure and returns it as a *StorageError.
func (x *exec) storageFailed(ctx context.Context, t idemevent.ErrorType, m idemevent.Method, err error) *StorageError {
	se := asStorageError(m, x.key, err)
	x.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: t, Method: m, Err: se})
	return se
}

// reusedBy reports whether rec belongs to another request: both
// fingerprints are set and differ.
func (x *exec) reusedBy(rec idemstore.Record) bool {
	return x.fp != "" && rec.Fingerprint != "" && x.fp != rec.Fingerprint
}

// ours reports whether rec is this call's own record in state st, written by
// a store call whose reply was lost (or that a client retried).
func (x *exec) ours(rec idemstore.Record, st idemstore.State) bool {
	return rec.State == st && rec.Token == x.token
}

// reuse returns a *KeyReuseError when rec belongs to another request.
func (x *exec) reuse(ctx context.Context, rec idemstore.Record) error {
	if !x.reusedBy(rec) {
		return nil
	}
	err := &KeyReuseError{Operation: x.key.Operation, Key: x.key.Key, Stored: rec.Fingerprint, Got: x.fp}
	x.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorKeyReuse, Err: err})
	return err
}

// inProgress is the error for a key that another caller holds.
func (x *exec) inProgress(retryAfter time.Duration) *InProgressError {
	if retryAfter <= 0 {
		retryAfter = x.c.cfg.lease
	}
	return &InProgressError{Operation: x.key.Operation, Key: x.key.Key, RetryAfter: retryAfter}
}

// release gives the reservation up, best effort.
func (x *exec) release(ctx context.Context) {
	if _, err := x.storeRelease(context.WithoutCancel(ctx)); err != nil {
		x.storageFailed(ctx, idemevent.ErrorStorageRelease, idemevent.MethodRelease, err)
	}
	x.c.kick(x.key)
}

// maxCleanups bounds the background releases of refused calls in flight
// at once; see releaseLater.
const maxCleanups = 8

// releaseLater gives up, in the background, a reservation that a refused
// Reserve may have made with its reply lost, so that the refused call
// returns within one storage timeout. Such a release is only a courtesy: a
// reservation it misses expires with its lease. When the store is
// struggling, every timed-out Reserve would add a release that times out on
// the same store, so at most maxCleanups run at once and the rest are
// dropped (reported as storage_release_error): bounded load, at the cost of
// a key that may stay held for one lease.
func (x *exec) releaseLater(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	c := x.c
	c.mu.Lock()
	full := c.cleanups >= maxCleanups
	if !full {
		c.cleanups++
		c.backgroundLocked(func() {
			defer func() {
				c.mu.Lock()
				c.cleanups--
				c.mu.Unlock()
			}()
			x.release(ctx)
		})
	}
	c.mu.Unlock()
	if full {
		x.observe(ctx, idemevent.Event{Kind: idemevent.Error, ErrorType: idemevent.ErrorStorageRelease, Method: idemevent.MethodRelease,
			Err: fmt.Errorf("idempotency: release of %s after a refused reserve dropped: %d releases are already in flight; a reservation the reserve made expires with its lease", x.key, maxCleanups)})
	}
}

// completedByUs reports whether the key holds the result this call
// completed: a refused completion is checked before it is called a lost
// lease. The error is the read's, when the store could not say.
func (x *exec) completedByUs(ctx context.Context) (bool, error) {
	rec, err := x.storeGet(context.WithoutCancel(ctx))
	return err == nil && x.ours(rec, x.state), err
}

// notReplayable returns the error for a key whose action completed with a
// result that could not be kept, and reports it.
func (x *exec) notReplayable(ctx context.Context, rec idemstore.Record) error {
	err := &NotReplayableError{Operation: x.key.Operation, Key: x.key.Key, Reason: string(rec.Result)}
	x.observe(ctx, idemevent.Event{Kind: idemevent.NotReplayable, Err: err})
	return err
}

// replyMayBeLost reports whether a failed store call may have been carried
// out with its reply lost: a timeout, as opposed to a refused connection.
func replyMayBeLost(err error) bool {
	var timeout interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &timeout) && timeout.Timeout()
}
