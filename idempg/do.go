package idempg

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
)

// Do runs action exactly once per (call.Operation, call.Key) for the writes
// it makes through tx, and returns its result to every call with the same
// key, encoded as JSON in between. It is coordinator.Do with the claim's
// transaction handed to the action: c is the coordinator over a Store (the
// one the fx module provides, or coordinator.New over New's Store), and
// the call follows c's settings and reports to its observer like any other.
// DoResult also says whether the result was replayed; DoWithCodec takes
// another encoding.
//
// The action's writes through tx and the completed record commit in one
// transaction, or neither does (package documentation, "The transactional
// call"). Do returns the action's own error unchanged, after rolling the
// transaction back; the errors of coordinator.Do otherwise, where a
// *coordinator.StorageError means that nothing committed, or, for a
// COMMIT whose answer was lost, that a retry replays or runs once. An
// invalid call, a nil action, or a coordinator whose store is not a Store
// is coordinator.ErrInvalidRequest.
func Do[T any](ctx context.Context, c *coordinator.Coordinator, call coordinator.Call, action func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	res, err := DoWithCodec(ctx, c, call, coordinator.JSONCodec[T]{}, action)
	return res.Value, err
}

// DoResult is Do that also reports, in Result.Replayed, whether the value is
// a stored result rather than this call's own.
func DoResult[T any](ctx context.Context, c *coordinator.Coordinator, call coordinator.Call, action func(ctx context.Context, tx pgx.Tx) (T, error)) (coordinator.Result[T], error) {
	return DoWithCodec(ctx, c, call, coordinator.JSONCodec[T]{}, action)
}

// DoWithCodec is DoResult with codec in place of JSON. When the action
// fails, Result.Value is the value it returned with its error. A nil
// coordinator, action or codec is an invalid request.
func DoWithCodec[T any](ctx context.Context, c *coordinator.Coordinator, call coordinator.Call, codec coordinator.Codec[T], action func(ctx context.Context, tx pgx.Tx) (T, error)) (coordinator.Result[T], error) {
	switch {
	case c == nil:
		return coordinator.Result[T]{}, &coordinator.InvalidRequestError{Reason: "coordinator is nil"}
	case action == nil:
		return coordinator.Result[T]{}, &coordinator.InvalidRequestError{Reason: "action is nil"}
	}
	return coordinator.DoWithCodec(ctx, c, call, codec, func(ctx context.Context) (T, error) {
		tx, ok := Tx(ctx)
		if !ok {
			var zero T
			return zero, &coordinator.InvalidRequestError{Reason: "the coordinator's store is not an *idempg.Store: the transactional call needs the PostgreSQL store"}
		}
		return action(ctx, tx)
	})
}
