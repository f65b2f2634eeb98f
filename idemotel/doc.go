// Package idemotel records the events of the idempotency coordinator on
// OpenTelemetry spans: what became of each call (replayed, run, waited for,
// run unprotected), its store calls, and its errors, on the span of the
// call's context — typically the server span of otelhttp or otelgrpc, or a
// span of the caller's own.
//
// An Observer implements idemevent.Observer. Build one with New and hand it
// to the coordinator, beside the metrics and logs of package observability if
// you like:
//
//	obs, err := observability.New(observability.WithRegisterer(reg), observability.WithLogger(logger))
//	if err != nil {
//		return err
//	}
//	c, err := coordinator.New(store, coordinator.WithObserver(observability.Multi(obs, idemotel.New())))
//
// The fx module idempotency.Module does this itself, with the graph's
// trace.TracerProvider or the global one (see idempotency.Module).
//
// # Attributes and events
//
// On the caller's span, set by the events that decide a call's outcome (hit,
// miss, in_flight, unprotected, not_replayable; a later one replaces an
// earlier one, so a waiter that got the result ends with outcome hit):
//
//	idempotency.operation      string  the call's operation
//	idempotency.key_hash       string  the key's hash, as in the log lines (not with WithKeyHash(false))
//	idempotency.outcome        string  hit | miss | in_flight | unprotected | not_replayable
//	idempotency.replayed       bool    true when a stored result was replayed
//	idempotency.wait.outcome   string  hit | takeover | timeout | canceled | error | key_reuse (after a wait)
//	idempotency.wait.duration  double  seconds spent waiting (after a wait)
//
// One span event per coordinator event, named idempotency.<kind>, each with
// idempotency.operation and idempotency.key_hash, and:
//
//	idempotency.hit, idempotency.miss, idempotency.stored   nothing more
//	idempotency.in_flight     idempotency.in_flight.mode (wait | raise | run)
//	idempotency.waited        idempotency.wait.outcome, idempotency.wait.duration
//	idempotency.unprotected   idempotency.storage.method (the failed call, or none: no key)
//	idempotency.not_replayable  exception.type, exception.message (the key hidden): the key's
//	                          action completed, its result was not kept, the call got ErrNotReplayable
//	idempotency.error         idempotency.error_type, idempotency.storage.method (storage errors),
//	                          exception.type, exception.message (the key hidden)
//	idempotency.storage_call  idempotency.storage.method, idempotency.storage.duration (seconds),
//	                          idempotency.storage.result (ok | error | timeout | canceled)
//
// The values are those of the metrics' labels (idemevent.ErrorTypes,
// idemevent.Methods, idemevent.WaitOutcomes, and the storage histogram's result label).
//
// # Store spans
//
// With WithStoreSpans(true), a store call is a child span of the caller's
// span instead of an idempotency.storage_call event: named
// "idempotency.store <method>", of kind internal, with the operation, key
// hash, idempotency.storage.method and idempotency.storage.result. The
// Observer learns of a store call only when it has ended, so the span is
// made afterwards, with the start and end times of the call: it begins
// Event.Duration before the event and ends at it. A failed call's span has
// status Error and the error message (the key hidden) as its description.
//
// # Span status
//
// Observe never sets the status of the caller's span. That span belongs to
// the caller, and what fails the call reaches the caller as an error
// (coordinator.ErrInProgress, coordinator.ErrKeyReuse, a *StorageError in
// on-storage-error mode raise), which its instrumentation records: otelhttp
// and otelgrpc set the status from the response. The other errors are
// handled by the coordinator — a storage error in mode run is followed by an
// unprotected run that succeeds, a failed save still returns the result, a
// failed renewal is retried — and an Error status would count a call that
// succeeded as failed. They are recorded as idempotency.error events, which
// trace backends show and can search. Only the store spans, which are the
// Observer's own, get status Error.
//
// # Keys
//
// The key is never recorded. Its hash is, as idempotency.key_hash: the first
// 16 hex digits of its SHA-256, the key_hash of the log lines, so a span and the log lines of one key can be
// found together. Error messages, which often name the key, are recorded
// with it replaced by "<key HASH>", as in the logs.
// WithKeyHash(false) records neither: the messages then say "<key>".
//
// # Context and concurrency
//
// Observe reads the span of the context it is given and records nothing when
// that span does not record: when the caller has no span (a non-recording
// span then stands in), when it was not sampled, and when it has ended.
// The last case matters: the coordinator reports some events after the call
// returned, on the call's context — a result saved in the background after a
// store failure, and its storage calls — and the caller has usually ended
// its span by then, so those are dropped. A renewal's events come from
// another goroutine, with the call's context, while the call runs; spans are
// safe for concurrent use, so they land on the caller's span like the others.
package idemotel
