package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/idempg"
)

// checkout is a three-step body of Steps, as docs/effects.md shows it: a
// phase that reserves stock, an outside charge, a phase that records the
// order. It counts what each step did, and fails where told.
type checkout struct {
	reserves, charges, orders atomic.Int32
	keys                      sync.Map // downstream key of the charge -> charges with it
	failAt                    string   // "order": the order phase fails once, not for good
	failAfter                 string   // "order": the body fails after the order phase, once
	decline                   bool     // the charge fails for good
}

func (co *checkout) body(ctx context.Context, r *idempg.Run) (string, error) {
	key := ctx.Value(orderKey{}).(string)
	hold, err := idempg.Phase(r, "reserve", func(ctx context.Context, tx pgx.Tx) (string, error) {
		co.reserves.Add(1)
		return "hold-" + key, insertLedger(ctx, tx, key, "reserve")
	})
	if err != nil {
		return "", err
	}
	charge, err := idempg.Outside(r, "charge", func(ctx context.Context) (string, error) {
		co.charges.Add(1)
		k, _ := coordinator.DownstreamKey(ctx)
		n, _ := co.keys.LoadOrStore(k, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if co.decline {
			return "", idemconsume.Permanent(errors.New("card declined"))
		}
		return "ch_" + k[:8], nil
	})
	if err != nil {
		return "", err
	}
	order, err := idempg.Phase(r, "order", func(ctx context.Context, tx pgx.Tx) (string, error) {
		co.orders.Add(1)
		if co.failAt == "order" {
			co.failAt = ""
			return "", errors.New("the order table is busy")
		}
		return hold + "/" + charge, insertLedger(ctx, tx, key, "order")
	})
	if err != nil {
		return "", err
	}
	if co.failAfter == "order" {
		co.failAfter = ""
		return "", errors.New("the process stops after the order")
	}
	return order, nil
}

type orderKey struct{}

// stepsCall runs co's checkout for key.
func stepsCall(t *testing.T, c *coordinator.Coordinator, s *idempg.Store, key string, co *checkout) (coordinator.Result[string], error) {
	t.Helper()
	ctx := context.WithValue(t.Context(), orderKey{}, key)
	return idempg.StepsWithCodec(ctx, c, s, call(key), coordinator.JSONCodec[string]{}, co.body)
}

// ledgerOf returns the ledger rows of key by value.
func ledgerOf(t *testing.T, db *testDB, key string) map[string]int {
	t.Helper()
	rows, err := db.pool.Query(t.Context(), "SELECT value, count(*) FROM ledger WHERE key = $1 GROUP BY value", key)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct {
		v string
		n int
	}, error) {
		var x struct {
			v string
			n int
		}
		return x, row.Scan(&x.v, &x.n)
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, x := range out {
		m[x.v] = x.n
	}
	return m
}

func wantCounts(t *testing.T, what string, co *checkout, reserves, charges, orders int32) {
	t.Helper()
	if r, c, o := co.reserves.Load(), co.charges.Load(), co.orders.Load(); r != reserves || c != charges || o != orders {
		t.Fatalf("%s: reserve ran %d, charge %d, order %d times; want %d, %d, %d", what, r, c, o, reserves, charges, orders)
	}
}

// A call that stopped after its first phase resumes at the charge: the
// reserve does not run again, the charge is made again with the same
// downstream key (its answer was not kept: no phase committed after it),
// and a third call replays.
func TestStepsResumeAtTheFirstStepNotCommitted(t *testing.T) {
	db := newDB(t, 8)
	c, s := db.coord(t), db.store(t)
	key := uniqueKey("resume")
	co := &checkout{failAt: "order"}
	if _, err := stepsCall(t, c, s, key, co); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("first call: %v, want the order phase's error", err)
	}
	wantCounts(t, "first call", co, 1, 1, 1)
	if got := ledgerOf(t, db, key); got["reserve"] != 1 || got["order"] != 0 {
		t.Fatalf("ledger after the failed order: %v, want the reserve only", got)
	}
	res, err := stepsCall(t, c, s, key, co)
	if err != nil || res.Replayed || !strings.HasPrefix(res.Value, "hold-"+key+"/ch_") {
		t.Fatalf("retry: %+v, %v; want the order, run", res, err)
	}
	wantCounts(t, "retry", co, 1, 2, 2)
	again, err := stepsCall(t, c, s, key, co)
	if err != nil || !again.Replayed || again.Value != res.Value {
		t.Fatalf("third call: %+v, %v; want %q replayed", again, err, res.Value)
	}
	wantCounts(t, "third call", co, 1, 2, 2)
	if got := ledgerOf(t, db, key); got["reserve"] != 1 || got["order"] != 1 {
		t.Fatalf("ledger: %v, want one reserve and one order", got)
	}
	n := 0
	co.keys.Range(func(k, v any) bool {
		n++
		if c := v.(*atomic.Int32).Load(); c != 2 {
			t.Errorf("downstream key %v sent %d times, want both charges", k, c)
		}
		return true
	})
	if n != 1 {
		t.Fatalf("the two charges sent %d downstream keys, want 1", n)
	}
}

// An outside call's answer is kept once the next phase commits: a call that
// stops after that does not call out again.
func TestStepsKeepTheAnswerWithTheNextPhase(t *testing.T) {
	db := newDB(t, 8)
	c, s := db.coord(t), db.store(t)
	key := uniqueKey("kept")
	co := &checkout{failAfter: "order"}
	if _, err := stepsCall(t, c, s, key, co); err == nil {
		t.Fatal("first call: nil error, want the body's")
	}
	wantCounts(t, "first call", co, 1, 1, 1)
	res, err := stepsCall(t, c, s, key, co)
	if err != nil || res.Replayed {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	wantCounts(t, "retry", co, 1, 1, 1)
	if got := ledgerOf(t, db, key); got["reserve"] != 1 || got["order"] != 1 {
		t.Fatalf("ledger: %v, want one reserve and one order", got)
	}
}

// A step that fails for good is kept: later calls get its failure without
// running it, and the phase before it keeps what it committed.
func TestStepsReplayAFailureForGood(t *testing.T) {
	db := newDB(t, 8)
	c, s := db.coord(t), db.store(t)
	key := uniqueKey("declined")
	co := &checkout{decline: true}
	_, err := stepsCall(t, c, s, key, co)
	var sf *idempg.StepFailedError
	if !errors.As(err, &sf) || sf.Step != "charge" || sf.Reason != "card declined" || !errors.Is(errors.Unwrap(err), idemconsume.ErrPermanent) || !errors.Is(err, idemconsume.ErrPermanent) {
		t.Fatalf("first call: %s, want the charge's *StepFailedError wrapping the Permanent error", fmtErr(err))
	}
	for range 2 {
		_, err = stepsCall(t, c, s, key, co)
		if !errors.Is(err, idempg.ErrStepFailed) || !errors.As(err, &sf) || sf.Reason != "card declined" || errors.Unwrap(err) != nil {
			t.Fatalf("retry: %s, want the kept *StepFailedError", fmtErr(err))
		}
	}
	wantCounts(t, "three calls", co, 1, 1, 0)
	if got := ledgerOf(t, db, key); got["reserve"] != 1 || got["order"] != 0 {
		t.Fatalf("ledger: %v, want the reserve only", got)
	}
	if rec := record(t, s, "test.op", key); rec.State != idemstore.StateAbsent {
		t.Fatalf("record after a failure for good: %v, want none", rec.State)
	}
	// A phase's failure for good rolls its writes back and is kept too.
	key2 := uniqueKey("refused")
	runs := 0
	for range 2 {
		_, err := idempg.Steps(t.Context(), c, s, call(key2), func(ctx context.Context, r *idempg.Run) (int, error) {
			return idempg.Phase(r, "refuse", func(ctx context.Context, tx pgx.Tx) (int, error) {
				runs++
				if err := insertLedger(ctx, tx, key2, "refused"); err != nil {
					return 0, err
				}
				return 0, idemconsume.Permanent(errors.New("out of stock"))
			})
		})
		if !errors.As(err, &sf) || sf.Step != "refuse" || sf.Reason != "out of stock" {
			t.Fatalf("phase failed for good: %s", fmtErr(err))
		}
	}
	if runs != 1 || db.ledger(t, key2) != 0 {
		t.Fatalf("the refusing phase ran %d times and left %d rows; want 1 run and none", runs, db.ledger(t, key2))
	}
}

// Many callers of one key at once, on a SERIALIZABLE database and behind
// PgBouncer too: every step commits once, and all get the same order.
func TestStepsConcurrentCallers(t *testing.T) {
	for name, setup := range map[string]func(t *testing.T) *testDB{
		"read committed": func(t *testing.T) *testDB { return isolatedDB(t, "read committed") },
		"serializable":   func(t *testing.T) *testDB { return isolatedDB(t, "serializable") },
		"pgbouncer":      bouncerDB,
	} {
		t.Run(name, func(t *testing.T) {
			const keys, callers = 3, 12
			db := setup(t)
			c, s := db.coord(t), db.store(t)
			cos := make([]*checkout, keys)
			names := make([]string, keys)
			values := make([][]string, keys)
			var wg sync.WaitGroup
			for k := range keys {
				cos[k], names[k], values[k] = &checkout{}, uniqueKey("together"), make([]string, callers)
				for i := range callers {
					wg.Go(func() {
						res, err := stepsCall(t, c, s, names[k], cos[k])
						if err != nil {
							t.Errorf("key %d caller %d: %v", k, i, err)
						}
						values[k][i] = res.Value
					})
				}
			}
			wg.Wait()
			for k, name := range names {
				if r, o := cos[k].reserves.Load(), cos[k].orders.Load(); r < 1 || o < 1 {
					t.Errorf("key %d: reserve ran %d, order %d times", k, r, o)
				}
				if got := ledgerOf(t, db, name); got["reserve"] != 1 || got["order"] != 1 {
					t.Errorf("key %d: ledger %v, want one reserve and one order", k, got)
				}
				for i, v := range values[k] {
					if v != values[k][0] || v == "" {
						t.Errorf("key %d caller %d got %q, caller 0 %q", k, i, v, values[k][0])
					}
				}
			}
		})
	}
}

// A key's steps are the request that first committed one: another request
// under the same key is refused, before any of its steps runs.
func TestStepsKeyReuse(t *testing.T) {
	db := newDB(t, 8)
	c, s := db.coord(t), db.store(t)
	key := uniqueKey("reuse")
	co := &checkout{failAt: "order"}
	ctx := context.WithValue(t.Context(), orderKey{}, key)
	first := coordinator.Call{Operation: "test.op", Key: key, Fingerprint: "fp-a"}
	if _, err := idempg.Steps(ctx, c, s, first, co.body); err == nil {
		t.Fatal("first call: nil error, want the order's")
	}
	other := first
	other.Fingerprint = "fp-b"
	_, err := idempg.Steps(ctx, c, s, other, co.body)
	var kr *coordinator.KeyReuseError
	if !errors.As(err, &kr) || kr.Stored != "fp-a" || kr.Got != "fp-b" {
		t.Fatalf("another request under the key: %s, want *KeyReuseError", fmtErr(err))
	}
	wantCounts(t, "after the refused request", co, 1, 1, 1)
}

// Mistakes in a body are invalid requests, made before anything runs.
func TestStepsInvalid(t *testing.T) {
	db := newDB(t, 4)
	c, s := db.coord(t), db.store(t)
	noop := func(context.Context, pgx.Tx) (int, error) { return 1, nil }
	for name, body := range map[string]func(ctx context.Context, r *idempg.Run) (int, error){
		"a name used twice": func(ctx context.Context, r *idempg.Run) (int, error) {
			if _, err := idempg.Phase(r, "a", noop); err != nil {
				return 0, err
			}
			return idempg.Phase(r, "a", noop)
		},
		"an empty name": func(ctx context.Context, r *idempg.Run) (int, error) { return idempg.Phase(r, "", noop) },
		"a long name": func(ctx context.Context, r *idempg.Run) (int, error) {
			return idempg.Phase(r, strings.Repeat("x", 101), noop)
		},
		"a nil phase": func(ctx context.Context, r *idempg.Run) (int, error) { return idempg.Phase[int](r, "p", nil) },
		"a nil call":  func(ctx context.Context, r *idempg.Run) (int, error) { return idempg.Outside[int](r, "o", nil) },
		"an answer that is no JSON": func(ctx context.Context, r *idempg.Run) (int, error) {
			_, err := idempg.Outside(r, "o", func(context.Context) (func(), error) { return func() {}, nil })
			return 0, err
		},
	} {
		if _, err := idempg.Steps(t.Context(), c, s, call(uniqueKey("invalid")), body); !errors.Is(err, coordinator.ErrInvalidRequest) {
			t.Errorf("%s: %s, want ErrInvalidRequest", name, fmtErr(err))
		}
	}
	for name, run := range map[string]func() error{
		"nil coordinator": func() error { _, err := idempg.Steps[int](t.Context(), nil, s, call("k"), nil); return err },
		"nil store":       func() error { _, err := idempg.Steps[int](t.Context(), c, nil, call("k"), nil); return err },
		"nil body":        func() error { _, err := idempg.Steps[int](t.Context(), c, s, call("k"), nil); return err },
		"empty key":       func() error { _, err := idempg.Steps(t.Context(), c, s, call(""), noopBody); return err },
		"another store": func() error {
			_, err := idempg.Steps(t.Context(), c, newDB(t, 2).store(t), call(uniqueKey("other")), noopBody)
			return err
		},
	} {
		if err := run(); !errors.Is(err, coordinator.ErrInvalidRequest) {
			t.Errorf("%s: %s, want ErrInvalidRequest", name, fmtErr(err))
		}
	}
	// A step that changed its kind between runs.
	key := uniqueKey("kind")
	if _, err := idempg.Steps(t.Context(), c, s, call(key), func(ctx context.Context, r *idempg.Run) (int, error) {
		if _, err := idempg.Phase(r, "x", noop); err != nil {
			return 0, err
		}
		return 0, errors.New("stop")
	}); err == nil {
		t.Fatal("want the body's error")
	}
	_, err := idempg.Steps(t.Context(), c, s, call(key), func(ctx context.Context, r *idempg.Run) (int, error) {
		return idempg.Outside(r, "x", func(context.Context) (int, error) { return 1, nil })
	})
	if !errors.Is(err, coordinator.ErrInvalidRequest) || !strings.Contains(err.Error(), "committed as a phase step") {
		t.Fatalf("a phase that became an outside call: %s", fmtErr(err))
	}
}

func noopBody(context.Context, *idempg.Run) (int, error) { return 1, nil }

// With the kill switch off, the phases run and commit, and nothing is kept.
func TestStepsKillSwitch(t *testing.T) {
	db := newDB(t, 4)
	c, s := db.coord(t, coordinator.WithEnabled(false)), db.store(t)
	key := uniqueKey("off")
	co := &checkout{}
	for range 2 {
		if _, err := stepsCall(t, c, s, key, co); err != nil {
			t.Fatal(err)
		}
	}
	wantCounts(t, "two calls", co, 2, 2, 2)
	var steps int
	if err := db.pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_steps").Scan(&steps); err != nil || steps != 0 {
		t.Fatalf("%d steps kept (%v), want none", steps, err)
	}
}

// A completed key's steps live as long as its record, and the sweeper
// deletes expired ones.
func TestStepsLiveAsLongAsTheRecord(t *testing.T) {
	db := newDB(t, 4)
	c, s := db.coord(t), db.store(t)
	key := uniqueKey("ttl")
	cl := call(key)
	cl.TTL = 48 * time.Hour
	ctx := context.WithValue(t.Context(), orderKey{}, key)
	if _, err := idempg.Steps(ctx, c, s, cl, (&checkout{}).body); err != nil {
		t.Fatal(err)
	}
	var short int
	if err := db.pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_steps st JOIN idempotency_records r USING (operation, key)
		WHERE st.key = $1 AND st.expires_at < r.expires_at`, key).Scan(&short); err != nil || short != 0 {
		t.Fatalf("%d steps expire before the record (%v)", short, err)
	}
	if _, err := db.pool.Exec(t.Context(), "UPDATE idempotency_steps SET expires_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(t.Context(), 100); err != nil || n != 3 {
		t.Fatalf("Sweep = %d, %v; want the 3 expired steps", n, err)
	}
}

// The downstream key of an outside call is the step's: the same on every
// run, and another for another step or key.
func TestStepsDownstreamKeys(t *testing.T) {
	db := newDB(t, 4)
	c, s := db.coord(t), db.store(t)
	keysOf := func(key string) []string {
		var got []string
		_, err := idempg.Steps(t.Context(), c, s, call(key), func(ctx context.Context, r *idempg.Run) (int, error) {
			for _, name := range []string{"a", "b"} {
				if _, err := idempg.Outside(r, name, func(ctx context.Context) (int, error) {
					k, ok := coordinator.DownstreamKey(ctx)
					if !ok {
						return 0, errors.New("no downstream key")
					}
					got = append(got, k)
					return 1, nil
				}); err != nil {
					return 0, err
				}
			}
			return 0, errors.New("stop before keeping the answers")
		})
		if err == nil || err.Error() != "stop before keeping the answers" {
			t.Fatalf("body: %v", err)
		}
		return got
	}
	k := uniqueKey("down")
	first, again, other := keysOf(k), keysOf(k), keysOf(uniqueKey("down"))
	if fmt.Sprint(first) != fmt.Sprint(again) || first[0] == first[1] || other[0] == first[0] {
		t.Fatalf("downstream keys: %v, then %v, another key's %v", first, again, other)
	}
	inAction, _ := coordinator.DownstreamKey(coordinator.WithDownstreamStep(coordinator.WithDownstream(t.Context(), call(k)), "a"))
	if first[0] != inAction {
		t.Fatalf("step a's key %s, want the call's step key %s", first[0], inAction)
	}
}

// A kept failure's reason is valid UTF-8 of at most 256 bytes, whatever
// the error said, so that Inspect reads it.
func TestStepsReasonIsText(t *testing.T) {
	db := newDB(t, 4)
	c, s := db.coord(t), db.store(t)
	key := uniqueKey("reason")
	long := strings.Repeat("é", 200) + "\xff"
	_, err := idempg.Steps(t.Context(), c, s, call(key), func(ctx context.Context, r *idempg.Run) (int, error) {
		return idempg.Outside(r, "charge", func(context.Context) (int, error) { return 0, idemconsume.Permanent(errors.New(long)) })
	})
	var sf *idempg.StepFailedError
	if !errors.As(err, &sf) || len(sf.Reason) > 256 || len(sf.Reason) < 250 || !utf8.ValidString(sf.Reason) {
		t.Fatalf("Steps: %v; want a reason of at most 256 bytes of UTF-8", err)
	}
	infos, err := s.Inspect(t.Context(), idemstore.Key{Operation: "test.op", Key: key})
	if err != nil || len(infos[0].Steps) != 1 || infos[0].Steps[0].Reason != sf.Reason || !infos[0].Steps[0].Failed || !infos[0].Steps[0].Outside {
		t.Fatalf("Inspect: %+v, %v; want the charge's failure with its reason", infos, err)
	}
}
