package idempg_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/internal/pgtest"
)

// The storms: many concurrent callers per key, whose action inserts a
// ledger row through the transaction, under faults: none (baseline), the
// client process killed (stormproc_test.go), the holder's backend
// terminated, the server killed and restarted, statement and lock timeouts
// with short deadlines. After each, the checker (stormcheck_test.go) checks
// by SQL that the ledger has one row per completed key and no other, and
// with porcupine that the history of every key is that of a write-once
// register.

// stormOp is the operation of every storm's calls.
const stormOp = "storm.ledger"

// stormCoordinator returns the coordinator that a storm's calls go
// through: over an idempg Store on pool, with in-flight mode mode and wait
// timeout wait (0: the default). With stormDo, it is the only code that
// follows the API of the transactional call.
func stormCoordinator(pool *pgxpool.Pool, mode coordinator.InFlightMode, wait time.Duration, opts ...coordinator.Option) (*coordinator.Coordinator, error) {
	store, err := idempg.New(pool)
	if err != nil {
		return nil, err
	}
	return coordinator.New(store, append([]coordinator.Option{coordinator.WithInFlight(mode), coordinator.WithWaitTimeout(wait)}, opts...)...)
}

// stormDo is every storm's call of the transactional call.
func stormDo(ctx context.Context, c *coordinator.Coordinator, key string, action func(context.Context, pgx.Tx) (string, error)) (coordinator.Result[string], error) {
	return idempg.DoResult(ctx, c, coordinator.Call{Operation: stormOp, Key: key}, action)
}

// stormValue is the value of an action's attempt: the key, the process and
// the attempt, so that a second run, or a replay of another key's result,
// shows.
func stormValue(key string, attempt int64) string {
	return fmt.Sprintf("%s@p%d#%d", key, os.Getpid(), attempt)
}

// stormKeys returns n keys with prefix.
func stormKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return keys
}

// stormPool returns a pool of up to maxConns connections on dsn, with
// search_path schema and the run-time parameters params.
func stormPool(t *testing.T, dsn, schema string, maxConns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse DSN: %v", err)
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// storm records the calls of one storm.
type storm struct {
	t        *testing.T
	name     string
	h        stormHistory
	ids      atomic.Int64
	attempts atomic.Int64 // the actions' attempts, for their values
	kills    atomic.Int64 // faults injected: processes or backends killed, servers crashed
}

func newStorm(t *testing.T, name string) *storm { return &storm{t: t, name: name} }

// coordinator returns stormCoordinator's coordinator; it fails the test on
// an error and closes the coordinator with the test.
func (st *storm) coordinator(pool *pgxpool.Pool, mode coordinator.InFlightMode, wait time.Duration, opts ...coordinator.Option) *coordinator.Coordinator {
	st.t.Helper()
	c, err := stormCoordinator(pool, mode, wait, opts...)
	if err != nil {
		st.t.Fatalf("coordinator: %v", err)
	}
	st.t.Cleanup(func() { _ = c.Close() })
	return c
}

// call makes one call of Do on key through c and records it. Its action
// inserts the ledger row with its value, then runs extra (if set) with the
// attempt's number, and returns the value.
func (st *storm) call(ctx context.Context, c *coordinator.Coordinator, key string, extra func(ctx context.Context, tx pgx.Tx, attempt int64) error) *stormCall {
	rec := &stormCall{id: int(st.ids.Add(1)), key: key}
	rec.client = rec.id
	var actErr error
	rec.start = clockNow()
	res, err := stormDo(ctx, c, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
		rec.actions++
		n := st.attempts.Add(1)
		rec.own = stormValue(key, n)
		if err := insertLedger(ctx, tx, key, rec.own); err != nil {
			actErr = fmt.Errorf("storm action: %w", err)
			return "", actErr
		}
		if extra != nil {
			if err := extra(ctx, tx, n); err != nil {
				actErr = fmt.Errorf("storm action: %w", err)
				return "", actErr
			}
		}
		rec.effect = true
		return rec.own, nil
	})
	rec.end = clockNow()
	rec.class = classify(res, err, actErr)
	rec.value, rec.replayed = res.Value, res.Replayed
	if err != nil {
		rec.value = ""
		rec.err = err.Error()
	}
	st.h.add(rec)
	return rec
}

// wave runs callers concurrent callers on each of keys: the callers of a
// key start together, behind a gate, and the wave ends when every call has
// returned. call is one caller's work.
func (st *storm) wave(keys []string, callers int, call func(caller int, key string)) {
	var wg sync.WaitGroup
	for _, key := range keys {
		gate := make(chan struct{})
		for i := range callers {
			wg.Go(func() {
				<-gate
				call(i, key)
			})
		}
		close(gate)
	}
	wg.Wait()
}

// counts returns the storm's calls by class, without the final pass, and
// the calls whose outcome is unknown.
func (st *storm) counts() (byClass map[stormClass]int, unknown int) {
	byClass = map[stormClass]int{}
	for _, c := range st.h.snapshot() {
		if !c.final {
			byClass[c.class]++
			if c.unknown() {
				unknown++
			}
		}
	}
	return byClass, unknown
}

// errorsWith counts the storm's calls whose error contains s.
func (st *storm) errorsWith(s string) int {
	n := 0
	for _, c := range st.h.snapshot() {
		if strings.Contains(c.err, s) {
			n++
		}
	}
	return n
}

// finish ends a storm, once its faults are over: one call per key in mode
// wait on pool (the final pass; each must return a value), then one more per
// key that must replay what the ledger holds, then the SQL invariants, the
// values of the ledger against the calls' and the records', and the history
// with porcupine. It logs the storm's figures and fails the test on any
// finding. It returns what committed.
func (st *storm) finish(ctx context.Context, pool *pgxpool.Pool, keys []string) ledgerState {
	t := st.t
	t.Helper()
	c := st.coordinator(pool, coordinator.InFlightWait, time.Minute)
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	pass := func() []*stormCall {
		recs := make([]*stormCall, len(keys))
		var wg sync.WaitGroup
		for i, key := range keys {
			wg.Go(func() {
				recs[i] = st.call(fctx, c, key, nil)
				recs[i].final = true
			})
		}
		wg.Wait()
		return recs
	}
	pass()
	replays := pass()

	finalAt := clockNow()
	l, err := readLedger(ctx, pool, stormOp)
	if err != nil {
		t.Fatalf("storm %s: %v", st.name, err)
	}
	st.h.final, st.h.finalAt = l.committed, finalAt

	problems := l.violations()
	calls := st.h.snapshot()
	produced := map[string]bool{}
	for _, c := range calls {
		if c.own != "" {
			produced[c.own] = true
		}
	}
	for _, k := range slices.Sorted(maps.Keys(l.ledger)) {
		for _, v := range l.ledger[k] {
			if !produced[v] {
				problems = append(problems, fmt.Sprintf("ledger row %s=%q that no action of the storm produced", k, v))
			}
			if !slices.Contains(keys, k) {
				problems = append(problems, fmt.Sprintf("ledger row of key %s, not a key of the storm", k))
			}
		}
	}
	for _, c := range calls {
		if c.final && c.ok() && !slices.Equal(l.ledger[c.key], []string{c.value}) {
			problems = append(problems, fmt.Sprintf("key %s: the final call returned %q (%s), the ledger holds %q", c.key, c.value, c.class, l.ledger[c.key]))
		}
	}
	for _, c := range replays {
		if c.class != classReplay {
			problems = append(problems, fmt.Sprintf("key %s: the call after the final pass ended in %s (%s), want a replay", c.key, c.class, c.err))
		}
	}
	if l.completed != len(keys) {
		problems = append(problems, fmt.Sprintf("%d of %d keys completed after the final pass", l.completed, len(keys)))
	}
	v := checkHistory(&st.h)
	problems = append(problems, v.problems...)

	byClass, unknown := st.counts()
	finalRuns, finalReplays := 0, 0
	for _, c := range calls {
		if c.final {
			switch c.class {
			case classRun:
				finalRuns++
			case classReplay:
				finalReplays++
			}
		}
	}
	t.Logf("storm %s: calls=%d runs=%d replays=%d in_progress=%d storage_errors=%d action_errors=%d context_errors=%d unknown_outcome=%d killed_calls=%d kills=%d | final passes: runs=%d replays=%d | keys=%d completed=%d ledger_rows=%d | porcupine: %s (history of %d calls, checked in %v)",
		st.name, len(calls)-2*len(keys), byClass[classRun], byClass[classReplay], byClass[classInProgress], byClass[classStorage],
		byClass[classAction], byClass[classContext], unknown, byClass[classKilled], st.kills.Load(),
		finalRuns, finalReplays, len(keys), l.completed, l.ledgerRows, v.linearizable, len(calls), v.checkTime.Round(time.Millisecond))
	if testing.Verbose() {
		st.logErrors()
	}
	if len(v.unproven) > 0 {
		t.Logf("storm %s: porcupine did not finish within %v on keys %v (checked call by call instead)", st.name, keyTimeout, v.unproven)
	}
	for i, p := range problems {
		if i == 20 {
			t.Errorf("storm %s: ... and %d more", st.name, len(problems)-i)
			break
		}
		t.Errorf("storm %s: %s", st.name, p)
	}
	return l
}

// numbers matches the numbers of an error message: keys, pids, offsets.
var numbers = regexp.MustCompile(`[0-9]+`)

// logErrors logs the storm's errors by class and message, numbers
// blotted out, most frequent first.
func (st *storm) logErrors() {
	n := map[string]int{}
	for _, c := range st.h.snapshot() {
		if c.err != "" {
			n[c.class.String()+": "+numbers.ReplaceAllString(c.err, "N")]++
		}
	}
	msgs := slices.SortedFunc(maps.Keys(n), func(a, b string) int { return cmp.Or(n[b]-n[a], strings.Compare(a, b)) })
	for _, m := range msgs {
		st.t.Logf("storm %s: %4d × %s", st.name, n[m], m)
	}
}

// sleepSQL returns a statement that holds the transaction for d, tagged so
// that pg_stat_activity shows it as the storm's action.
func sleepSQL(d time.Duration) string {
	return fmt.Sprintf("SELECT pg_sleep(%.3f) /* storm-action */", d.Seconds())
}

// TestStormBaseline: no fault. 24 keys × 12 concurrent callers, in modes
// wait and raise; every action holds its transaction for a few
// milliseconds, so that the callers of a key meet it.
func TestStormBaseline(t *testing.T) {
	for _, mode := range []coordinator.InFlightMode{coordinator.InFlightWait, coordinator.InFlightRaise} {
		t.Run(string(mode), func(t *testing.T) {
			db := newDB(t, 16)
			st := newStorm(t, "baseline/"+string(mode))
			c := st.coordinator(db.pool, mode, time.Minute)
			keys := stormKeys("base", 24)
			hold := func(ctx context.Context, tx pgx.Tx, _ int64) error {
				_, err := tx.Exec(ctx, sleepSQL(3*time.Millisecond))
				return err
			}
			for chunk := range slices.Chunk(keys, 12) {
				st.wave(chunk, 12, func(_ int, key string) { st.call(t.Context(), c, key, hold) })
			}
			// Without faults every key runs once, and in mode wait every
			// call returns a value; in mode raise a caller that meets the
			// holder hears ErrInProgress.
			byClass, _ := st.counts()
			if byClass[classRun] != len(keys) {
				t.Errorf("%d runs, want one per key (%d)", byClass[classRun], len(keys))
			}
			for cl, n := range byClass {
				switch {
				case cl == classRun || cl == classReplay:
				case cl == classInProgress && mode == coordinator.InFlightRaise:
				default:
					t.Errorf("%d calls ended in %s, want none without faults in mode %s", n, cl, mode)
				}
			}
			st.finish(t.Context(), db.pool, keys)
		})
	}
}

// TestStormBackendTerminated: the holder's backend terminated during a
// storm. Every fourth action, after its ledger row, asks an admin
// connection to terminate its own backend (pg_terminate_backend, which
// waits for the backend to exit) and then goes on, so that its transaction
// dies between the effect and the commit. With each such request the admin
// connection also terminates one more backend of the storm's pool, found in
// pg_stat_activity by application_name: one running an action (by its
// query text) or one in any phase (a Get, a claim waiting for the holder,
// a completion, a COMMIT).
func TestStormBackendTerminated(t *testing.T) {
	db := newDB(t, 8)
	const app = "idempg-storm-victim"
	victims := stormPool(t, server.DSN, db.schema, 24, map[string]string{"application_name": app})
	st := newStorm(t, "backend-terminated")
	c := st.coordinator(victims, coordinator.InFlightWait, time.Minute)

	admin, err := pgx.Connect(t.Context(), server.DSN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	type request struct {
		pid  uint32
		done chan struct{}
	}
	requests := make(chan request)
	var terminator sync.WaitGroup
	var targeted, random atomic.Int64
	terminator.Go(func() {
		ctx := context.Background()
		for i := 0; ; i++ {
			req, ok := <-requests
			if !ok {
				return
			}
			var killed bool
			if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, req.pid).Scan(&killed); err != nil {
				t.Errorf("terminate backend %d: %v", req.pid, err)
			} else if killed {
				targeted.Add(1)
			}
			// One more: by query text (a running action), or any phase.
			where := `state <> 'idle'`
			if i%2 == 0 {
				where = `query LIKE '%storm-action%'`
			}
			err := admin.QueryRow(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> $2 AND pid <> pg_backend_pid() AND `+where+`
ORDER BY random() LIMIT 1`, app, req.pid).Scan(&killed)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				t.Errorf("terminate a backend: %v", err)
			case killed:
				random.Add(1)
			}
			close(req.done)
		}
	})

	action := func(ctx context.Context, tx pgx.Tx, attempt int64) error {
		if attempt%4 != 0 {
			_, err := tx.Exec(ctx, sleepSQL(2*time.Millisecond))
			return err
		}
		var pid uint32
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		req := request{pid: pid, done: make(chan struct{})}
		select {
		case requests <- req:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-req.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		// The backend is gone: this fails, and the action with it.
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}
	keys := stormKeys("term", 48)
	for chunk := range slices.Chunk(keys, 12) {
		st.wave(chunk, 6, func(_ int, key string) { st.call(t.Context(), c, key, action) })
	}
	close(requests)
	terminator.Wait()
	st.kills.Store(targeted.Load() + random.Load())
	t.Logf("terminated: %d backends between the effect and the commit, %d others", targeted.Load(), random.Load())
	if targeted.Load() == 0 {
		t.Errorf("no backend was terminated between the effect and the commit")
	}
	st.finish(t.Context(), db.pool, keys)
}

// TestStormServerRestart: the server killed and restarted. On a server of
// its own, the storm runs waves of callers (10 keys × 5 callers) that retry
// a call that failed, with a short backoff, until they get a value, as a
// client does; in two of the waves an action (the fifth of the wave) has
// the postmaster killed with SIGKILL while the others claim, wait, run and
// commit, and the server is started again on the same data directory and
// port (crash recovery). The pool reconnects by itself. The clients ask
// for synchronous_commit=on: the test server runs with it off, for speed,
// and a COMMIT that returned must survive the crash, as it does on a
// production server.
func TestStormServerRestart(t *testing.T) {
	if server == nil {
		pgtest.Skip(t, serverErr)
	}
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatalf("start a server of the test's own: %v", err)
	}
	t.Cleanup(srv.Stop)
	pool := stormPool(t, srv.DSN, "", 16, map[string]string{"synchronous_commit": "on", "application_name": "idempg-storm-crash"})
	if err := idempg.Migrate(t.Context(), pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE ledger (key text NOT NULL, value text NOT NULL)`); err != nil {
		t.Fatalf("create ledger: %v", err)
	}
	st := newStorm(t, "server-restart")
	c := st.coordinator(pool, coordinator.InFlightWait, 30*time.Second)

	// The crasher kills and restarts the server when an action asks.
	crash := make(chan struct{}, 1)
	restarted := make(chan error, 1)
	var crasher sync.WaitGroup
	crasher.Go(func() {
		for range crash {
			start := time.Now()
			err := srv.Kill()
			if err == nil {
				st.kills.Add(1)
				err = srv.Restart()
			}
			if err == nil {
				t.Logf("server killed and restarted in %v", time.Since(start).Round(time.Millisecond))
			}
			restarted <- err
		}
	})
	defer func() {
		close(crash)
		crasher.Wait()
	}()

	keys := stormKeys("crash", 60)
	for w, chunk := range slices.Collect(slices.Chunk(keys, 10)) {
		crashes := w == 1 || w == 3
		var actions atomic.Int64
		action := func(ctx context.Context, tx pgx.Tx, _ int64) error {
			if crashes && actions.Add(1) == 5 {
				crash <- struct{}{}
			}
			_, err := tx.Exec(ctx, sleepSQL(2*time.Millisecond))
			return err
		}
		st.wave(chunk, 5, func(_ int, key string) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			backoff := 5 * time.Millisecond
			for range 200 {
				if st.call(ctx, c, key, action).ok() || ctx.Err() != nil {
					return
				}
				time.Sleep(backoff) // a client's backoff before it retries
				backoff = min(2*backoff, 100*time.Millisecond)
			}
		})
		if crashes {
			if err := <-restarted; err != nil {
				t.Fatalf("kill and restart the server: %v", err)
			}
		}
	}
	if st.kills.Load() != 2 {
		t.Errorf("the server crashed %d times, want 2", st.kills.Load())
	}
	st.finish(t.Context(), pool, keys)
}

// TestStormTimeouts: statement and lock timeouts, short deadlines and wait
// timeouts. Half the callers use a pool whose sessions have
// statement_timeout=150ms and lock_timeout=50ms, half a pool with neither;
// their coordinators wait 40ms or 2s, or raise; their contexts end after
// 25ms, 100ms or 300ms, or 10s (half of them). The actions, by attempt:
// hold the transaction for 200ms (longer than the statement timeout: the
// action fails on the short pool, and holds the key past the short waits on
// the other), take an advisory lock that other actions hold for 70ms
// (longer than the lock timeout), stall in the client for 60ms (past the
// shorter deadlines, so that the completion or the COMMIT is cut), or end
// at once.
func TestStormTimeouts(t *testing.T) {
	db := newDB(t, 16)
	short := stormPool(t, server.DSN, db.schema, 16, map[string]string{
		"statement_timeout": "150ms", "lock_timeout": "50ms", "application_name": "idempg-storm-timeouts"})
	st := newStorm(t, "timeouts")
	coords := []*coordinator.Coordinator{
		st.coordinator(short, coordinator.InFlightWait, 40*time.Millisecond),
		st.coordinator(short, coordinator.InFlightWait, 2*time.Second),
		st.coordinator(db.pool, coordinator.InFlightWait, 40*time.Millisecond),
		st.coordinator(db.pool, coordinator.InFlightWait, 2*time.Second),
		st.coordinator(short, coordinator.InFlightRaise, 0),
		st.coordinator(db.pool, coordinator.InFlightRaise, 0),
	}
	deadlines := []time.Duration{25 * time.Millisecond, 10 * time.Second, 100 * time.Millisecond, 10 * time.Second, 300 * time.Millisecond, 10 * time.Second}
	action := func(ctx context.Context, tx pgx.Tx, attempt int64) error {
		switch attempt % 4 {
		case 0:
			_, err := tx.Exec(ctx, sleepSQL(200*time.Millisecond))
			return err
		case 1:
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(424242)`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sleepSQL(70*time.Millisecond))
			return err
		case 2:
			t := time.NewTimer(60 * time.Millisecond) // a slow action
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return nil // and Do goes on to complete and commit, with what is left of ctx
		}
		return nil
	}
	keys := stormKeys("timeout", 40)
	for chunk := range slices.Chunk(keys, 10) {
		st.wave(chunk, 6, func(caller int, key string) {
			c := coords[caller%len(coords)]
			d := deadlines[(caller+slices.Index(keys, key))%len(deadlines)]
			ctx, cancel := context.WithTimeout(t.Context(), d)
			defer cancel()
			st.call(ctx, c, key, action)
		})
	}
	t.Logf("statement timeouts (57014): %d calls; lock timeouts (55P03): %d calls",
		st.errorsWith("SQLSTATE 57014"), st.errorsWith("SQLSTATE 55P03"))
	st.finish(t.Context(), db.pool, keys)
}
