package storetest

import (
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The subtests of the Store methods, one rule each. Only
// testRenewOutlivesLease lets time pass.

func testReserveAbsentPending(t *testing.T, e *env) {
	key := e.key("reserve-pending")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	e.check("Get after Reserve", e.get(key), record(w), 0)
}

func testReserveAbsentCompleted(t *testing.T, e *env) {
	key := e.key("reserve-completed")
	w := completed(token(), "fp-1", []byte(`{"id":42}`), longTTL)
	e.mustReserve(key, w)
	e.check("Get after Reserve", e.get(key), record(w), 0)
}

func testReserveEmptyFingerprint(t *testing.T, e *env) {
	key := e.key("reserve-no-fingerprint")
	w := pending(token(), "", lease)
	e.mustReserve(key, w)
	e.check("Get after Reserve", e.get(key), record(w), 0)
}

func testReserveExistingPending(t *testing.T, e *env) {
	key := e.key("reserve-existing-pending")
	first := pending(token(), "fp-1", lease)
	e.mustReserve(key, first)

	// A second writer with everything different, and a longer TTL: nothing
	// of it may reach the record, not even its TTL.
	for _, w := range []idemstore.Write{
		pending(token(), "fp-2", longTTL),
		completed(token(), "fp-2", []byte("second"), longTTL),
	} {
		existing, ok := e.reserve(key, w)
		if ok {
			t.Fatalf("Reserve(%s) of a %s write over a pending record: written = true, want false", key, w.State)
		}
		e.check("record returned by Reserve", existing, record(first), 0)
	}
	e.check("Get after the refused Reserves", e.get(key), record(first), 0)
}

// testReserveExistingPendingShorterLease: a pending record is a live
// holder's whatever the writer's own lease: a writer whose lease is a
// hundredth of the holder's (a process of a fleet in the middle of a deploy
// that raised the lease) gets the record back and writes nothing, however
// often it meets it.
func testReserveExistingPendingShorterLease(t *testing.T, e *env) {
	key := e.key("reserve-existing-pending-shorter-lease")
	first := pending(token(), "fp-1", longTTL)
	e.mustReserve(key, first)
	for range 3 {
		for _, w := range []idemstore.Write{
			pending(token(), "fp-1", longTTL/100),
			pending(token(), "fp-2", longTTL/100),
			completed(token(), "fp-1", []byte("second"), longTTL/100),
		} {
			existing, ok := e.reserve(key, w)
			if ok {
				t.Fatalf("Reserve(%s) of a %s write with TTL %v over a pending record with TTL %v: written = true, want false", key, w.State, w.TTL, first.TTL)
			}
			e.check("record returned by Reserve", existing, record(first), 0)
		}
	}
	e.check("Get after the refused Reserves", e.get(key), record(first), 0)
}

func testReserveExistingCompleted(t *testing.T, e *env) {
	key := e.key("reserve-existing-completed")
	first := completed(token(), "fp-1", []byte("first"), lease)
	e.mustReserve(key, first)

	existing, ok := e.reserve(key, pending(token(), "fp-2", longTTL))
	if ok {
		t.Fatalf("Reserve(%s) over a completed record: written = true, want false", key)
	}
	e.check("record returned by Reserve", existing, record(first), 0)
	e.check("Get after the refused Reserve", e.get(key), record(first), 0)
}

func testReserveExistingUnreadable(t *testing.T, e *env) {
	key := e.key("reserve-existing-unreadable")
	bad := e.corrupt(key)

	existing, ok := e.reserve(key, pending(token(), "fp-1", lease))
	if ok {
		t.Fatalf("Reserve(%s) without Replace over an unreadable record: written = true, want false", key)
	}
	e.check("record returned by Reserve", existing, bad, 0)
	e.check("Get after the refused Reserve", e.get(key), bad, 0)
}

func testReserveWriteCompletedIfAbsent(t *testing.T, e *env) {
	// In-flight mode "run": write-if-absent of a completed result; the
	// second writer adopts the first one's result.
	key := e.key("write-if-absent")
	first := completed(token(), "fp-1", []byte("first"), longTTL)
	e.mustReserve(key, first)

	existing, ok := e.reserve(key, completed(token(), "fp-1", []byte("second"), longTTL))
	if ok {
		t.Fatalf("second write-if-absent of %s: written = true, want false", key)
	}
	e.check("record returned to the second writer", existing, record(first), 0)
	e.check("Get after both writes", e.get(key), record(first), 0)
}

func testReplaceCompleted(t *testing.T, e *env) {
	key := e.key("replace-completed")
	old := completed(token(), "fp-1", []byte("old"), longTTL)
	e.mustReserve(key, old)

	w := replace(pending(token(), "fp-2", lease), old.Token)
	if existing, ok := e.reserve(key, w); !ok {
		t.Fatalf("Reserve(%s) replacing a completed record with its token: written = false, existing %s", key, show(existing))
	}
	e.check("Get after the replace", e.get(key), record(w), 0)
}

func testReplaceCompletedByCompleted(t *testing.T, e *env) {
	key := e.key("replace-completed-by-completed")
	old := completed(token(), "fp-1", []byte("old"), lease)
	e.mustReserve(key, old)

	w := replace(completed(token(), "fp-1", []byte("new"), longTTL), old.Token)
	if existing, ok := e.reserve(key, w); !ok {
		t.Fatalf("Reserve(%s) replacing a completed record with its token: written = false, existing %s", key, show(existing))
	}
	// The TTL must be the new write's, not what was left of the old one.
	e.check("Get after the replace", e.get(key), record(w), lease)
}

func testReplaceCompletedMismatch(t *testing.T, e *env) {
	key := e.key("replace-mismatch")
	old := completed(token(), "fp-1", []byte("old"), longTTL)
	e.mustReserve(key, old)

	for _, tok := range []string{token(), ""} {
		existing, ok := e.reserve(key, replace(pending(token(), "fp-2", lease), tok))
		if ok {
			t.Fatalf("Reserve(%s) replacing a completed record with token %q, not its own: written = true, want false", key, tok)
		}
		e.check("record returned by the refused replace", existing, record(old), 0)
	}
	e.check("Get after the refused replaces", e.get(key), record(old), 0)
}

func testReplacePending(t *testing.T, e *env) {
	key := e.key("replace-pending")
	held := pending(token(), "fp-1", lease)
	e.mustReserve(key, held)

	existing, ok := e.reserve(key, replace(pending(token(), "fp-1", longTTL), held.Token))
	if ok {
		t.Fatalf("Reserve(%s) replacing a pending record: written = true, want false (a pending record is never replaced)", key)
	}
	e.check("record returned by the refused replace", existing, record(held), 0)
	e.check("Get after the refused replace", e.get(key), record(held), 0)
}

func testReplaceNeedsFlag(t *testing.T, e *env) {
	key := e.key("replace-needs-flag")
	old := completed(token(), "fp-1", []byte("old"), longTTL)
	e.mustReserve(key, old)

	w := pending(token(), "fp-2", lease)
	w.ReplaceToken = old.Token // but Replace is false
	existing, ok := e.reserve(key, w)
	if ok {
		t.Fatalf("Reserve(%s) with ReplaceToken set but Replace false: written = true, want false", key)
	}
	e.check("record returned by Reserve", existing, record(old), 0)
	e.check("Get after the refused Reserve", e.get(key), record(old), 0)
}

func testReplaceAbsent(t *testing.T, e *env) {
	key := e.key("replace-absent")
	w := replace(pending(token(), "fp-1", lease), token())
	e.mustReserve(key, w)
	e.check("Get after Reserve", e.get(key), record(w), 0)
}

func testReplaceUnreadable(t *testing.T, e *env) {
	key := e.key("replace-unreadable")
	bad := e.corrupt(key)

	// The coordinator replaces an unreadable record by the token the store
	// reported for it: "" when the store cannot read one.
	existing, ok := e.reserve(key, replace(pending(token(), "fp-1", lease), bad.Token+"-other"))
	if ok {
		t.Fatalf("Reserve(%s) replacing an unreadable record with a token not its own (%q): written = true, want false", key, bad.Token+"-other")
	}
	e.check("record returned by the refused replace", existing, bad, 0)

	w := replace(pending(token(), "fp-1", lease), bad.Token)
	if existing, ok := e.reserve(key, w); !ok {
		t.Fatalf("Reserve(%s) replacing an unreadable record with its token %q: written = false, existing %s", key, bad.Token, show(existing))
	}
	e.check("Get after the replace", e.get(key), record(w), 0)
}

func testGetAbsent(t *testing.T, e *env) {
	key := e.key("get-absent")
	e.check("Get of a key never written", e.get(key), idemstore.Record{}, 0)
}

func testGetUnreadable(t *testing.T, e *env) {
	// e.corrupt checks that Get reports the planted record as unreadable
	// (with a nil error); a second Get must not change it.
	key := e.key("get-unreadable")
	bad := e.corrupt(key)
	e.check("second Get", e.get(key), bad, 0)
}

func testCompleteOwner(t *testing.T, e *env) {
	key := e.key("complete-owner")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)

	result := []byte(`{"charge":"ch_1"}`)
	if !e.complete(key, w.Token, result, longTTL) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: result, TTL: longTTL}
	// The TTL must be the record TTL given to Complete, not the lease.
	e.check("Get after Complete", e.get(key), want, lease)
}

func testCompleteNotOwner(t *testing.T, e *env) {
	key := e.key("complete-not-owner")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)

	for _, tok := range []string{token(), ""} {
		if e.complete(key, tok, []byte("theirs"), longTTL) {
			t.Fatalf("Complete(%s) with token %q, not the owner's: true, want false", key, tok)
		}
	}
	e.check("Get after the refused Completes", e.get(key), record(w), 0)
}

func testCompleteAbsent(t *testing.T, e *env) {
	key := e.key("complete-absent")
	if e.complete(key, token(), []byte("result"), longTTL) {
		t.Fatalf("Complete(%s) of an absent key: true, want false", key)
	}
	e.check("Get after the refused Complete", e.get(key), idemstore.Record{}, 0)
}

func testCompleteCompleted(t *testing.T, e *env) {
	key := e.key("complete-completed")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.complete(key, w.Token, []byte("first"), longTTL) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	if e.complete(key, w.Token, []byte("second"), longTTL) {
		t.Fatalf("second Complete(%s) with the same token: true, want false (the record is no longer pending)", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: []byte("first"), TTL: longTTL}
	e.check("Get after the second Complete", e.get(key), want, 0)

	// Nor may Complete touch a completed record written without a
	// reservation, though the token matches.
	key = e.key("complete-written-completed")
	done := completed(token(), "fp-1", []byte("written"), longTTL)
	e.mustReserve(key, done)
	if e.complete(key, done.Token, []byte("completed"), longTTL) {
		t.Fatalf("Complete(%s) of a record written completed: true, want false", key)
	}
	e.check("Get after the refused Complete", e.get(key), record(done), 0)
}

func testCompleteUnreadable(t *testing.T, e *env) {
	key := e.key("complete-unreadable")
	bad := e.corrupt(key)
	if e.complete(key, bad.Token, []byte("result"), longTTL) {
		t.Fatalf("Complete(%s) of an unreadable record: true, want false", key)
	}
	e.check("Get after the refused Complete", e.get(key), bad, 0)
}

func testReleaseOwner(t *testing.T, e *env) {
	key := e.key("release-owner")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.release(key, w.Token) {
		t.Fatalf("Release(%s) by the owner: false, want true", key)
	}
	e.check("Get after Release", e.get(key), idemstore.Record{}, 0)
	if e.release(key, w.Token) {
		t.Fatalf("second Release(%s) by the owner: true, want false", key)
	}

	// The key is free again.
	next := pending(token(), "fp-2", lease)
	e.mustReserve(key, next)
	e.check("Get after a new Reserve", e.get(key), record(next), 0)
}

func testReleaseNotOwner(t *testing.T, e *env) {
	key := e.key("release-not-owner")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	for _, tok := range []string{token(), ""} {
		if e.release(key, tok) {
			t.Fatalf("Release(%s) with token %q, not the owner's: true, want false", key, tok)
		}
	}
	e.check("Get after the refused Releases", e.get(key), record(w), 0)
}

func testReleaseAbsent(t *testing.T, e *env) {
	key := e.key("release-absent")
	if e.release(key, token()) {
		t.Fatalf("Release(%s) of an absent key: true, want false", key)
	}
	e.check("Get after the refused Release", e.get(key), idemstore.Record{}, 0)
}

func testReleaseCompleted(t *testing.T, e *env) {
	key := e.key("release-completed")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.complete(key, w.Token, []byte("done"), longTTL) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	if e.release(key, w.Token) {
		t.Fatalf("Release(%s) of a completed record with its token: true, want false (failures release, results stay)", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: []byte("done"), TTL: longTTL}
	e.check("Get after the refused Release", e.get(key), want, 0)
}

func testReleaseUnreadable(t *testing.T, e *env) {
	key := e.key("release-unreadable")
	bad := e.corrupt(key)
	if e.release(key, bad.Token) {
		t.Fatalf("Release(%s) of an unreadable record: true, want false", key)
	}
	e.check("Get after the refused Release", e.get(key), bad, 0)
}

func testRenewOwner(t *testing.T, e *env) {
	key := e.key("renew-owner")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.renew(key, w.Token, longTTL) {
		t.Fatalf("Renew(%s) by the owner: false, want true", key)
	}
	want := record(w)
	want.TTL = longTTL
	e.check("Get after Renew", e.get(key), want, lease)
}

func testRenewOutlivesLease(t *testing.T, e *env) {
	key := e.key("renew-outlives")
	w := pending(token(), "fp-1", e.tick)
	e.mustReserve(key, w)
	if !e.renew(key, w.Token, 4*e.tick) {
		t.Fatalf("Renew(%s) by the owner right after Reserve: false, want true (is Harness.Tick too short?)", key)
	}
	e.pass(2 * e.tick) // past the first lease, well within the second
	want := record(w)
	want.TTL = 4 * e.tick
	e.check("Get after the first lease ran out", e.get(key), want, 0)
	e.pass(3 * e.tick) // past the second lease
	e.check("Get after the renewed lease ran out", e.get(key), idemstore.Record{}, 0)
}

func testRenewNotOwner(t *testing.T, e *env) {
	key := e.key("renew-not-owner")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	for _, tok := range []string{token(), ""} {
		if e.renew(key, tok, longTTL) {
			t.Fatalf("Renew(%s) with token %q, not the owner's: true, want false", key, tok)
		}
	}
	e.check("Get after the refused Renews (TTL not extended)", e.get(key), record(w), 0)
}

func testRenewAbsent(t *testing.T, e *env) {
	key := e.key("renew-absent")
	if e.renew(key, token(), lease) {
		t.Fatalf("Renew(%s) of an absent key: true, want false", key)
	}
	e.check("Get after the refused Renew", e.get(key), idemstore.Record{}, 0)
}

func testRenewCompleted(t *testing.T, e *env) {
	key := e.key("renew-completed")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)
	if !e.complete(key, w.Token, []byte("done"), lease) {
		t.Fatalf("Complete(%s) by the owner: false, want true", key)
	}
	if e.renew(key, w.Token, longTTL) {
		t.Fatalf("Renew(%s) of a completed record with its token: true, want false", key)
	}
	want := idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: []byte("done"), TTL: lease}
	e.check("Get after the refused Renew (TTL not extended)", e.get(key), want, 0)
}

func testRenewUnreadable(t *testing.T, e *env) {
	key := e.key("renew-unreadable")
	bad := e.corrupt(key)
	if e.renew(key, bad.Token, longTTL) {
		t.Fatalf("Renew(%s) of an unreadable record: true, want false", key)
	}
	e.check("Get after the refused Renew", e.get(key), bad, 0)
}
