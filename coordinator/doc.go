// Package coordinator makes an operation run once per idempotency key.
//
// A caller hands the Coordinator an operation name, a key and an action. The
// coordinator reserves the key in a store (one round trip that also returns an
// existing record), runs the action while a renewer keeps the reservation's
// lease, stores the result if the reservation is still its own, and hands the
// same result to every later call with the same key:
//
//	charge, err := coordinator.Do(ctx, c, coordinator.Call{
//		Operation:   "payment.charge",
//		Key:         key,
//		Fingerprint: fp,
//	}, func(ctx context.Context) (Charge, error) {
//		return provider.Charge(ctx, amount)
//	})
//
// A second caller that arrives while the first runs waits for its result,
// fails fast with ErrInProgress, or runs too, as the InFlightMode says. When
// the store fails, the call either runs the action unprotected
// (OnStorageErrorRun, the default) or returns a *StorageError without running
// it (OnStorageErrorRaise).
//
// The guarantee is at most one live lease holder per key while the store is up
// and not failing over; it is not exactly-once. Effects outside the store need
// their own idempotency: pass the key downstream, or use the owner token that
// ReservationFromContext exposes as fencing information.
//
// # Calling
//
// What a caller writes: New and its options (WithLease, WithInFlight,
// WithOnStorageError, WithDefaultTTL, …; ValidateOptions checks them
// alone), Call, Do, DoResult and Result, DoWithCodec with JSONCodec or
// RawCodec, Fingerprint, and the errors a call returns (ErrInProgress,
// ErrKeyReuse, ErrNotReplayable, ErrInvalidRequest and their error types,
// *StorageError). ValidateKey, ValidateOperation and ValidateFingerprint
// apply a Call's rules ahead of time; ReservationFromContext gives the
// running action its owner token.
//
// # Observing
//
// What an observer author writes against lives in the package idemevent:
// the Observer that WithObserver takes, the Event it receives, and the
// bounded label sets that metrics pre-initialise. The package observability
// is the model.
//
// # Writing a store
//
// What a store author implements lives in the package idemstore: the Store
// interface and its records, the optional Watcher, Fencer and BulkStore,
// and Transactor for a store that commits the record with the action's own
// writes in one database transaction (idempg.Store is the model). Of this
// package a store uses OffRequestPath, which tells it which calls no caller
// waits for, and ErrConflict and ErrMisconfigured, which mark what it
// answers that is not an outage, so that no call runs unprotected for it.
//
// This package imports nothing but the standard library and those two.
// Stores live elsewhere: memstore (in memory, for tests), the Redis store
// in redisrepo, the PostgreSQL store in idempg, or your own, checked with the
// conformance suite in storetest.
package coordinator
