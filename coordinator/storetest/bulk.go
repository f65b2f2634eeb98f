package storetest

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// The subtests of idemstore.BulkStore, run when the store is one.

// bulk returns the store as a BulkStore, or skips the subtest.
func (e *env) bulk() idemstore.BulkStore {
	e.t.Helper()
	b, ok := e.h.Store.(idemstore.BulkStore)
	if !ok {
		e.t.Skipf("%T is not an idemstore.BulkStore", e.h.Store)
	}
	return b
}

// keys returns n keys of the store nobody else uses, named name.0 to
// name.(n-1): on Redis Cluster they fall into many hash slots.
func (e *env) keys(name string, n int) []idemstore.Key {
	ks := make([]idemstore.Key, n)
	for i := range ks {
		ks[i] = e.key(name + "." + strconv.Itoa(i))
	}
	return ks
}

func (e *env) getMany(keys []idemstore.Key) []idemstore.Record {
	e.t.Helper()
	recs, err := e.bulk().GetMany(e.t.Context(), keys)
	if err != nil {
		e.t.Fatalf("GetMany(%d keys): %v", len(keys), err)
	}
	if len(recs) != len(keys) {
		e.t.Fatalf("GetMany(%d keys) returned %d records", len(keys), len(recs))
	}
	return recs
}

func (e *env) reserveMany(keys []idemstore.Key, ws []idemstore.Write, allOrNothing bool) ([]idemstore.Record, []bool) {
	e.t.Helper()
	existing, written, err := e.bulk().ReserveMany(e.t.Context(), keys, ws, allOrNothing)
	if err != nil {
		e.t.Fatalf("ReserveMany(%d keys, allOrNothing %v): %v", len(keys), allOrNothing, err)
	}
	if len(existing) != len(keys) || len(written) != len(keys) {
		e.t.Fatalf("ReserveMany(%d keys) returned %d records and %d flags", len(keys), len(existing), len(written))
	}
	for i := range keys {
		if written[i] && !isZero(existing[i]) {
			e.t.Errorf("ReserveMany entry %d (%s) wrote and returned %s, want the zero Record", i, keys[i], show(existing[i]))
		}
	}
	return existing, written
}

func (e *env) completeMany(keys []idemstore.Key, tokens []string, cs []idemstore.Completion) []bool {
	e.t.Helper()
	ok, err := e.bulk().CompleteMany(e.t.Context(), keys, tokens, cs)
	if err != nil {
		e.t.Fatalf("CompleteMany(%d keys): %v", len(keys), err)
	}
	if len(ok) != len(keys) {
		e.t.Fatalf("CompleteMany(%d keys) returned %d flags", len(keys), len(ok))
	}
	return ok
}

func (e *env) deleteMany(keys []idemstore.Key) int {
	e.t.Helper()
	n, err := e.bulk().DeleteMany(e.t.Context(), keys)
	if err != nil {
		e.t.Fatalf("DeleteMany(%d keys): %v", len(keys), err)
	}
	return n
}

// mixed plants one key of each state the single-key methods make (absent,
// pending, completed, not replayable, and unreadable when the harness can
// plant it) and returns the keys and what Get must report for each.
func (e *env) mixed(name string) ([]idemstore.Key, []idemstore.Record) {
	e.t.Helper()
	absent, pend, done, nr := e.key(name+".absent"), e.key(name+".pending"), e.key(name+".completed"), e.key(name+".not-replayable")
	wp := pending(token(), "fp-p", lease)
	e.mustReserve(pend, wp)
	wc := completed(token(), "fp-c", []byte("result"), longTTL)
	e.mustReserve(done, wc)
	wn := idemstore.Write{State: idemstore.StateNotReplayable, Token: token(), Result: []byte("too large"), TTL: longTTL}
	e.mustReserve(nr, wn)
	keys := []idemstore.Key{absent, pend, done, nr}
	want := []idemstore.Record{{}, record(wp), record(wc), record(wn)}
	if e.h.Corrupt != nil {
		bad := e.key(name + ".unreadable")
		keys = append(keys, bad)
		want = append(want, e.corrupt(bad))
	}
	return keys, want
}

func testGetManyMixed(t *testing.T, e *env) {
	e.bulk()
	keys, want := e.mixed("get-many")
	// Twice over, in another order: the records come back in the order of
	// the keys, a key given twice is read twice.
	keys = append(keys, keys[2], keys[0], keys[1])
	want = append(want, want[2], want[0], want[1])
	for i, rec := range e.getMany(keys) {
		e.check(fmt.Sprintf("GetMany entry %d (%s)", i, keys[i]), rec, want[i], 0)
	}
}

func testGetManyEmpty(t *testing.T, e *env) {
	if recs := e.getMany(nil); len(recs) != 0 {
		t.Errorf("GetMany(no keys) = %d records, want none", len(recs))
	}
}

func testReserveManyMixed(t *testing.T, e *env) {
	e.bulk()
	keys, want := e.mixed("reserve-many")
	free := e.key("reserve-many.free")
	keys = append(keys, free)
	want = append(want, idemstore.Record{})
	ws := make([]idemstore.Write, len(keys))
	for i := range ws {
		ws[i] = pending(token(), "fp-new", lease)
	}
	existing, written := e.reserveMany(keys, ws, false)
	for i, k := range keys {
		if want[i].State == idemstore.StateAbsent {
			if !written[i] {
				t.Errorf("ReserveMany entry %d (%s), an absent key: not written, existing %s", i, k, show(existing[i]))
			}
			e.check(fmt.Sprintf("Get(%s) after ReserveMany", k), e.get(k), record(ws[i]), 0)
			continue
		}
		if written[i] {
			t.Errorf("ReserveMany entry %d (%s) wrote over a %s record", i, k, want[i].State)
			continue
		}
		e.check(fmt.Sprintf("ReserveMany entry %d (%s)", i, k), existing[i], want[i], 0)
		e.check(fmt.Sprintf("Get(%s) after ReserveMany", k), e.get(k), want[i], 0)
	}
}

func testReserveManyAllOrNothing(t *testing.T, e *env) {
	e.bulk()
	keys := e.keys("all-or-nothing", 5)
	held := pending(token(), "fp-held", lease)
	e.mustReserve(keys[3], held)
	ws := make([]idemstore.Write, len(keys))
	for i := range ws {
		ws[i] = completed(token(), "fp", []byte("r"+strconv.Itoa(i)), longTTL)
	}
	existing, written := e.reserveMany(keys, ws, true)
	for i, k := range keys {
		if written[i] {
			t.Errorf("ReserveMany all-or-nothing entry %d (%s) reported written although entry 3 collided", i, k)
		}
		if i == 3 {
			e.check("ReserveMany all-or-nothing, the colliding entry", existing[i], record(held), 0)
			continue
		}
		e.check(fmt.Sprintf("Get(%s) after an all-or-nothing ReserveMany that collided", k), e.get(k), idemstore.Record{}, 0)
	}
	e.check("Get of the colliding key", e.get(keys[3]), record(held), 0)

	// Without the collision, every entry writes.
	e.release(keys[3], held.Token)
	existing, written = e.reserveMany(keys, ws, true)
	for i, k := range keys {
		if !written[i] {
			t.Errorf("ReserveMany all-or-nothing over free keys: entry %d (%s) not written, existing %s", i, k, show(existing[i]))
		}
		e.check(fmt.Sprintf("Get(%s) after ReserveMany", k), e.get(k), record(ws[i]), 0)
	}
}

func testReserveManyReplace(t *testing.T, e *env) {
	e.bulk()
	keys := e.keys("reserve-many-replace", 2)
	old := [2]idemstore.Write{completed(token(), "fp", []byte("old"), longTTL), completed(token(), "fp", []byte("old"), longTTL)}
	e.mustReserve(keys[0], old[0])
	e.mustReserve(keys[1], old[1])
	ws := []idemstore.Write{
		replace(pending(token(), "fp", lease), old[0].Token),
		replace(pending(token(), "fp", lease), token()), // another token: refused
	}
	existing, written := e.reserveMany(keys, ws, false)
	if !written[0] {
		t.Errorf("ReserveMany replace with the record's token: not written, existing %s", show(existing[0]))
	}
	e.check("Get after the replace", e.get(keys[0]), record(ws[0]), 0)
	if written[1] {
		t.Errorf("ReserveMany replace with another token wrote")
	}
	e.check("ReserveMany replace with another token", existing[1], record(old[1]), 0)
}

func testReserveManySameKeyTwice(t *testing.T, e *env) {
	e.bulk()
	k := e.key("reserve-many-twice")
	ws := []idemstore.Write{pending(token(), "fp", lease), pending(token(), "fp", lease)}
	existing, written := e.reserveMany([]idemstore.Key{k, k}, ws, false)
	if !written[0] || written[1] {
		t.Fatalf("ReserveMany of one key twice: written %v, want [true false]", written)
	}
	e.check("ReserveMany, the second entry of a key", existing[1], record(ws[0]), 0)
}

func testBulkMismatchedLengths(t *testing.T, e *env) {
	b := e.bulk()
	keys := e.keys("mismatch", 2)
	if _, _, err := b.ReserveMany(e.ctx(), keys, []idemstore.Write{pending(token(), "", lease)}, false); err == nil {
		t.Error("ReserveMany with 2 keys and 1 write: no error")
	}
	if _, err := b.CompleteMany(e.ctx(), keys, []string{token()}, make([]idemstore.Completion, 2)); err == nil {
		t.Error("CompleteMany with 2 keys and 1 token: no error")
	}
	for _, k := range keys {
		e.check("Get after the refused calls", e.get(k), idemstore.Record{}, 0)
	}
}

func testCompleteManyOwners(t *testing.T, e *env) {
	e.bulk()
	keys := e.keys("complete-many", 4)
	ws := make([]idemstore.Write, 3)
	for i := range ws {
		ws[i] = pending(token(), "fp-"+strconv.Itoa(i), lease)
		e.mustReserve(keys[i], ws[i])
	}
	// keys[0]: the owner completes; keys[1]: the owner, not replayable;
	// keys[2]: another token; keys[3]: absent.
	tokens := []string{ws[0].Token, ws[1].Token, token(), token()}
	cs := []idemstore.Completion{
		{State: idemstore.StateCompleted, Result: []byte("done"), TTL: longTTL},
		{State: idemstore.StateNotReplayable, Result: []byte("why"), TTL: longTTL},
		{State: idemstore.StateCompleted, Result: []byte("stolen"), TTL: longTTL},
		{State: idemstore.StateCompleted, Result: []byte("nobody"), TTL: longTTL},
	}
	ok := e.completeMany(keys, tokens, cs)
	if want := []bool{true, true, false, false}; fmt.Sprint(ok) != fmt.Sprint(want) {
		t.Errorf("CompleteMany: ok %v, want %v", ok, want)
	}
	e.check("Get of the completed key", e.get(keys[0]),
		idemstore.Record{State: idemstore.StateCompleted, Token: ws[0].Token, Fingerprint: "fp-0", Result: []byte("done"), TTL: longTTL}, 0)
	e.check("Get of the not-replayable key", e.get(keys[1]),
		idemstore.Record{State: idemstore.StateNotReplayable, Token: ws[1].Token, Fingerprint: "fp-1", Result: []byte("why"), TTL: longTTL}, 0)
	e.check("Get of the key completed by another token", e.get(keys[2]), record(ws[2]), 0)
	e.check("Get of the absent key", e.get(keys[3]), idemstore.Record{}, 0)
}

func testDeleteMany(t *testing.T, e *env) {
	e.bulk()
	keys, want := e.mixed("delete-many")
	present := 0
	for _, r := range want {
		if r.State != idemstore.StateAbsent {
			present++
		}
	}
	if n := e.deleteMany(keys); n != present {
		t.Errorf("DeleteMany of %d keys, %d of them present: %d deleted", len(keys), present, n)
	}
	for i, rec := range e.getMany(keys) {
		e.check(fmt.Sprintf("GetMany entry %d (%s) after DeleteMany", i, keys[i]), rec, idemstore.Record{}, 0)
	}
	if n := e.deleteMany(nil); n != 0 {
		t.Errorf("DeleteMany(no keys) = %d", n)
	}
}

// testBulkManyKeys runs a batch through its whole life with more keys than
// one script call or one hash slot takes.
func testBulkManyKeys(t *testing.T, e *env) {
	e.bulk()
	const n = 1100
	keys := e.keys("many", n)
	ws := make([]idemstore.Write, n)
	tokens := make([]string, n)
	cs := make([]idemstore.Completion, n)
	for i := range ws {
		ws[i] = pending(token(), "fp", lease)
		tokens[i] = ws[i].Token
		cs[i] = idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(strconv.Itoa(i)), TTL: longTTL}
	}
	// Every tenth key is held by someone else.
	others := map[int]idemstore.Write{}
	for i := 0; i < n; i += 10 {
		others[i] = pending(token(), "fp-other", lease)
		e.mustReserve(keys[i], others[i])
	}
	existing, written := e.reserveMany(keys, ws, false)
	for i := range keys {
		if o, held := others[i]; held {
			if written[i] {
				t.Fatalf("ReserveMany entry %d wrote over another holder's record", i)
			}
			e.check(fmt.Sprintf("ReserveMany entry %d", i), existing[i], record(o), 0)
		} else if !written[i] {
			t.Fatalf("ReserveMany entry %d (%s), an absent key: not written, existing %s", i, keys[i], show(existing[i]))
		}
	}
	ok := e.completeMany(keys, tokens, cs)
	for i, rec := range e.getMany(keys) {
		if o, held := others[i]; held {
			if ok[i] {
				t.Fatalf("CompleteMany entry %d completed another holder's record", i)
			}
			e.check(fmt.Sprintf("GetMany entry %d", i), rec, record(o), 0)
			continue
		}
		if !ok[i] {
			t.Fatalf("CompleteMany entry %d (%s): not completed", i, keys[i])
		}
		e.check(fmt.Sprintf("GetMany entry %d", i), rec,
			idemstore.Record{State: idemstore.StateCompleted, Token: tokens[i], Fingerprint: "fp", Result: cs[i].Result, TTL: longTTL}, 0)
	}
	if d := e.deleteMany(keys); d != n {
		t.Errorf("DeleteMany of %d present keys: %d deleted", n, d)
	}
}

// testConcurrentReserveMany has goroutines callers reserve one batch of
// keys at once, each in its own order: every key has exactly one winner,
// and every loser is shown the winner's record.
func testConcurrentReserveMany(t *testing.T, e *env) {
	b := e.bulk()
	const n = 20
	keys := e.keys("concurrent-many", n)
	type attempt struct {
		keys     []idemstore.Key
		ws       []idemstore.Write
		existing []idemstore.Record
		written  []bool
		err      error
	}
	att := make([]attempt, goroutines)
	for g := range att {
		a := &att[g]
		for j := range n {
			a.keys = append(a.keys, keys[(j+g)%n])
			a.ws = append(a.ws, pending(token(), "fp", lease))
		}
	}
	runAll(goroutines, func(g int) {
		a := &att[g]
		a.existing, a.written, a.err = b.ReserveMany(e.ctx(), a.keys, a.ws, false)
	})
	winner := map[idemstore.Key]idemstore.Write{}
	for g, a := range att {
		if a.err != nil {
			t.Fatalf("ReserveMany by caller %d: %v", g, a.err)
		}
		for j, k := range a.keys {
			if !a.written[j] {
				continue
			}
			if _, dup := winner[k]; dup {
				t.Fatalf("ReserveMany by %d callers at once: %s written twice", goroutines, k)
			}
			winner[k] = a.ws[j]
		}
	}
	for _, k := range keys {
		w, ok := winner[k]
		if !ok {
			t.Fatalf("ReserveMany by %d callers at once: nobody wrote %s", goroutines, k)
		}
		e.check(fmt.Sprintf("Get(%s) after the race", k), e.get(k), record(w), 0)
	}
	for g, a := range att {
		for j, k := range a.keys {
			if !a.written[j] {
				e.check(fmt.Sprintf("ReserveMany by caller %d, entry %s", g, k), a.existing[j], record(winner[k]), 0)
			}
		}
	}
}

// testExpiryReserveMany checks that the records ReserveMany writes expire
// with their own time to live.
func testExpiryReserveMany(t *testing.T, e *env) {
	e.bulk()
	keys := e.keys("expiry-many", 2)
	ws := []idemstore.Write{pending(token(), "fp", e.tick), pending(token(), "fp", longTTL)}
	e.reserveMany(keys, ws, false)
	e.pass(2 * e.tick)
	recs := e.getMany(keys)
	e.check("GetMany of the short lease after it passed", recs[0], idemstore.Record{}, 0)
	e.check("GetMany of the long lease", recs[1], record(ws[1]), 0)
}
