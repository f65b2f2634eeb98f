package storetest

import (
	"sync"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The subtests of idemstore.Fencer, run when Harness.Fences is true.

// fencer returns the store as a Fencer, or skips the subtest.
func (e *env) fencer() idemstore.Fencer {
	e.t.Helper()
	if !e.h.Fences {
		e.t.Skip("Harness.Fences is false: the store hands out no fences")
	}
	f, ok := e.h.Store.(idemstore.Fencer)
	if !ok {
		e.t.Fatalf("Harness.Fences is true, but %T is not an idemstore.Fencer", e.h.Store)
	}
	return f
}

// reserveFenced calls ReserveFenced and checks what every call must return.
func (e *env) reserveFenced(key idemstore.Key, w idemstore.Write) (idemstore.Record, uint64, bool) {
	e.t.Helper()
	rec, fence, ok, err := e.fencer().ReserveFenced(e.t.Context(), key, w)
	if err != nil {
		e.t.Fatalf("ReserveFenced(%s): %v", key, err)
	}
	switch {
	case ok && !isZero(rec):
		e.t.Errorf("ReserveFenced(%s) wrote and returned %s, want the zero Record", key, show(rec))
	case ok && fence == 0:
		e.t.Errorf("ReserveFenced(%s) wrote with fence 0, want a fence above 0", key)
	case !ok && fence != 0 && (rec.State != idemstore.StatePending || rec.Token != w.Token):
		e.t.Errorf("ReserveFenced(%s) did not write, met %s, and returned fence %d: want 0 unless the record is the caller's own", key, show(rec), fence)
	}
	return rec, fence, ok
}

// mustFence reserves an absent key with a fence above last and returns it.
func (e *env) mustFence(what string, key idemstore.Key, w idemstore.Write, last uint64) uint64 {
	e.t.Helper()
	rec, fence, ok := e.reserveFenced(key, w)
	if !ok {
		e.t.Fatalf("%s: ReserveFenced(%s) did not write; existing %s", what, key, show(rec))
	}
	if fence <= last {
		e.t.Fatalf("%s: fence %d, want more than the last one, %d", what, fence, last)
	}
	return fence
}

func testFenceGrows(t *testing.T, e *env) {
	key := e.key("fence-grows")
	w := pending(token(), "fp-1", lease)
	f := e.mustFence("first reservation", key, w, 0)
	e.check("Get after ReserveFenced", e.get(key), record(w), 0)

	if !e.release(key, w.Token) {
		t.Fatalf("Release(%s) by the owner: false", key)
	}
	w = pending(token(), "fp-1", e.tick)
	f = e.mustFence("after a release", key, w, f)

	e.pass(2 * e.tick)
	w = pending(token(), "fp-1", lease)
	f = e.mustFence("after the lease ran out", key, w, f)

	if !e.complete(key, w.Token, []byte("result"), longTTL) {
		t.Fatalf("Complete(%s) by the owner: false", key)
	}
	w = replace(pending(token(), "fp-1", lease), w.Token)
	f = e.mustFence("a takeover of the completed record", key, w, f)

	// An unfenced reservation in between leaves the fences growing.
	if !e.release(key, w.Token) {
		t.Fatalf("Release(%s) by the owner: false", key)
	}
	plain := pending(token(), "fp-1", lease)
	e.mustReserve(key, plain)
	if !e.release(key, plain.Token) {
		t.Fatalf("Release(%s) by the owner: false", key)
	}
	e.mustFence("after an unfenced reservation", key, pending(token(), "fp-1", lease), f)
}

func testFenceOfOwnRecord(t *testing.T, e *env) {
	// A caller whose reply was lost meets its own reservation: it gets its
	// fence back, and anyone else gets none.
	key := e.key("fence-own")
	w := pending(token(), "fp-1", lease)
	f := e.mustFence("first reservation", key, w, 0)
	rec, again, ok := e.reserveFenced(key, w)
	if ok || again != f {
		t.Errorf("ReserveFenced(%s) by the holder again: written = %t, fence %d (record %s); want false and its fence %d", key, ok, again, show(rec), f)
	}
	if _, other, ok := e.reserveFenced(key, pending(token(), "fp-1", lease)); ok || other != 0 {
		t.Errorf("ReserveFenced(%s) by another caller while held: written = %t, fence %d; want false and 0", key, ok, other)
	}
	if !e.complete(key, w.Token, []byte("result"), longTTL) {
		t.Fatalf("Complete(%s) by the owner: false", key)
	}
	if rec, fence, ok := e.reserveFenced(key, pending(w.Token, "fp-1", lease)); ok || fence != 0 || rec.State != idemstore.StateCompleted {
		t.Errorf("ReserveFenced(%s) over its completed record: written = %t, fence %d, record %s; want false, 0 and the completed record", key, ok, fence, show(rec))
	}
}

func testConcurrentFences(t *testing.T, e *env) {
	// Callers race to reserve and release one key: every reservation that
	// wrote has a fence of its own, and each caller sees its fences grow.
	key := e.key("fence-race")
	var (
		mu     sync.Mutex
		fences = map[uint64]bool{}
		wg     sync.WaitGroup
	)
	f := e.fencer()
	for range goroutines {
		wg.Go(func() {
			var last uint64
			for range 5 {
				w := pending(token(), "fp-1", lease)
				_, fence, ok, err := f.ReserveFenced(e.t.Context(), key, w)
				if err != nil {
					t.Errorf("ReserveFenced(%s): %v", key, err)
					return
				}
				if !ok {
					continue
				}
				mu.Lock()
				dup := fences[fence]
				fences[fence] = true
				mu.Unlock()
				if dup || fence <= last {
					t.Errorf("fence %d handed out twice or not above this caller's last, %d", fence, last)
				}
				last = fence
				if ok, err := e.h.Store.Release(e.t.Context(), key, w.Token); err != nil || !ok {
					t.Errorf("Release(%s) by the owner: %t, %v", key, ok, err)
				}
			}
		})
	}
	wg.Wait()
	if len(fences) == 0 {
		t.Fatalf("no caller reserved %s", key)
	}
}
