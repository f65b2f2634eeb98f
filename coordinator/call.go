package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Call says which operation instance a call is and how long its result is
// kept.
type Call struct {
	// Operation names what the action does, e.g. "payment.charge": 1 to 100
	// bytes of [A-Za-z0-9._-]. The same key may be used under different
	// operations without colliding.
	Operation string
	// Key is the caller's idempotency key: 1 to 255 bytes of visible ASCII
	// (0x21-0x7E), used exactly as given. "" means no idempotency: the action
	// just runs.
	Key string
	// Fingerprint identifies the request, so that a key reused for a
	// different request is refused with ErrKeyReuse. Optional; Fingerprint
	// computes one. Compared only when both the stored and the new one are
	// set. At most 512 bytes of visible ASCII.
	Fingerprint string
	// TTL is how long the result is kept. 0 means the operation's TTL
	// (WithOperationTTLs), else the default (WithDefaultTTL). It is rounded
	// down to the millisecond and must lie within the TTL bounds
	// (WithTTLBounds); otherwise the call fails with ErrInvalidRequest.
	TTL time.Duration
}

// Codec encodes and decodes the results of Do. Decode failures are not
// outages: a stored result that Decode refuses is replaced by a fresh run of
// the action (the key heals).
type Codec[T any] interface {
	Encode(v T) ([]byte, error)
	Decode(data []byte) (T, error)
}

// JSONCodec is the default Codec: encoding/json.
type JSONCodec[T any] struct{}

// Encode returns the JSON encoding of v.
func (JSONCodec[T]) Encode(v T) ([]byte, error) { return json.Marshal(v) }

// Decode parses JSON data into a T. A stored JSON null decodes to T's zero
// value and is still a replay.
func (JSONCodec[T]) Decode(data []byte) (T, error) {
	var v T
	err := json.Unmarshal(data, &v)
	return v, err
}

// Result is what Coordinator.Execute returns.
type Result struct {
	// Value is the encoded result: the action's own, or the stored one.
	Value []byte
	// Replayed reports that Value is a stored result of an earlier (or a
	// concurrent) call, not the result of this call's action.
	Replayed bool
}

// Do runs action at most once per (call.Operation, call.Key) while the store
// is up, and returns its result to every call with the same key, encoded as
// JSON in between. See DoWithCodec for another encoding.
//
// Do returns the action's own error unchanged (and then stores nothing), or:
// an error matching ErrInvalidRequest when the call is invalid; ErrKeyReuse
// when the key was used for a request with another fingerprint;
// ErrInProgress when another caller holds the key and the in-flight mode
// says not to wait (or the wait bound passed); a *StorageError when the store
// failed before the action ran and the on-storage-error mode is "raise"; or
// the context's error when ctx ended before the action ran. Once the action
// has returned successfully, Do returns its result whatever the store does.
func Do[T any](ctx context.Context, c *Coordinator, call Call, action func(context.Context) (T, error)) (T, error) {
	return DoWithCodec(ctx, c, call, JSONCodec[T]{}, action)
}

// DoWithCodec is Do with codec in place of JSON.
func DoWithCodec[T any](ctx context.Context, c *Coordinator, call Call, codec Codec[T], action func(context.Context) (T, error)) (T, error) {
	a := &typedAction[T]{codec: codec, fn: action}
	res, err := c.execute(ctx, call, a)
	if err == nil && res.Replayed {
		return a.stored, nil
	}
	return a.own, err
}

// typedAction is the action of one Do call: one allocation for the action,
// its codec and both results, where closures would cost four.
type typedAction[T any] struct {
	codec       Codec[T]
	fn          func(context.Context) (T, error)
	own, stored T
}

func (a *typedAction[T]) run(ctx context.Context) ([]byte, error, error) {
	v, err := a.fn(ctx)
	a.own = v
	if err != nil {
		return nil, nil, err
	}
	b, encErr := safeEncode(a.codec, v)
	return b, encErr, nil
}

func (a *typedAction[T]) decode(b []byte) error {
	v, err := a.codec.Decode(b)
	if err != nil {
		return err
	}
	a.stored = v
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

// Execute is the byte-level form of Do: the action returns its encoded
// result, and Result.Replayed tells a replay from a fresh run (the HTTP
// middleware needs that for its replay header). Every stored result is
// replayed as it is; the errors are those of Do.
func (c *Coordinator) Execute(ctx context.Context, call Call, action func(context.Context) ([]byte, error)) (Result, error) {
	return c.execute(ctx, call, byteAction(action))
}

// byteAction is the action of Execute: every stored result is replayed.
type byteAction func(context.Context) ([]byte, error)

func (f byteAction) run(ctx context.Context) ([]byte, error, error) {
	b, err := f(ctx)
	return b, nil, err
}

func (byteAction) decode([]byte) error { return nil }

// Lease describes the reservation under which an action runs; see
// LeaseFromContext.
type Lease struct {
	// Key is the operation and key.
	Key Key
	// Token is the reservation's owner token: unique per reservation, so it
	// can serve as fencing information for an effect outside the store (a
	// downstream write that records and checks it).
	Token string
}

type leaseKey struct{}

// LeaseFromContext returns the lease under which the action running with ctx
// holds its key. It reports false for an action that runs without a
// reservation (in-flight mode "run", an unprotected run, an empty key, the
// kill switch).
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(Lease)
	return l, ok
}
