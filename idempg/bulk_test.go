package idempg_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/storetest"
	"github.com/idemkit/idempotency/idempg"
)

// bulkSetups are the production setups the bulk methods are checked on: a
// database whose default isolation is SERIALIZABLE, and a PgBouncer in
// transaction pooling mode in front of one (exec mode).
var bulkSetups = []struct {
	name string
	open func(t *testing.T) *testDB
}{
	{"serializable", func(t *testing.T) *testDB { return isolatedDB(t, "serializable") }},
	{"pgbouncer_transaction_mode", bouncerDB},
}

// The whole conformance suite, the Bulk group with it, passes on each
// production setup.
func TestBulkConformanceSetups(t *testing.T) {
	for _, setup := range bulkSetups {
		t.Run(setup.name, func(t *testing.T) {
			db := setup.open(t)
			s := db.store(t)
			storetest.TestStore(t, func(t *testing.T) storetest.Harness {
				return storetest.Harness{
					Store:   s,
					Corrupt: func(t *testing.T, key idemstore.Key) { t.Helper(); corrupt(t, db, key) },
				}
			})
		})
	}
}

// Callers that reserve one batch of keys at once, each in its own order,
// with and without allOrNothing, on each production setup: no error
// (no deadlock or serialization failure reaches them), exactly one winner
// per key, every loser shown the winner's record; with allOrNothing, one
// caller wins every key and the others none.
func TestBulkConcurrentSetups(t *testing.T) {
	for _, setup := range bulkSetups {
		t.Run(setup.name, func(t *testing.T) {
			db := setup.open(t)
			s := db.store(t)
			for round := range 3 {
				for _, all := range []bool{false, true} {
					t.Run(fmt.Sprintf("round%d_allOrNothing_%v", round, all), func(t *testing.T) {
						raceReserveMany(t, s, 16, 24, all)
					})
				}
			}
		})
	}
}

// attempt is one caller's ReserveMany in raceReserveMany.
type attempt struct {
	keys     []idemstore.Key
	ws       []idemstore.Write
	existing []idemstore.Record
	written  []bool
	err      error
}

// raceReserveMany has callers reserve n keys at once, caller g starting
// at key g, and checks the outcome.
func raceReserveMany(t *testing.T, s *idempg.Store, callers, n int, all bool) {
	t.Helper()
	keys := bulkKeys("race", n)
	att := make([]attempt, callers)
	for g := range att {
		for j := range n {
			att[g].keys = append(att[g].keys, keys[(j+g)%n])
			att[g].ws = append(att[g].ws, pendingWrite())
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range att {
		a := &att[g]
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			a.existing, a.written, a.err = s.ReserveMany(ctx, a.keys, a.ws, all)
		})
	}
	close(start)
	wg.Wait()
	winner := map[idemstore.Key]idemstore.Write{}
	for g, a := range att {
		if a.err != nil {
			t.Fatalf("caller %d: %s", g, fmtErr(a.err))
		}
		wrote := 0
		for j, k := range a.keys {
			if !a.written[j] {
				continue
			}
			wrote++
			if _, dup := winner[k]; dup {
				t.Fatalf("%s written twice", k)
			}
			winner[k] = a.ws[j]
		}
		if all && wrote != 0 && wrote != n {
			t.Fatalf("caller %d with allOrNothing wrote %d of %d keys", g, wrote, n)
		}
	}
	recs, err := s.GetMany(t.Context(), keys)
	if err != nil {
		t.Fatalf("GetMany: %s", fmtErr(err))
	}
	for i, k := range keys {
		w, ok := winner[k]
		if !ok {
			t.Fatalf("nobody wrote %s", k)
		}
		checkRecord(t, "Get("+k.Key+") after the race", recs[i], w)
	}
	for g, a := range att {
		for j, k := range a.keys {
			if !a.written[j] {
				checkRecord(t, fmt.Sprintf("caller %d, entry %s", g, k), a.existing[j], winner[k])
			}
		}
	}
}

// A key given twice in an all-or-nothing batch is decided in order: the
// second entry replaces the first's completed record with its token, and a
// batch whose entries all write commits every last write; when an entry
// is refused, every entry's record is as it was before, the replaced
// record included.
func TestBulkAllOrNothingRollsBack(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	ctx := t.Context()
	keys := bulkKeys("aon", 3)
	old := completedWrite("old")
	mustReserveMany(t, s, keys[:1], []idemstore.Write{old}, false)
	held := pendingWrite()
	mustReserveMany(t, s, keys[2:], []idemstore.Write{held}, false)

	first := completedWrite("first")
	second := completedWrite("second")
	second.Replace, second.ReplaceToken = true, first.Token
	replacing := pendingWrite()
	replacing.Replace, replacing.ReplaceToken = true, old.Token
	batch := []idemstore.Key{keys[0], keys[1], keys[1], keys[2]}
	ws := []idemstore.Write{replacing, first, second, pendingWrite()}
	existing, written := mustReserveMany(t, s, batch, ws, true)
	for i := range batch {
		if written[i] {
			t.Errorf("entry %d written in a batch whose last entry was refused", i)
		}
	}
	checkRecord(t, "the refused entry", existing[3], held)
	for i := range 3 {
		if existing[i].State != idemstore.StateAbsent {
			t.Errorf("entry %d, which met no record, returned %+v", i, existing[i])
		}
	}
	recs, err := s.GetMany(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, "the replaced record after the rollback", recs[0], old)
	if recs[1].State != idemstore.StateAbsent {
		t.Errorf("the key written twice after the rollback: %+v, want absent", recs[1])
	}
	checkRecord(t, "the held record", recs[2], held)

	// Without the refused entry, every entry writes, the second entry of
	// keys[1] over the first.
	existing, written = mustReserveMany(t, s, batch[:3], ws[:3], true)
	for i := range 3 {
		if !written[i] {
			t.Errorf("entry %d not written: %+v", i, existing[i])
		}
	}
	if recs, err = s.GetMany(ctx, keys[:2]); err != nil {
		t.Fatal(err)
	}
	checkRecord(t, "the replaced key", recs[0], replacing)
	checkRecord(t, "the key written twice", recs[1], second)
}

// Bad batches are refused before anything is sent, with a
// *coordinator.StorageError of the method; an empty batch sends nothing.
func TestBulkRefusedBatches(t *testing.T) {
	db := newDB(t, 4)
	tr := &tracer{}
	s := tracedStore(t, db, tr)
	ctx := t.Context()
	keys := bulkKeys("refused", 2)
	zeroTTL := pendingWrite()
	zeroTTL.TTL = 0
	cases := []struct {
		name string
		m    idemevent.Method
		call func() error
	}{
		{"reserve_lengths", idemevent.MethodReserve, func() error {
			_, _, err := s.ReserveMany(ctx, keys, []idemstore.Write{pendingWrite()}, false)
			return err
		}},
		{"reserve_ttl", idemevent.MethodReserve, func() error {
			_, _, err := s.ReserveMany(ctx, keys, []idemstore.Write{pendingWrite(), zeroTTL}, true)
			return err
		}},
		{"complete_lengths", idemevent.MethodComplete, func() error {
			_, err := s.CompleteMany(ctx, keys, []string{"t"}, make([]idemstore.Completion, 2))
			return err
		}},
		{"complete_pending", idemevent.MethodComplete, func() error {
			_, err := s.CompleteMany(ctx, keys[:1], []string{"t"}, []idemstore.Completion{{State: idemstore.StatePending, TTL: time.Minute}})
			return err
		}},
		{"delete_invalid_key", idemevent.MethodRelease, func() error {
			_, err := s.DeleteMany(ctx, []idemstore.Key{{Operation: "test.op", Key: ""}})
			return err
		}},
	}
	for _, tc := range cases {
		tr.reset()
		err := tc.call()
		var se *coordinator.StorageError
		if !errors.As(err, &se) || se.Method != tc.m {
			t.Errorf("%s: %s, want a *coordinator.StorageError of method %s", tc.name, fmtErr(err), tc.m)
		}
		if b, q := tr.counts(); b+q != 0 {
			t.Errorf("%s: %d batches and %d queries sent, want none", tc.name, b, q)
		}
	}
	tr.reset()
	if recs, err := s.GetMany(ctx, nil); err != nil || len(recs) != 0 {
		t.Errorf("GetMany(no keys) = %v, %v", recs, err)
	}
	if ex, wr, err := s.ReserveMany(ctx, nil, nil, true); err != nil || len(ex)+len(wr) != 0 {
		t.Errorf("ReserveMany(no keys) = %v, %v, %v", ex, wr, err)
	}
	if ok, err := s.CompleteMany(ctx, nil, nil, nil); err != nil || len(ok) != 0 {
		t.Errorf("CompleteMany(no keys) = %v, %v", ok, err)
	}
	if b, q := tr.counts(); b+q != 0 {
		t.Errorf("empty batches: %d batches and %d queries sent, want none", b, q)
	}
}

// Each bulk method takes one round trip for 500 keys, with a fixed
// number of statements in it (BEGIN, the lock wait, the INSERT and the
// read of what it met, COMMIT for ReserveMany); with allOrNothing,
// ReserveMany takes three (BEGIN; the holder's settings and the
// statements; COMMIT).
func TestBulkRoundTrips(t *testing.T) {
	db := newDB(t, 4)
	tr := &tracer{}
	s := tracedStore(t, db, tr)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const n = 500
	keys := bulkKeys("trips", n)
	ws := make([]idemstore.Write, n)
	tokens := make([]string, n)
	cs := make([]idemstore.Completion, n)
	for i := range ws {
		ws[i] = pendingWrite()
		tokens[i] = ws[i].Token
		cs[i] = idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(strconv.Itoa(i)), TTL: time.Minute}
	}
	steps := []struct {
		name               string
		batches, queries   int
		maxBatchStatements int
		call               func() error
	}{
		{"ReserveMany", 1, 0, 5, func() error {
			_, written, err := s.ReserveMany(ctx, keys, ws, false)
			return allTrue(written, err)
		}},
		{"CompleteMany", 1, 0, 3, func() error {
			ok, err := s.CompleteMany(ctx, keys, tokens, cs)
			return allTrue(ok, err)
		}},
		{"GetMany", 1, 0, 1, func() error {
			_, err := s.GetMany(ctx, keys)
			return err
		}},
		{"DeleteMany", 1, 0, 3, func() error {
			d, err := s.DeleteMany(ctx, keys)
			if err == nil && d != n {
				err = fmt.Errorf("%d deleted", d)
			}
			return err
		}},
		{"ReserveMany_allOrNothing", 1, 2, 4, func() error {
			_, written, err := s.ReserveMany(ctx, keys, ws, true)
			return allTrue(written, err)
		}},
	}
	for _, st := range steps {
		tr.reset()
		if err := st.call(); err != nil {
			t.Fatalf("%s: %s", st.name, fmtErr(err))
		}
		b, q := tr.counts()
		if b != st.batches || q != st.queries {
			t.Errorf("%s of %d keys: %d batches and %d queries, want %d and %d", st.name, n, b, q, st.batches, st.queries)
		}
		if m := int(tr.maxStatements.Load()); m > st.maxBatchStatements {
			t.Errorf("%s of %d keys: %d statements in a batch, want at most %d", st.name, n, m, st.maxBatchStatements)
		}
	}
}

// tracer counts the round trips of a pool: batches, and queries outside
// them, and the most statements one batch held.
type tracer struct {
	batches, queries, maxStatements atomic.Int64
}

func (tr *tracer) reset() {
	tr.batches.Store(0)
	tr.queries.Store(0)
	tr.maxStatements.Store(0)
}

func (tr *tracer) counts() (batches, queries int) {
	return int(tr.batches.Load()), int(tr.queries.Load())
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	tr.queries.Add(1)
	return ctx
}

func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	tr.batches.Add(1)
	for {
		m := tr.maxStatements.Load()
		if int64(d.Batch.Len()) <= m || tr.maxStatements.CompareAndSwap(m, int64(d.Batch.Len())) {
			return ctx
		}
	}
}

func (tr *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (tr *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tracedStore returns a Store on db through a pool of its own that tr
// traces.
func tracedStore(t *testing.T, db *testDB, tr *tracer) *idempg.Store {
	t.Helper()
	cfg := db.pool.Config()
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	s, err := idempg.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// allTrue returns err, or an error when a flag of flags is false.
func allTrue(flags []bool, err error) error {
	for i, f := range flags {
		if err == nil && !f {
			err = fmt.Errorf("entry %d: false", i)
		}
	}
	return err
}

func mustReserveMany(t *testing.T, s *idempg.Store, keys []idemstore.Key, ws []idemstore.Write, all bool) ([]idemstore.Record, []bool) {
	t.Helper()
	existing, written, err := s.ReserveMany(t.Context(), keys, ws, all)
	if err != nil {
		t.Fatalf("ReserveMany: %s", fmtErr(err))
	}
	return existing, written
}

// checkRecord fails the test unless rec is the record that w wrote, with
// a TTL within w's.
func checkRecord(t *testing.T, what string, rec idemstore.Record, w idemstore.Write) {
	t.Helper()
	want := idemstore.Record{State: w.State, Token: w.Token, Fingerprint: w.Fingerprint}
	if w.State != idemstore.StatePending {
		want.Result = w.Result
	}
	if rec.State != want.State || rec.Token != want.Token || rec.Fingerprint != want.Fingerprint ||
		string(rec.Result) != string(want.Result) || rec.TTL <= 0 || rec.TTL > w.TTL {
		t.Errorf("%s: %+v, want %+v with a TTL in (0, %v]", what, rec, want, w.TTL)
	}
}

// bulkKeys returns n keys of operation "test.op" nobody else uses.
func bulkKeys(name string, n int) []idemstore.Key {
	prefix := uniqueKey(name)
	keys := make([]idemstore.Key, n)
	for i := range keys {
		keys[i] = idemstore.Key{Operation: "test.op", Key: prefix + "." + strconv.Itoa(i)}
	}
	return keys
}

func pendingWrite() idemstore.Write {
	return idemstore.Write{State: idemstore.StatePending, Token: rand.Text()[:16], Fingerprint: "fp", TTL: time.Minute}
}

func completedWrite(result string) idemstore.Write {
	return idemstore.Write{State: idemstore.StateCompleted, Token: rand.Text()[:16], Fingerprint: "fp", Result: []byte(result), TTL: time.Minute}
}

// A key that Do's open transaction holds: ReserveMany, with and without
// allOrNothing, waits for it within its deadline and then fails with a
// *coordinator.StorageError that matches ErrConflict, having written
// nothing.
func TestBulkReserveWhileDoHolds(t *testing.T) {
	db := newDB(t, 8)
	c := db.coord(t)
	s := db.store(t)
	keys := bulkKeys("held", 3)
	inside := make(chan struct{})
	release, open := gate(t)
	done := make(chan error, 1)
	go func() {
		_, err := idempg.Do(context.Background(), c, call(keys[1].Key), func(ctx context.Context, tx pgx.Tx) (string, error) {
			close(inside)
			<-release
			return "held", nil
		})
		done <- err
	}()
	<-inside
	for _, all := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		began := time.Now()
		_, _, err := s.ReserveMany(ctx, keys, []idemstore.Write{pendingWrite(), pendingWrite(), pendingWrite()}, all)
		cancel()
		within(t, "ReserveMany of a held key", time.Since(began), time.Second)
		var se *coordinator.StorageError
		if !errors.As(err, &se) || se.Method != idemevent.MethodReserve || !errors.Is(err, coordinator.ErrConflict) {
			t.Errorf("allOrNothing %v: %s, want a *StorageError of reserve matching ErrConflict", all, fmtErr(err))
		}
		for _, k := range []idemstore.Key{keys[0], keys[2]} {
			if rec := record(t, s, k.Operation, k.Key); rec.State != idemstore.StateAbsent {
				t.Errorf("allOrNothing %v: %s after the failed call: %+v, want absent", all, k, rec)
			}
		}
	}
	open()
	if err := <-done; err != nil {
		t.Fatalf("Do: %v", err)
	}
}

// A key given twice to CompleteMany: only the first entry with the
// owner's token completes it.
func TestBulkCompleteManySameKey(t *testing.T) {
	db := newDB(t, 4)
	s := db.store(t)
	keys := bulkKeys("complete-twice", 2)
	ws := []idemstore.Write{pendingWrite(), pendingWrite()}
	mustReserveMany(t, s, keys, ws, false)
	c := func(r string) idemstore.Completion {
		return idemstore.Completion{State: idemstore.StateCompleted, Result: []byte(r), TTL: time.Minute}
	}
	batch := []idemstore.Key{keys[0], keys[0], keys[1], keys[1]}
	tokens := []string{ws[0].Token, ws[0].Token, "other", ws[1].Token}
	ok, err := s.CompleteMany(t.Context(), batch, tokens, []idemstore.Completion{c("a1"), c("a2"), c("b1"), c("b2")})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ok) != "[true false false true]" {
		t.Errorf("CompleteMany: %v, want [true false false true]", ok)
	}
	recs, err := s.GetMany(t.Context(), keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"a1", "b2"} {
		w := ws[i]
		w.State, w.Result = idemstore.StateCompleted, []byte(want)
		checkRecord(t, "the completed key", recs[i], w)
	}
}
