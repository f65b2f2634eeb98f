package coordinator

import (
	"context"
	"encoding/json"
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
	// (0x21-0x7E), used exactly as given. "" is invalid (ErrInvalidRequest):
	// a caller without a key does not call Do, so that a key lost on its way
	// (an empty header, message ID or attribute) cannot silently turn the
	// protection off.
	Key string
	// Fingerprint identifies the request, so that a key reused for a
	// different request is refused with ErrKeyReuse. Optional; Fingerprint
	// computes one. Compared only when both the stored and the new one are
	// set. At most 512 bytes of visible ASCII.
	Fingerprint string
	// TTL is how long the result is kept, unless the operator set a TTL for
	// the operation (WithOperationTTLs, IDEMPOTENCY_OPERATION_TTLS), which
	// wins. 0 means the default (WithDefaultTTL). It is rounded down to the
	// millisecond and must lie within the TTL bounds (WithMinTTL,
	// WithMaxTTL); otherwise the call fails with ErrInvalidRequest.
	TTL time.Duration
}

// Codec encodes and decodes the results of Do. Decode failures are not
// outages: a stored result that Decode refuses is replaced by a fresh run of
// the action (the key heals). An Encode that fails or panics keeps the key
// as not replayable: the action does not run again (see ErrNotReplayable).
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

// RawCodec is the Codec of byte results: it stores them as they are and
// replays every stored result. Coordinator.Execute uses it.
type RawCodec struct{}

// Encode returns v itself.
func (RawCodec) Encode(v []byte) ([]byte, error) { return v, nil }

// Decode returns data itself.
func (RawCodec) Decode(data []byte) ([]byte, error) { return data, nil }

// Result is a call's result and whether it was replayed; DoResult,
// DoWithCodec and Coordinator.Execute return it.
type Result[T any] struct {
	// Value is the result: the action's own, or the stored one decoded.
	Value T
	// Replayed reports that Value is the stored result of an earlier (or a
	// concurrent) call, not the result of this call's action. In the
	// in-flight modes "wait" and "raise" it also means that this call's
	// action did not run. In mode "run" a call may run its action and still
	// return a concurrent caller's stored result (it adopts the winner's):
	// Replayed is then true although the action ran.
	Replayed bool
}

// Do runs action at most once per (call.Operation, call.Key) while the store
// is up, and returns its result to every call with the same key, encoded as
// JSON in between. DoResult also says whether the result was replayed;
// DoWithCodec takes another encoding.
//
// Do returns the action's own error unchanged (and then stores nothing), or:
// an error matching ErrInvalidRequest when the call is invalid; ErrKeyReuse
// when the key was used for a request with another fingerprint;
// ErrInProgress when another caller holds the key and the in-flight mode
// says not to wait (or the wait bound passed); a *NotReplayableError when the
// key's action completed before with a result that could not be kept (too
// large, or Encode failed); a *StorageError when the store
// failed before the action ran and the on-storage-error mode is "raise"; or
// the context's error when ctx ended before the action ran. Once the action
// has returned successfully, Do returns its result whatever the store does.
// The flow step by step, and why, is in docs/architecture.md.
func Do[T any](ctx context.Context, c *Coordinator, call Call, action func(context.Context) (T, error)) (T, error) {
	res, err := DoWithCodec(ctx, c, call, JSONCodec[T]{}, action)
	return res.Value, err
}

// DoResult is Do that also reports, in Result.Replayed, whether the value is
// a stored result rather than this call's own.
func DoResult[T any](ctx context.Context, c *Coordinator, call Call, action func(context.Context) (T, error)) (Result[T], error) {
	return DoWithCodec(ctx, c, call, JSONCodec[T]{}, action)
}

// DoWithCodec is DoResult with codec in place of JSON. When the action
// fails, Result.Value is the value it returned with its error. A nil action
// or codec is an invalid request.
func DoWithCodec[T any](ctx context.Context, c *Coordinator, call Call, codec Codec[T], action func(context.Context) (T, error)) (Result[T], error) {
	switch {
	case action == nil:
		return Result[T]{}, invalid("action is nil")
	case codec == nil:
		return Result[T]{}, invalid("codec is nil")
	}
	return do(ctx, c, call, codec, action)
}

// Execute is the byte-level form of DoResult: the action returns its encoded
// result, and every stored result is replayed as it is (RawCodec). The
// errors are those of Do.
func (c *Coordinator) Execute(ctx context.Context, call Call, action func(context.Context) ([]byte, error)) (Result[[]byte], error) {
	return DoWithCodec(ctx, c, call, RawCodec{}, action)
}

// Reservation describes the reservation under which an action runs; see
// ReservationFromContext.
type Reservation struct {
	// Operation is the call's operation.
	Operation string
	// Key is the call's idempotency key.
	Key string
	// Token is the reservation's owner token: unique per reservation, so it
	// can serve as fencing information for an effect outside the store (a
	// downstream write that records and checks it).
	Token string
	// Fence is the reservation's fence when its operation is fenced
	// (WithFencedOperations), else 0: greater than the fence of every
	// earlier reservation of the key, so a downstream write that stores it
	// and refuses a smaller one refuses a holder whose lease has passed on.
	Fence uint64
}

type reservationKey struct{}

// ReservationFromContext returns the reservation under which the action
// running with ctx holds its key. It reports false for an action that runs
// without a reservation (in-flight mode "run", an unprotected run, the kill
// switch).
func ReservationFromContext(ctx context.Context) (Reservation, bool) {
	r, ok := ctx.Value(reservationKey{}).(Reservation)
	return r, ok
}
