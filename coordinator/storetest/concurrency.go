package storetest

import (
	"fmt"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The subtests of concurrent callers of one key.

// outcome is what one goroutine of a concurrency subtest saw.
type outcome struct {
	written  bool
	existing idemstore.Record
	err      error
}

// reserveAll makes goroutines callers reserve key at once, each with its own
// token and w as a template, and checks that exactly one wrote and that all
// the others were shown the winner's pending record. It returns the winning
// write.
func reserveAll(t *testing.T, e *env, key idemstore.Key, w idemstore.Write) idemstore.Write {
	t.Helper()
	ws := make([]idemstore.Write, goroutines)
	for i := range ws {
		ws[i] = w
		ws[i].Token = token()
	}
	out := make([]outcome, goroutines)
	runAll(goroutines, func(i int) {
		out[i].existing, out[i].written, out[i].err = e.h.Store.Reserve(e.ctx(), key, ws[i])
	})

	winner := -1
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("Reserve(%s) by caller %d of %d: %v", key, i, goroutines, o.err)
		}
		if !o.written {
			continue
		}
		if winner >= 0 {
			t.Fatalf("Reserve(%s) by %d callers at once: callers %d and %d both wrote, want exactly one", key, goroutines, winner, i)
		}
		winner = i
	}
	if winner < 0 {
		t.Fatalf("Reserve(%s) by %d callers at once: none wrote, want exactly one", key, goroutines)
	}
	for i, o := range out {
		if i != winner {
			e.check(fmt.Sprintf("record returned to losing caller %d", i), o.existing, record(ws[winner]), 0)
		}
	}
	e.check("Get after the race", e.get(key), record(ws[winner]), 0)
	return ws[winner]
}

func testConcurrentReserve(t *testing.T, e *env) {
	key := e.key("race-reserve")
	first := reserveAll(t, e, key, pending("", "fp-1", lease))
	if !e.release(key, first.Token) {
		t.Fatalf("Release(%s) by the winner: false, want true", key)
	}
	// Again on the released key.
	reserveAll(t, e, key, pending("", "fp-1", lease))
}

func testConcurrentReplace(t *testing.T, e *env) {
	// Concurrent healers of one record: only one may run the action.
	key := e.key("race-replace")
	old := completed(token(), "fp-1", []byte("old"), longTTL)
	e.mustReserve(key, old)
	reserveAll(t, e, key, replace(pending("", "fp-1", lease), old.Token))
}

func testConcurrentReplaceUnreadable(t *testing.T, e *env) {
	key := e.key("race-replace-unreadable")
	bad := e.corrupt(key)
	reserveAll(t, e, key, replace(pending("", "fp-1", lease), bad.Token))
}

func testConcurrentCompleteRelease(t *testing.T, e *env) {
	// The owner's Complete and Release race each other (half of the
	// goroutines each, every one with its own result): exactly one call may
	// succeed, and the record must show which.
	key := e.key("race-complete")
	w := pending(token(), "fp-1", lease)
	e.mustReserve(key, w)

	results := make([][]byte, goroutines)
	for i := range results {
		results[i] = fmt.Appendf(nil, "result-%d", i)
	}
	type done struct {
		ok  bool
		err error
	}
	out := make([]done, goroutines)
	runAll(goroutines, func(i int) {
		if i%2 == 0 {
			out[i].ok, out[i].err = e.h.Store.Complete(e.ctx(), key, w.Token, idemstore.Completion{State: idemstore.StateCompleted, Result: results[i], TTL: longTTL})
		} else {
			out[i].ok, out[i].err = e.h.Store.Release(e.ctx(), key, w.Token)
		}
	})

	winner := -1
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("call %d of %d on %s: %v", i, goroutines, key, o.err)
		}
		if !o.ok {
			continue
		}
		if winner >= 0 {
			t.Fatalf("%d Completes and Releases by the owner of %s at once: calls %d and %d both succeeded, want exactly one", goroutines, key, winner, i)
		}
		winner = i
	}
	if winner < 0 {
		t.Fatalf("%d Completes and Releases by the owner of %s at once: none succeeded, want exactly one", goroutines, key)
	}
	want := idemstore.Record{} // a Release won
	if winner%2 == 0 {
		want = idemstore.Record{State: idemstore.StateCompleted, Token: w.Token, Fingerprint: w.Fingerprint, Result: results[winner], TTL: longTTL}
	}
	e.check(fmt.Sprintf("Get after call %d won", winner), e.get(key), want, 0)
}
