package storetest

import (
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The subtests of the not-replayable state: a completion or a write whose
// result could not be kept. A store that loses the state (reports the
// reason as a result, or the record as absent or unreadable) lets the
// action run again.

// reason is the reason text of the not-replayable records of the suite: as
// long as the coordinator's longest (256 bytes), with bytes that a store
// which trims or re-encodes text would change.
var reason = []byte(pad("result of 2 MiB exceeds the limit of 1 MiB;\t\"ü\" ", 256, "-"))

func notReplayable(tok, fp string, why []byte, ttl time.Duration) idemstore.Write {
	return idemstore.Write{State: idemstore.StateNotReplayable, Token: tok, Fingerprint: fp, Result: why, TTL: ttl}
}

func (e *env) completeWith(key idemstore.Key, tok string, c idemstore.Completion) bool {
	e.t.Helper()
	ok, err := e.h.Store.Complete(e.t.Context(), key, tok, c)
	if err != nil {
		e.t.Fatalf("Complete(%s, %s): %v", key, c.State, err)
	}
	return ok
}

func testNotReplayableComplete(t *testing.T, e *env) {
	key := e.key("not-replayable-complete")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)

	if !e.completeWith(key, w.Token, idemstore.Completion{State: idemstore.StateNotReplayable, Result: reason, TTL: longTTL}) {
		t.Fatalf("Complete(%s) of a not-replayable completion by the owner: false, want true", key)
	}
	want := idemstore.Record{State: idemstore.StateNotReplayable, Token: w.Token, Fingerprint: w.Fingerprint, Result: reason, TTL: longTTL}
	// The TTL must be the record TTL given to Complete, not the lease.
	e.check("Get after Complete", e.get(key), want, lease)
	existing, ok := e.reserve(key, pending(token(), "fp-1", lease))
	if ok {
		t.Fatalf("Reserve(%s) over a not-replayable record: written = true, want false", key)
	}
	e.check("record returned by Reserve", existing, want, 0)
}

func testNotReplayableWrite(t *testing.T, e *env) {
	key := e.key("not-replayable-write")
	w := notReplayable(token(), "fp-1", reason, longTTL)
	e.mustReserve(key, w)
	e.check("Get after Reserve", e.get(key), record(w), 0)

	for _, second := range []idemstore.Write{
		pending(token(), "fp-1", lease),
		completed(token(), "fp-1", []byte("second"), lease),
		notReplayable(token(), "fp-1", []byte("second"), lease),
	} {
		existing, ok := e.reserve(key, second)
		if ok {
			t.Fatalf("Reserve(%s) of a %s write over a not-replayable record: written = true, want false", key, second.State)
		}
		e.check("record returned by Reserve", existing, record(w), 0)
	}
	e.check("Get after the refused Reserves", e.get(key), record(w), 0)
}

func testNotReplayableIsNotPending(t *testing.T, e *env) {
	// A not-replayable record is no reservation: its token cannot complete,
	// renew or release it.
	key := e.key("not-replayable-not-pending")
	w := notReplayable(token(), "fp-1", reason, longTTL)
	e.mustReserve(key, w)

	if e.complete(key, w.Token, []byte("late"), longTTL) {
		t.Errorf("Complete(%s) over a not-replayable record: true, want false", key)
	}
	if e.renew(key, w.Token, lease) {
		t.Errorf("Renew(%s) of a not-replayable record: true, want false", key)
	}
	if e.release(key, w.Token) {
		t.Errorf("Release(%s) of a not-replayable record: true, want false", key)
	}
	e.check("Get after the refused steps", e.get(key), record(w), 0)
}

func testNotReplayableExpires(t *testing.T, e *env) {
	key := e.key("not-replayable-expires")
	e.mustReserve(key, notReplayable(token(), "fp-1", reason, e.tick))
	e.pass(2 * e.tick)
	e.check("Get after the TTL", e.get(key), idemstore.Record{}, 0)
}
