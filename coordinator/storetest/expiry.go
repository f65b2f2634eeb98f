package storetest

import (
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The subtests of expiry: they let time pass, with Harness.Advance or by
// sleeping.

func testExpiryPending(t *testing.T, e *env) {
	key := e.key("expire-pending")
	e.mustReserve(key, pending(token(), "fp-1", e.tick))
	e.pass(2 * e.tick)
	e.check("Get after the lease ran out", e.get(key), idemstore.Record{}, 0)

	// A crashed holder's key is free again.
	next := pending(token(), "fp-1", lease)
	e.mustReserve(key, next)
	e.check("Get after a new Reserve", e.get(key), record(next), 0)
}

func testExpiryCompleted(t *testing.T, e *env) {
	key := e.key("expire-completed")
	e.mustReserve(key, completed(token(), "fp-1", []byte("result"), e.tick))
	e.pass(2 * e.tick)
	e.check("Get after the TTL ran out", e.get(key), idemstore.Record{}, 0)
}

func testExpiryCompleteSetsTTL(t *testing.T, e *env) {
	// Complete must set the record TTL, not keep what is left of the lease.
	key := e.key("expire-complete-ttl")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.complete(key, w.Token, []byte("result"), e.tick) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	e.pass(2 * e.tick)
	e.check("Get after the record TTL ran out", e.get(key), idemstore.Record{}, 0)
}

func testExpiryReplaceSetsTTL(t *testing.T, e *env) {
	// A replacing write must set its own TTL, not keep the old record's.
	key := e.key("expire-replace-ttl")
	old := completed(token(), "fp-1", []byte("old"), longTTL)
	e.mustReserve(key, old)
	w := replace(pending(token(), "fp-1", e.tick), old.Token)
	if existing, ok := e.reserve(key, w); !ok {
		t.Fatalf("Reserve(%s) replacing a completed record with its token: written = false, existing %s", key, show(existing))
	}
	e.pass(2 * e.tick)
	e.check("Get after the replacing lease ran out", e.get(key), idemstore.Record{}, 0)
}

func testExpiryLeaseLost(t *testing.T, e *env) {
	// The first holder's lease runs out and a second caller reserves the
	// key: the first holder's token must not touch it any more.
	key := e.key("expire-lease-lost")
	first := pending(token(), "fp-1", e.tick)
	e.mustReserve(key, first)
	e.pass(2 * e.tick)
	if e.renew(key, first.Token, lease) {
		t.Fatalf("Renew(%s) after the lease ran out: true, want false", key)
	}
	e.check("Get after the late Renew", e.get(key), idemstore.Record{}, 0)

	second := pending(token(), "fp-1", lease)
	e.mustReserve(key, second)
	if e.renew(key, first.Token, longTTL) {
		t.Fatalf("Renew(%s) by the lost holder: true, want false", key)
	}
	if e.complete(key, first.Token, []byte("late"), longTTL) {
		t.Fatalf("Complete(%s) by the lost holder: true, want false", key)
	}
	if e.release(key, first.Token) {
		t.Fatalf("Release(%s) by the lost holder: true, want false", key)
	}
	e.check("Get after the lost holder's calls", e.get(key), record(second), 0)
}
