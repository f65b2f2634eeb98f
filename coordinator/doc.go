// Package coordinator makes an operation run once per idempotency key.
//
// A caller hands the Coordinator an operation name, a key and an action. The
// coordinator reserves the key in a Store (one round trip that also returns an
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
// This package imports nothing but the standard library. Stores live
// elsewhere: memstore (in memory, for tests), the Redis store in redisrepo, or
// your own, checked with the conformance suite in storetest.
package coordinator
