package coordinator

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// Errors returned by Do, DoResult, DoWithCodec and Coordinator.Execute. Test them with errors.Is; the
// typed errors below carry more detail for errors.As. The action's own errors
// are returned unchanged and never match these.
var (
	// ErrInvalidRequest is returned when the operation, key, fingerprint or
	// TTL of a Call is invalid, or the action or codec is nil. The store was
	// not touched and the action did not run. Use errors.As with
	// *InvalidRequestError for the reason alone. HTTP 400.
	ErrInvalidRequest = errors.New("idempotency: invalid request")

	// ErrInProgress is returned when another caller holds the key: at once in
	// in-flight mode "raise", and after the wait bound in mode "wait". The
	// action did not run. HTTP 409.
	ErrInProgress = errors.New("idempotency: request in progress")

	// ErrKeyReuse is returned when the key was used before for a request with
	// another fingerprint. The action did not run. Use errors.As with
	// *KeyReuseError for both fingerprints. HTTP 422.
	ErrKeyReuse = errors.New("idempotency: key reused for a different request")

	// ErrStorage matches every *StorageError. Out of Do it means the store
	// failed, on-storage-error mode is "raise", and the action did not run.
	// HTTP 503.
	ErrStorage = errors.New("idempotency: storage failure")

	// ErrNotReplayable is returned when the key's action completed before
	// but its result could not be kept (too large, not encodable, streamed):
	// the action did not run again, and there is no result to return. Use
	// errors.As with *NotReplayableError for the reason.
	ErrNotReplayable = errors.New("idempotency: completed, result not replayable")

	// ErrConflict matches a store error that says a concurrent transaction
	// got in the way (a serialization failure, a deadlock) and went on doing
	// so through the store's retries within the storage timeout. It is not
	// an outage: another holder of the key is at work, so the action does
	// not run whatever the on-storage-error mode is, and the call returns a
	// *StorageError that matches both ErrStorage and ErrConflict.
	ErrConflict = errors.New("idempotency: storage conflict")

	// ErrMisconfigured matches a store error that the store answered with
	// because of how it is set up, not because it is down: a statement that
	// a connection pooler runs on the wrong server connection, a permission
	// the store lacks. Like ErrConflict it never runs the action
	// unprotected, whatever the on-storage-error mode is: the call returns a
	// *StorageError that matches both ErrStorage and ErrMisconfigured.
	ErrMisconfigured = errors.New("idempotency: storage misconfigured")

	// ErrLeaseLost is the cause with which the action's context is cancelled
	// when the coordinator learns that the reservation now belongs to another
	// caller or is gone (see context.Cause).
	ErrLeaseLost = errors.New("idempotency: lease lost")
)

// KeyReuseError is the error returned when a key is reused for a request with
// another fingerprint. It matches ErrKeyReuse.
type KeyReuseError struct {
	// Operation is the call's operation.
	Operation string
	// Key is the reused idempotency key.
	Key string
	// Stored is the fingerprint stored with the key.
	Stored string
	// Got is the fingerprint of the refused call.
	Got string
}

// Error implements error.
func (e *KeyReuseError) Error() string {
	return fmt.Sprintf("idempotency: key %q of operation %q reused for a different request (stored fingerprint %q, got %q)",
		e.Key, e.Operation, e.Stored, e.Got)
}

// Is reports whether target is ErrKeyReuse.
func (e *KeyReuseError) Is(target error) bool { return target == ErrKeyReuse }

// NotReplayableError is the error returned for a key whose action completed
// with a result that could not be kept. It matches ErrNotReplayable.
type NotReplayableError struct {
	// Operation is the call's operation.
	Operation string
	// Key is the idempotency key.
	Key string
	// Reason says why the result was not kept, e.g. "the result is 2097152
	// bytes, more than the limit of 1048576".
	Reason string
}

// Error implements error.
func (e *NotReplayableError) Error() string {
	return fmt.Sprintf("idempotency: key %q of operation %q completed, but its result cannot be returned: %s", e.Key, e.Operation, e.Reason)
}

// Is reports whether target is ErrNotReplayable.
func (e *NotReplayableError) Is(target error) bool { return target == ErrNotReplayable }

// InProgressError is the error returned when another caller holds the key.
// It matches ErrInProgress.
type InProgressError struct {
	// Operation is the call's operation.
	Operation string
	// Key is the idempotency key that another caller holds.
	Key string
	// RetryAfter is a hint for when the holder's lease expires: the
	// remaining time to live the store reported for its record, or, when the
	// store does not report one (redisrepo does not, to save a command), the
	// coordinator's lease, which a live holder with the same settings keeps
	// renewing: an upper bound.
	RetryAfter time.Duration
}

// Error implements error.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("idempotency: key %q of operation %q is in progress", e.Key, e.Operation)
}

// Is reports whether target is ErrInProgress.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// StorageError is a failure of the store. It matches ErrStorage, and unwraps
// to the store's own error. A store may return one itself; any other error a
// store returns is wrapped in one by the coordinator, which also fills in the
// method, operation and key that a store's own StorageError leaves empty.
type StorageError struct {
	// Method is the store method that failed.
	Method idemevent.Method
	// Operation is the operation of the call whose store call failed.
	Operation string
	// Key is the idempotency key of that call.
	Key string
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *StorageError) Error() string {
	if e.Operation == "" && e.Key == "" {
		return fmt.Sprintf("idempotency: storage %s: %v", e.Method, e.Err)
	}
	return fmt.Sprintf("idempotency: storage %s of %s:%s: %v", e.Method, e.Operation, e.Key, e.Err)
}

// Unwrap returns the underlying error.
func (e *StorageError) Unwrap() error { return e.Err }

// Is reports whether target is ErrStorage.
func (e *StorageError) Is(target error) bool { return target == ErrStorage }

// asStorageError returns err as a *StorageError of method m on key k,
// filling in what a store's own *StorageError leaves empty.
func asStorageError(m idemevent.Method, k idemstore.Key, err error) *StorageError {
	var se *StorageError
	if !errors.As(err, &se) {
		return &StorageError{Method: m, Operation: k.Operation, Key: k.Key, Err: err}
	}
	if se.Method != "" && se.Operation != "" {
		return se
	}
	out := *se
	if out.Method == "" {
		out.Method = m
	}
	if out.Operation == "" {
		out.Operation, out.Key = k.Operation, k.Key
	}
	return &out
}

// answered reports whether err is a store error that the store answered
// with (ErrConflict, ErrMisconfigured): not an outage, so never a reason to
// run the action unprotected (docs/architecture.md, "When the store fails").
func answered(err error) bool {
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrMisconfigured)
}

// InvalidRequestError is the error returned for an invalid Call or action.
// It matches ErrInvalidRequest.
type InvalidRequestError struct {
	// Reason says what is invalid, e.g. "key is empty", without the
	// "idempotency: invalid request: " that Error puts before it.
	Reason string
}

// Error implements error: "idempotency: invalid request: " and the reason.
func (e *InvalidRequestError) Error() string { return ErrInvalidRequest.Error() + ": " + e.Reason }

// Is reports whether target is ErrInvalidRequest.
func (e *InvalidRequestError) Is(target error) bool { return target == ErrInvalidRequest }

func invalid(format string, args ...any) error {
	return &InvalidRequestError{Reason: fmt.Sprintf(format, args...)}
}

// reason returns what an error of ValidateKey or ValidateOperation says is
// invalid, or err's whole message for any other error.
func reason(err error) string {
	var ir *InvalidRequestError
	if errors.As(err, &ir) {
		return ir.Reason
	}
	return err.Error()
}
