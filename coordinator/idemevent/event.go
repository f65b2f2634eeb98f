// Package idemevent holds what the coordinator reports as it works, for
// the writers of observers: the Observer interface, the Event it receives,
// and the bounded sets of kinds, error types, store methods and wait
// outcomes that metrics use as labels. An application hands an Observer to
// coordinator.WithObserver; the package observability turns events into
// Prometheus metrics and zap log lines, and idemotel into spans.
package idemevent

import (
	"context"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// Observer receives the coordinator's events. Observe is called
// synchronously, from many goroutines at once, so it must be safe for
// concurrent use and quick. Most events come on the caller's goroutine; a
// renewal's events come from the call's renewer, and a shared poll loop's from
// that loop, with the context of the waiter that started it. One call may
// report several outcomes: a waiter reports in_flight, then hit (or miss when
// it takes over); a run-mode call that adopts a concurrent result reports
// miss, then hit; an unprotected run reports unprotected, not miss. The package observability turns
// events into Prometheus metrics and zap log lines; NopObserver discards them.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// NopObserver is an Observer that does nothing; it is the default.
type NopObserver struct{}

// Observe does nothing.
func (NopObserver) Observe(context.Context, Event) {}

// Kind says what happened.
type Kind uint8

// The events the coordinator reports. Each names the fields of Event it sets
// beyond Kind and Key.
const (
	// Hit: a completed record was replayed. Every replay reports one.
	Hit Kind = iota + 1
	// Miss: the action is about to run under this caller's reservation
	// (or, in in-flight mode "run", without one).
	Miss
	// InFlight: another caller holds the key (a collision). Mode is the
	// in-flight mode that decides what happens next.
	InFlight
	// Waited: a caller stopped waiting for another caller's result.
	// Duration is the time spent waiting; Outcome says how it ended.
	Waited
	// Error: something went wrong. ErrorType classifies it; Err is the
	// error; Method is set for storage errors.
	Error
	// StorageCall: one store call ended. Method and Duration are set; Err
	// is its error or nil.
	StorageCall
	// Stored: the action's result was stored.
	Stored
	// Unprotected: the action runs without protection because the store
	// failed and the on-storage-error mode is "run" (Method is the failed call
	// and Err its error), or because the caller had no key and ran it
	// without calling coordinator.Do (Method is MethodNone; the library's
	// adapters report it).
	Unprotected
	// NotReplayable: the key's action completed but its result could
	// not be kept, so the call got a *coordinator.NotReplayableError (Err) instead of a
	// replay or a second run.
	NotReplayable
	// BulkHit: a batch call (coordinator.DoBatch) replayed Count keys of the
	// operation Key.Operation (Key.Key is ""), the seed's bulk hit. Each
	// replay also reports its own Hit.
	BulkHit
	// BulkMiss: a batch call ran the actions of Count keys of the
	// operation Key.Operation under its reservations, the seed's bulk miss.
	// Each also reports its own Miss.
	BulkMiss
)

// String returns the event's name, e.g. "hit".
func (k Kind) String() string {
	switch k {
	case Hit:
		return "hit"
	case Miss:
		return "miss"
	case InFlight:
		return "in_flight"
	case Waited:
		return "waited"
	case Error:
		return "error"
	case StorageCall:
		return "storage_call"
	case Stored:
		return "stored"
	case Unprotected:
		return "unprotected"
	case NotReplayable:
		return "not_replayable"
	case BulkHit:
		return "bulk_hit"
	case BulkMiss:
		return "bulk_miss"
	default:
		return "unknown"
	}
}

// ErrorType classifies an Error. The names are those the Python
// idempotency-kit uses, so dashboards carry over; the set is fixed, which
// makes it a bounded metric label.
type ErrorType string

// The error types.
const (
	ErrorStorageGet       ErrorType = "storage_get_error"
	ErrorStorageReserve   ErrorType = "storage_reserve_error"
	ErrorStorageSave      ErrorType = "storage_save_error"
	ErrorStorageRelease   ErrorType = "storage_release_error"
	ErrorStorageRenew     ErrorType = "storage_renew_error"
	ErrorRecordValidation ErrorType = "record_validation_error" // a result that cannot be kept (unencodable or too large): stored as not replayable
	ErrorDecode           ErrorType = "decode_error"            // a record that cannot be read: corrupt, or the codec cannot decode it
	ErrorKeyReuse         ErrorType = "key_reuse"
	ErrorLeaseLost        ErrorType = "lease_lost"
)

// ErrorTypes lists every ErrorType, for pre-initialising metrics.
func ErrorTypes() []ErrorType {
	return []ErrorType{ErrorStorageGet, ErrorStorageReserve, ErrorStorageSave, ErrorStorageRelease,
		ErrorStorageRenew, ErrorRecordValidation, ErrorDecode, ErrorKeyReuse, ErrorLeaseLost}
}

// Method names an idemstore.Store method, as a bounded metric label.
type Method string

// The store methods.
const (
	MethodReserve  Method = "reserve"
	MethodGet      Method = "get"
	MethodComplete Method = "complete"
	MethodRelease  Method = "release"
	MethodRenew    Method = "renew"
	// MethodReserveMany and MethodCompleteMany are the bulk calls of a
	// batch (coordinator.DoBatch, idemstore.BulkStore).
	MethodReserveMany  Method = "reserve_many"
	MethodCompleteMany Method = "complete_many"
	// MethodNone is no store method: on an Unprotected it means the
	// caller had no key, so the store was never called (an adapter let the
	// request through without one). It is not among Methods.
	MethodNone Method = "none"
)

// Methods lists every Method, for pre-initialising metrics.
func Methods() []Method {
	return []Method{MethodReserve, MethodGet, MethodComplete, MethodRelease, MethodRenew, MethodReserveMany, MethodCompleteMany}
}

// WaitOutcome says how a wait for another caller's result ended.
type WaitOutcome string

// The wait outcomes.
const (
	WaitHit      WaitOutcome = "hit"       // the holder completed; its result is replayed
	WaitTakeover WaitOutcome = "takeover"  // the reservation disappeared; this caller reserved and runs
	WaitTimeout  WaitOutcome = "timeout"   // the wait bound passed: coordinator.ErrInProgress
	WaitCanceled WaitOutcome = "canceled"  // the caller's context ended
	WaitError    WaitOutcome = "error"     // the store failed while polling
	WaitReuse    WaitOutcome = "key_reuse" // the holder completed another request's key: ErrKeyReuse
)

// WaitOutcomes lists every WaitOutcome, for pre-initialising metrics.
func WaitOutcomes() []WaitOutcome {
	return []WaitOutcome{WaitHit, WaitTakeover, WaitTimeout, WaitCanceled, WaitError, WaitReuse}
}

// Event is one thing the coordinator reports. Fields that do not apply to
// Kind are zero.
type Event struct {
	Kind Kind
	// Key is the operation and key of the call. Observers must not use the
	// key as a metric label (it is unbounded); they may log it.
	Key idemstore.Key
	// Mode is the in-flight mode (wait, raise or run:
	// coordinator.InFlightMode), for InFlight.
	Mode string
	// ErrorType classifies an Error.
	ErrorType ErrorType
	// Method is the store method, for StorageCall, storage errors and
	// Unprotected.
	Method Method
	// Duration is the call's or the wait's duration.
	Duration time.Duration
	// Outcome is how a wait ended, for Waited.
	Outcome WaitOutcome
	// Err is the error, for Error and a failed StorageCall.
	Err error
	// Count is the number of keys, for BulkHit and BulkMiss.
	Count int
}
