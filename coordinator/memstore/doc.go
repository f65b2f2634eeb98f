// Package memstore is an in-memory [idemstore.Store], for unit tests and
// single-process development.
//
// A [Store] keeps records in a map behind a mutex. It honours leases and time
// to live with its own clock, which tests can replace with a [FakeClock] so
// that expiry happens when the test says, not when the wall clock does:
//
//	clock := memstore.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
//	store := memstore.New(memstore.WithClock(clock.Now))
//	// ... reserve a key with a 30s lease ...
//	clock.Advance(31 * time.Second) // the lease has run out: the key is absent
//
// Besides the [idemstore.Store] methods, a Store has helpers for tests:
// [Store.Put] plants any record (a completed result, a pending reservation
// held by "someone else", or a [idemstore.StateUnreadable] record to test
// how a caller heals a corrupt key), [Store.Snapshot] reads a record without a
// context, and [Store.Len] counts the live keys.
//
// A Store is good enough for tests of code that uses the coordinator, and
// passes the conformance suite in package storetest. It is not a production
// store: records live in one process, are lost when it exits, and nothing
// bounds their number or size.
package memstore
