package idempg_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/idemkit/idempotency/coordinator"
)

// The checker of the storms (storm_test.go, stormproc_test.go).
//
// A storm records every call of the transactional call as an operation: its
// start and end on one clock (CLOCK_MONOTONIC, which every process of the
// machine shares, so that the calls of child processes and of the test
// process are ordered on it), its key, the value its action produced (every
// attempt produces a value of its own), and how it ended. After the storm,
// the checker reads what committed: the records and the ledger.
//
// The model, per key, is a write-once register: its state is the value
// that the one committed run wrote, or none. A call that returned a value
// is a read of the register (a replay: the value must be the state) or the
// one write (a run: allowed only when nothing is committed, and the value
// must be the action's own). A call that ended in an error before its
// action made its effect, or whose action failed (the transaction rolled
// back), constrains nothing. A call whose action made its effect and that
// then did not return a value (a storage error of the completion or of
// COMMIT, whose outcome may be unknown; a process killed) may have
// committed its value or not, at any moment after it started: it ends at
// infinity. After the storm one read per key says what committed: the
// register must hold it. porcupine checks that each key's history is
// linearizable under this model; the checks besides porcupine (checkHistory)
// catch the same faults call by call, and the SQL checks (readLedger) that
// the ledger and the records agree row by row.

// clockNow is the storms' clock: CLOCK_MONOTONIC in nanoseconds, shared by
// the processes of the machine.
func clockNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// never is the end of a call that may take effect at any time after it
// started.
const never = int64(math.MaxInt64)

// stormClass is how a call ended.
type stormClass uint8

const (
	classRun        stormClass = iota // returned its own action's value (Replayed false)
	classReplay                       // returned a stored value (Replayed true)
	classInProgress                   // coordinator.ErrInProgress
	classStorage                      // a *coordinator.StorageError
	classAction                       // the action's own error, returned unchanged: rolled back
	classContext                      // the caller's context ended
	classKilled                       // its process was killed: no answer
	classOther                        // anything else: never expected
)

var classNames = [...]string{"run", "replay", "in_progress", "storage", "action_error", "context", "killed", "other"}

func (c stormClass) String() string { return classNames[c] }

// parseClass is the inverse of String.
func parseClass(s string) (stormClass, bool) {
	i := slices.Index(classNames[:], s)
	return stormClass(i), i >= 0
}

// classify returns the class of what a call returned; actErr is the error
// its action returned, if it returned one.
func classify(res coordinator.Result[string], err, actErr error) stormClass {
	switch {
	case err == nil && res.Replayed:
		return classReplay
	case err == nil:
		return classRun
	case actErr != nil && err == actErr: //nolint:errorlint // Do returns the action's error unchanged: the same value
		return classAction
	case errors.Is(err, coordinator.ErrInProgress):
		return classInProgress
	case errors.Is(err, coordinator.ErrStorage):
		return classStorage
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return classContext
	}
	return classOther
}

// stormCall is one call of a storm.
type stormCall struct {
	id     int
	client int // the caller, for porcupine's visualisation
	key    string
	final  bool  // a call of the final pass, after the faults
	start  int64 // on clockNow
	end    int64 // on clockNow; never for a killed process's call

	// own is the value the call's action produced, "" when it was not
	// called. effect says that it made its effect (the ledger row, through
	// the transaction) and returned without an error: from then on, the
	// call may commit. For a killed process's call, effect is set once the
	// action was called: the parent does not know how far it got.
	own     string
	effect  bool
	actions int // how often the action was called

	class    stormClass
	value    string // the value returned
	replayed bool
	err      string
}

// ok reports whether the call returned a value.
func (c *stormCall) ok() bool { return c.class == classRun || c.class == classReplay }

// unknown reports whether the call may have committed its own value, or
// not, without saying which.
func (c *stormCall) unknown() bool { return !c.ok() && c.effect }

// stormHistory is what a storm recorded, and what committed.
type stormHistory struct {
	mu    sync.Mutex
	calls []*stormCall
	// final is what committed, read after the storm: the value of each
	// key with a completed record. finalAt is when it was read; 0 when it
	// was not.
	final   map[string]string
	finalAt int64
}

func (h *stormHistory) add(c *stormCall) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, c)
}

// snapshot returns the calls recorded so far.
func (h *stormHistory) snapshot() []*stormCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// The model's operations.

// regKind is what an operation does to the key's register.
type regKind uint8

const (
	regNone   regKind = iota // nothing: an error before any effect, or a rolled-back action
	regRun                   // writes its own value; only into an empty register
	regReplay                // reads the value
	regMaybe                 // may write its own value, if the register is empty
	regRead                  // the read of what committed, after the storm
)

type regInput struct {
	key string
	own string
}

type regOutput struct {
	kind  regKind
	value string
}

// regStep is the model's step function: the states the register may be in
// after the operation; none when the operation is impossible in state.
func regStep(state, input, output any) []any {
	s, in, out := state.(string), input.(regInput), output.(regOutput)
	switch out.kind {
	case regRun:
		if s == "" && out.value != "" && out.value == in.own {
			return []any{out.value}
		}
		return nil
	case regReplay, regRead:
		if out.value == s {
			return []any{s}
		}
		return nil
	case regMaybe:
		if s == "" {
			return []any{"", in.own}
		}
		return []any{s}
	}
	return []any{s}
}

// regModel is the write-once register, partitioned by key.
var regModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(regInput).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			out = append(out, byKey[k])
		}
		return out
	},
	Init:  func() []any { return []any{""} },
	Step:  regStep,
	Equal: func(a, b any) bool { return a.(string) == b.(string) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		switch out.kind {
		case regRun:
			return "run " + out.value
		case regReplay:
			return "replay " + out.value
		case regMaybe:
			return "maybe " + in.own
		case regRead:
			return "committed " + out.value
		}
		return "error"
	},
	DescribeState: func(s any) string {
		if s.(string) == "" {
			return "(none)"
		}
		return s.(string)
	},
}

// regOp returns the model's operation of c.
func regOp(c *stormCall) porcupine.Operation {
	out := regOutput{kind: regNone}
	end := c.end
	switch {
	case c.class == classRun:
		out = regOutput{kind: regRun, value: c.value}
	case c.class == classReplay:
		out = regOutput{kind: regReplay, value: c.value}
	case c.unknown():
		out = regOutput{kind: regMaybe}
		end = never // a COMMIT whose answer was lost may land after the caller gave up
	}
	if c.class == classKilled {
		end = never
	}
	return porcupine.Operation{ClientId: c.client, Input: regInput{key: c.key, own: c.own}, Call: c.start, Output: out, Return: end}
}

// stormVerdict is what the checker found.
type stormVerdict struct {
	linearizable porcupine.CheckResult
	illegal      []string // keys porcupine proved not linearizable
	unproven     []string // keys porcupine did not finish
	problems     []string // every finding that fails the storm
	checkTime    time.Duration
}

// keyTimeout bounds porcupine's search on one key. The histories are small
// (a few dozen calls per key); a key whose check does not finish is logged,
// not failed: the call-by-call checks cover it.
const keyTimeout = 20 * time.Second

// checkHistory checks h: porcupine on each key, and call by call.
func checkHistory(h *stormHistory) stormVerdict {
	v := stormVerdict{linearizable: porcupine.Ok}
	calls := h.snapshot()
	byKey := map[string][]*stormCall{}
	for _, c := range calls {
		byKey[c.key] = append(byKey[c.key], c)
	}
	problem := func(format string, args ...any) { v.problems = append(v.problems, fmt.Sprintf(format, args...)) }

	// Call by call.
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		var runs []*stormCall
		committed, known := h.final[k]
		for _, c := range byKey[k] {
			switch {
			case c.actions > 1:
				problem("call %d of %s called its action %d times", c.id, k, c.actions)
			case c.class == classOther:
				problem("call %d of %s: unexpected error: %s", c.id, k, c.err)
			case c.class == classRun && (c.own == "" || c.value != c.own):
				problem("call %d of %s returned %q as its own run, but its action produced %q", c.id, k, c.value, c.own)
			case c.class == classReplay && c.effect:
				problem("call %d of %s made its effect and then replayed %q", c.id, k, c.value)
			case c.unknown() && c.class != classStorage && c.class != classKilled:
				problem("call %d of %s: the action made its effect, then Do returned %s (%s), not a storage error", c.id, k, c.class, c.err)
			case c.final && !c.ok():
				problem("final call %d of %s, after the faults: %s (%s)", c.id, k, c.class, c.err)
			}
			if c.class == classRun {
				runs = append(runs, c)
			}
			if c.ok() && h.finalAt != 0 && (!known || c.value != committed) {
				problem("call %d of %s returned %q (%s), but what committed is %q", c.id, k, c.value, c.class, committed)
			}
		}
		if known {
			// What committed is the value of a call that ran, or whose
			// outcome is unknown.
			i := slices.IndexFunc(byKey[k], func(c *stormCall) bool { return c.own == committed })
			switch {
			case i < 0:
				problem("key %s: the committed value %q is no call's", k, committed)
			case byKey[k][i].class != classRun && !byKey[k][i].unknown():
				problem("key %s: the committed value %q is that of call %d, which ended in %s (%s): it must not have committed",
					k, committed, byKey[k][i].id, byKey[k][i].class, byKey[k][i].err)
			}
		}
		if len(runs) > 1 {
			var vals []string
			for _, c := range runs {
				vals = append(vals, c.value)
			}
			problem("key %s ran %d times: %s", k, len(runs), strings.Join(vals, ", "))
		}
	}

	// porcupine, on the calls that constrain the register.
	start := time.Now()
	var ops []porcupine.Operation
	maxClient := 0
	for _, c := range calls {
		maxClient = max(maxClient, c.client)
		if op := regOp(c); op.Output.(regOutput).kind != regNone {
			ops = append(ops, op)
		}
	}
	if h.finalAt != 0 {
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			ops = append(ops, porcupine.Operation{ClientId: maxClient + 1, Input: regInput{key: k},
				Call: h.finalAt, Output: regOutput{kind: regRead, value: h.final[k]}, Return: h.finalAt})
		}
	}
	m := regModel.ToModel()
	for _, part := range m.Partition(ops) {
		k := part[0].Input.(regInput).key
		switch porcupine.CheckOperationsTimeout(m, part, keyTimeout) {
		case porcupine.Illegal:
			v.illegal = append(v.illegal, k)
			v.linearizable = porcupine.Illegal
			problem("history of key %s is not linearizable:\n%s", k, describeKey(byKey[k], h))
		case porcupine.Unknown:
			v.unproven = append(v.unproven, k)
			if v.linearizable == porcupine.Ok {
				v.linearizable = porcupine.Unknown
			}
		}
	}
	v.checkTime = time.Since(start)
	return v
}

// describeKey lists the calls of a key in the order they started, for a
// failure.
func describeKey(calls []*stormCall, h *stormHistory) string {
	calls = slices.Clone(calls)
	slices.SortFunc(calls, func(a, b *stormCall) int { return cmp.Compare(a.start, b.start) })
	var t0 int64
	if len(calls) > 0 {
		t0 = calls[0].start
	}
	at := func(t int64) string {
		if t == never {
			return "never"
		}
		return time.Duration(t - t0).Round(10 * time.Microsecond).String()
	}
	var b strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&b, "  call %d client %d %s..%s %s value=%q own=%q effect=%v err=%s\n",
			c.id, c.client, at(c.start), at(c.end), c.class, c.value, c.own, c.effect, c.err)
	}
	if h.finalAt != 0 && len(calls) > 0 {
		fmt.Fprintf(&b, "  committed at %s: %q\n", at(h.finalAt), h.final[calls[0].key])
	}
	return b.String()
}

// querier is what readLedger needs of a pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ledgerState is what committed: the SQL counts of the invariants, and
// the values of the ledger and of the completed records.
type ledgerState struct {
	ledgerRows   int // rows of the ledger
	completed    int // keys with a completed record
	dupKeys      int // keys with two ledger rows or more
	orphanRows   int // ledger rows whose key has no completed record
	bareRecords  int // completed records whose key has no ledger row
	otherRecords int // records not completed (pending, not replayable, expired)

	ledger    map[string][]string // the ledger's values by key
	committed map[string]string   // each completed record's result, decoded
	badResult []string            // completed records whose result does not decode
}

// readLedger reads the invariants of op's records and the ledger, by SQL.
func readLedger(ctx context.Context, db querier, op string) (ledgerState, error) {
	l := ledgerState{ledger: map[string][]string{}, committed: map[string]string{}}
	err := db.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM ledger),
	(SELECT count(*) FROM idempotency_records WHERE operation = $1 AND state = 'completed' AND expires_at > clock_timestamp()),
	(SELECT count(*) FROM (SELECT key FROM ledger GROUP BY key HAVING count(*) > 1) d),
	(SELECT count(*) FROM ledger l WHERE NOT EXISTS (SELECT FROM idempotency_records r
		WHERE r.operation = $1 AND r.key = l.key AND r.state = 'completed' AND r.expires_at > clock_timestamp())),
	(SELECT count(*) FROM idempotency_records r WHERE r.operation = $1 AND r.state = 'completed'
		AND r.expires_at > clock_timestamp() AND NOT EXISTS (SELECT FROM ledger l WHERE l.key = r.key)),
	(SELECT count(*) FROM idempotency_records WHERE NOT (operation = $1 AND state = 'completed' AND expires_at > clock_timestamp()))`,
		op).Scan(&l.ledgerRows, &l.completed, &l.dupKeys, &l.orphanRows, &l.bareRecords, &l.otherRecords)
	if err != nil {
		return l, fmt.Errorf("read the invariants: %w", err)
	}
	rows, err := db.Query(ctx, `SELECT key, value FROM ledger`)
	if err != nil {
		return l, fmt.Errorf("read the ledger: %w", err)
	}
	var key, value string
	if _, err := pgx.ForEachRow(rows, []any{&key, &value}, func() error {
		l.ledger[key] = append(l.ledger[key], value)
		return nil
	}); err != nil {
		return l, fmt.Errorf("read the ledger: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT key, result FROM idempotency_records
WHERE operation = $1 AND state = 'completed' AND expires_at > clock_timestamp()`, op)
	if err != nil {
		return l, fmt.Errorf("read the records: %w", err)
	}
	var result []byte
	if _, err := pgx.ForEachRow(rows, []any{&key, &result}, func() error {
		var v string
		if err := json.Unmarshal(result, &v); err != nil {
			l.badResult = append(l.badResult, fmt.Sprintf("%s: %q", key, result))
			return nil
		}
		l.committed[key] = v
		return nil
	}); err != nil {
		return l, fmt.Errorf("read the records: %w", err)
	}
	return l, nil
}

// violations returns every invariant that l breaks: the ledger has one row
// per completed key and no other, and each completed record's result is its
// ledger row's value.
func (l ledgerState) violations() []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if l.ledgerRows != l.completed {
		bad("%d ledger rows, but %d completed keys", l.ledgerRows, l.completed)
	}
	if l.dupKeys != 0 {
		bad("%d keys with two ledger rows or more", l.dupKeys)
	}
	if l.orphanRows != 0 {
		bad("%d ledger rows without a completed record", l.orphanRows)
	}
	if l.bareRecords != 0 {
		bad("%d completed records without their ledger row", l.bareRecords)
	}
	if l.otherRecords != 0 {
		bad("%d records that are not completed (a transaction that committed a claim?)", l.otherRecords)
	}
	for _, r := range l.badResult {
		bad("completed record whose result is not a JSON string: %s", r)
	}
	for _, k := range slices.Sorted(maps.Keys(l.committed)) {
		if vals := l.ledger[k]; len(vals) == 1 && vals[0] != l.committed[k] {
			bad("key %s: the record replays %q, the ledger row holds %q", k, l.committed[k], vals[0])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(l.ledger)) {
		if vals := l.ledger[k]; len(vals) > 1 {
			bad("key %s has %d ledger rows: %s", k, len(vals), strings.Join(vals, ", "))
		}
	}
	return out
}

// The checker can fail: histories that break the register, and a ledger
// that breaks the invariants.

// histCall is a call of a hand-made history.
func histCall(id int, key string, start, end int64, class stormClass, value, own string) *stormCall {
	return &stormCall{id: id, client: id, key: key, start: start, end: end, class: class, value: value, own: own,
		effect: own != "" && class != classAction, actions: min(1, len(own))}
}

func TestStormCheckerAcceptsValidHistory(t *testing.T) {
	h := &stormHistory{}
	for _, c := range []*stormCall{
		histCall(1, "k", 0, 10, classStorage, "", "k#1"), // effect, then COMMIT lost: unknown, did not commit
		histCall(2, "k", 5, 30, classRun, "k#2", "k#2"),
		histCall(3, "k", 6, 31, classReplay, "k#2", ""),  // waited for the run
		histCall(4, "k", 40, 50, classReplay, "k#2", ""), // after it
		histCall(5, "k", 1, 2, classInProgress, "", ""),
		histCall(6, "k", 3, 4, classAction, "", "k#6"),  // rolled back
		histCall(7, "k", 8, never, classKilled, "", ""), // killed before its action
		histCall(8, "j", 0, never, classKilled, "", "j#8"),
		histCall(9, "j", 60, 70, classReplay, "j#8", ""), // the killed process's COMMIT landed
	} {
		h.add(c)
	}
	h.final, h.finalAt = map[string]string{"k": "k#2", "j": "j#8"}, 100
	v := checkHistory(h)
	if v.linearizable != porcupine.Ok || len(v.problems) > 0 {
		t.Fatalf("valid history: %s, problems %q", v.linearizable, v.problems)
	}
}

func TestStormCheckerRejectsBadHistories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []*stormCall
		final map[string]string
		// porcupine alone: the call-by-call checks cannot see it.
		onlyPorcupine bool
	}{
		{name: "two values for one key, two runs", calls: []*stormCall{
			histCall(1, "k", 0, 10, classRun, "k#1", "k#1"),
			histCall(2, "k", 20, 30, classRun, "k#2", "k#2"),
		}, final: map[string]string{"k": "k#2"}},
		{name: "two values for one key, replays", calls: []*stormCall{
			histCall(1, "k", 0, 10, classRun, "k#1", "k#1"),
			histCall(2, "k", 20, 30, classReplay, "k#1", ""),
			histCall(3, "k", 40, 50, classReplay, "k#9", ""),
		}, final: map[string]string{"k": "k#1"}},
		{name: "a replay before anything committed", calls: []*stormCall{
			histCall(1, "k", 0, 10, classReplay, "k#2", ""),
			histCall(2, "k", 20, 30, classRun, "k#2", "k#2"),
		}, final: map[string]string{"k": "k#2"}, onlyPorcupine: true},
		{name: "a committed run lost", calls: []*stormCall{
			histCall(1, "k", 0, 10, classRun, "k#1", "k#1"),
		}, final: map[string]string{}},
		{name: "a rolled-back action's value committed", calls: []*stormCall{
			histCall(1, "k", 0, 10, classAction, "", "k#1"),
			histCall(2, "k", 20, 30, classReplay, "k#1", ""),
		}, final: map[string]string{"k": "k#1"}},
		{name: "a run returning another value than its action's", calls: []*stormCall{
			histCall(1, "k", 0, 10, classRun, "k#0", "k#1"),
		}, final: map[string]string{"k": "k#0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &stormHistory{}
			for _, c := range tc.calls {
				h.add(c)
			}
			h.final, h.finalAt = tc.final, 100
			v := checkHistory(h)
			if v.linearizable != porcupine.Illegal {
				t.Errorf("porcupine: %s, want Illegal", v.linearizable)
			}
			if len(v.problems) == 0 {
				t.Errorf("no problem reported")
			}
			callByCall := len(v.problems) - len(v.illegal)
			if tc.onlyPorcupine != (callByCall == 0) {
				t.Errorf("call-by-call problems: %d, want some: %v (%q)", callByCall, !tc.onlyPorcupine, v.problems)
			}
			t.Logf("found: %q", v.problems)
		})
	}
}

// A ledger with two rows for a key, a row without a record, a record
// without its row, and a record whose result is not its row's value: the
// SQL checks find each.
func TestStormLedgerCheckerRejects(t *testing.T) {
	db := newDB(t, 4)
	ctx := t.Context()
	c, err := stormCoordinator(db.pool, coordinator.InFlightWait, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	do := func(key, value string) {
		t.Helper()
		_, err := stormDo(ctx, c, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
			return value, insertLedger(ctx, tx, key, value)
		})
		if err != nil {
			t.Fatalf("Do(%s): %v", key, err)
		}
	}
	do("good", "good#1")
	l, err := readLedger(ctx, db.pool, stormOp)
	if err != nil {
		t.Fatal(err)
	}
	if v := l.violations(); len(v) > 0 {
		t.Fatalf("a valid ledger: %q", v)
	}

	do("twice", "twice#1")
	do("bare", "bare#1")
	do("other", "other#1")
	for _, sql := range []string{
		`INSERT INTO ledger (key, value) VALUES ('twice', 'twice#2')`, // a second run's row
		`INSERT INTO ledger (key, value) VALUES ('orphan', 'orphan#1')`,
		`DELETE FROM ledger WHERE key = 'bare'`,
		`UPDATE ledger SET value = 'other#2' WHERE key = 'other'`,
	} {
		if _, err := db.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	l, err = readLedger(ctx, db.pool, stormOp)
	if err != nil {
		t.Fatal(err)
	}
	v := l.violations()
	t.Logf("found: %q", v)
	if l.dupKeys != 1 || l.orphanRows != 1 || l.bareRecords != 1 {
		t.Errorf("dup keys %d, orphan rows %d, bare records %d; want 1 each", l.dupKeys, l.orphanRows, l.bareRecords)
	}
	for _, want := range []string{
		"5 ledger rows, but 4 completed keys",
		"1 keys with two ledger rows or more",
		"1 ledger rows without a completed record",
		"1 completed records without their ledger row",
		`key other: the record replays "other#1", the ledger row holds "other#2"`,
		"key twice has 2 ledger rows: twice#1, twice#2",
	} {
		if !slices.Contains(v, want) {
			t.Errorf("missing finding %q", want)
		}
	}
}
