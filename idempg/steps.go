package idempg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
)

// Steps runs body once per (call.Operation, call.Key) as recovery points
// (package documentation, "Recovery points"): each Phase is a transaction
// of its own that commits its writes with its progress, each Outside call
// runs with a downstream key of its own, and a call that stopped (a crash,
// a lost connection, an error) resumes, when retried, at the first step
// that did not commit. s must be c's store. body's value completes the
// key's record through c, with the outside answers that no phase kept yet,
// and every later call replays it. Steps returns body's error unchanged, a
// *StepFailedError for a step that failed for good (now or on an earlier
// run), and the errors of Do otherwise.
func Steps[T any](ctx context.Context, c *coordinator.Coordinator, s *Store, call coordinator.Call, body func(ctx context.Context, r *Run) (T, error)) (T, error) {
	res, err := StepsWithCodec(ctx, c, s, call, coordinator.JSONCodec[T]{}, body)
	return res.Value, err
}

// StepsWithCodec is Steps with codec for the record's result (the steps'
// results are JSON), and Result.Replayed saying whether the value is the
// record's. A nil coordinator, store, codec or body is an invalid request,
// and so is an invalid call.
func StepsWithCodec[T any](ctx context.Context, c *coordinator.Coordinator, s *Store, call coordinator.Call, codec coordinator.Codec[T], body func(ctx context.Context, r *Run) (T, error)) (coordinator.Result[T], error) {
	if err := checkSteps(c, s, codec != nil, body != nil, call); err != nil {
		return coordinator.Result[T]{}, err
	}
	if !c.Enabled() {
		// The kill switch is off: the phases run and commit their writes,
		// and nothing is kept, skipped or recorded.
		ctx = coordinator.WithDownstream(ctx, call)
		r := &Run{ctx: ctx, s: s, key: idemstore.Key{Operation: call.Operation, Key: call.Key}, seen: make(map[string]bool), off: true}
		v, err := body(ctx, r)
		return coordinator.Result[T]{Value: v}, err
	}
	key := idemstore.Key{Operation: call.Operation, Key: call.Key}
	// A key with a record replays it, or waits for its holder, through the
	// coordinator, and body does not run: only if the record went away
	// meanwhile does the coordinator's action run it, inside the claim.
	rec, err := s.Get(ctx, key)
	if err != nil {
		return coordinator.Result[T]{}, &coordinator.StorageError{Method: idemevent.MethodGet, Operation: key.Operation, Key: key.Key, Err: err}
	}
	if rec.State != idemstore.StateAbsent && rec.State != idemstore.StateUnreadable {
		return coordinator.DoWithCodec(ctx, c, call, codec, func(ctx context.Context) (T, error) {
			v, r, err := runBody(ctx, s, call, body)
			if err != nil {
				return v, err
			}
			return v, r.finish(ctx)
		})
	}
	v, r, err := runBody(ctx, s, call, body)
	if err != nil {
		return coordinator.Result[T]{Value: v}, err
	}
	return coordinator.DoWithCodec(ctx, c, call, codec, func(ctx context.Context) (T, error) {
		return v, r.finish(ctx)
	})
}

// checkSteps is StepsWithCodec's check of its arguments.
func checkSteps(c *coordinator.Coordinator, s *Store, codec, body bool, call coordinator.Call) error {
	reason := ""
	switch {
	case c == nil:
		reason = "coordinator is nil"
	case s == nil:
		reason = "store is nil"
	case !codec:
		reason = "codec is nil"
	case !body:
		reason = "body is nil"
	}
	if reason != "" {
		return &coordinator.InvalidRequestError{Reason: reason}
	}
	for _, err := range []error{coordinator.ValidateOperation(call.Operation), coordinator.ValidateKey(call.Key), coordinator.ValidateFingerprint(call.Fingerprint)} {
		if err != nil {
			return err
		}
	}
	if call.TTL < 0 {
		return &coordinator.InvalidRequestError{Reason: fmt.Sprintf("TTL %v is negative", call.TTL)}
	}
	return nil
}

// runBody runs body with a new Run of call, after reading the steps that
// committed.
func runBody[T any](ctx context.Context, s *Store, call coordinator.Call, body func(ctx context.Context, r *Run) (T, error)) (T, *Run, error) {
	var zero T
	r, err := s.newRun(ctx, call)
	if err != nil {
		return zero, nil, err
	}
	v, err := body(r.ctx, r)
	return v, r, err
}

// Run is one run of a Steps call's body, which its Phase and Outside
// calls take. It belongs to the body's goroutine: steps run one at a time,
// in the order the body calls them.
type Run struct {
	ctx  context.Context // the body's: carries the call's downstream key
	s    *Store
	key  idemstore.Key
	fp   string
	ttl  time.Duration   // of the steps' rows until the record completes
	done map[string]step // the steps that committed, by name
	seen map[string]bool // the names this run used
	kept []namedStep     // outside answers that no transaction kept yet
	off  bool            // the kill switch is off: steps run, and nothing is kept
}

// step is a committed row of idempotency_steps.
type step struct {
	kind   string // stepPhase or stepOutside
	failed bool
	fp     string
	result []byte // the JSON result, or the failure's message
}

type namedStep struct {
	name string
	step
}

// The kinds of step, as the table spells them.
const (
	stepPhase   = "phase"
	stepOutside = "outside"
)

// unfinishedTTL is how long the steps of a call that never completes are
// kept when its TTL is shorter: a retry a day later still resumes.
const unfinishedTTL = 24 * time.Hour

// maxStepName bounds a step's name, in bytes.
const maxStepName = 100

// The SQL of the recovery points.
const (
	// readSteps reads the live steps of a key.
	readSteps = `SELECT step, kind, state, fingerprint, result FROM idempotency_steps
WHERE operation = $1 AND key = $2 AND expires_at > clock_timestamp()`

	// readStep reads one live step.
	readStep = `SELECT kind, state, fingerprint, result FROM idempotency_steps
WHERE operation = $1 AND key = $2 AND step = $3 AND expires_at > clock_timestamp()`

	// insertStep writes a step's row unless a live one is there. Another
	// transaction's uncommitted row of the step is waited for: the insert
	// then writes if that transaction rolled back, and writes nothing if it
	// committed.
	insertStep = `INSERT INTO idempotency_steps AS s
	(operation, key, step, kind, state, fingerprint, result, expires_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp() + $8 * interval '1 millisecond', clock_timestamp())
ON CONFLICT (operation, key, step) DO UPDATE SET
	kind = EXCLUDED.kind, state = EXCLUDED.state, fingerprint = EXCLUDED.fingerprint,
	result = EXCLUDED.result, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at
WHERE s.expires_at <= clock_timestamp()
RETURNING true`

	// setStepResult writes the result of the transaction's own phase.
	setStepResult = `UPDATE idempotency_steps SET result = $4 WHERE operation = $1 AND key = $2 AND step = $3`

	// keepSteps makes the steps of a completed key live as long as its
	// record, in the transaction that completes it.
	keepSteps = `UPDATE idempotency_steps s SET expires_at = greatest(s.expires_at, r.expires_at)
FROM idempotency_records r
WHERE s.operation = $1 AND s.key = $2 AND r.operation = $1 AND r.key = $2`
)

// The states of a step's row.
const (
	stepDone   = "done"
	stepFailed = "failed"
)

// newRun reads the steps of call that committed.
func (s *Store) newRun(ctx context.Context, call coordinator.Call) (*Run, error) {
	key := idemstore.Key{Operation: call.Operation, Key: call.Key}
	r := &Run{
		ctx: coordinator.WithDownstream(ctx, call), s: s, key: key, fp: call.Fingerprint,
		ttl: max(call.TTL, unfinishedTTL), done: make(map[string]step), seen: make(map[string]bool),
	}
	err := s.query(ctx, readSteps, []any{key.Operation, key.Key}, func(rows pgx.Rows) error {
		clear(r.done)
		for rows.Next() {
			var (
				name, state string
				st          step
			)
			if err := rows.Scan(&name, &st.kind, &state, &st.fp, &st.result); err != nil {
				return err
			}
			st.failed = state == stepFailed
			r.done[name] = st
		}
		return rows.Err()
	})
	if err != nil {
		return nil, &coordinator.StorageError{Method: idemevent.MethodGet, Operation: key.Operation, Key: key.Key, Err: fmt.Errorf("idempg: read the steps of %s: %w", key, err)}
	}
	for _, st := range r.done {
		if err := r.reused(st); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// reused returns a *coordinator.KeyReuseError when st was written for a
// request with another fingerprint.
func (r *Run) reused(st step) error {
	if st.fp != "" && r.fp != "" && st.fp != r.fp {
		return &coordinator.KeyReuseError{Operation: r.key.Operation, Key: r.key.Key, Stored: st.fp, Got: r.fp}
	}
	return nil
}

// Phase runs fn in a transaction of its own and commits its writes with
// the step's progress and its result, once per key: a step that committed
// on an earlier run is not run again, and returns its result (as JSON) or,
// when it failed for good, its *StepFailedError. fn's ctx carries the
// step's downstream key. fn's error rolls its writes back; one that
// matches idemconsume.ErrPermanent (idemconsume.Permanent) is kept as the
// step's failure, and every later run gets it. fn runs again when the
// database asks for it (a serialization failure or a deadlock, after its
// writes rolled back), and when a concurrent run of the key held the step
// and rolled it back. The transaction is at READ
// COMMITTED, and, as in Do, fn must not end it.
func Phase[T any](r *Run, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, &coordinator.InvalidRequestError{Reason: "phase " + name + ": fn is nil"}
	}
	if st, ok, err := r.begin(name, stepPhase); err != nil || ok {
		return decodeStep[T](r, name, st, err)
	}
	if r.off {
		return unkeptPhase(r, name, fn)
	}
	var v T
	st, ran, err := r.phase(name, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		var err error
		if v, err = fn(ctx, tx); err != nil {
			return nil, err
		}
		return json.Marshal(v)
	})
	if err != nil || !ran {
		return decodeStep[T](r, name, st, err)
	}
	return v, nil
}

// Outside makes an outside call (a payment provider's charge) once per
// key, as far as the service called deduplicates by key: fn's ctx carries
// the step's downstream key, the same on every run, which idemhttp's
// Transport and the gRPC and Connect client interceptors send. Its answer
// (as JSON) is kept with the next phase that commits, or with the record:
// a run after that gets it without calling. A run before that calls again,
// with the same key. An error that matches idemconsume.ErrPermanent
// (idemconsume.Permanent) is kept at once as the step's failure; any other
// error is returned as it is, and the next run calls again.
func Outside[T any](r *Run, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, &coordinator.InvalidRequestError{Reason: "outside call " + name + ": fn is nil"}
	}
	if st, ok, err := r.begin(name, stepOutside); err != nil || ok {
		return decodeStep[T](r, name, st, err)
	}
	v, err := fn(coordinator.WithDownstreamStep(r.ctx, name))
	if r.off {
		return v, err
	}
	if err != nil {
		if !permanent(err) {
			return v, err
		}
		st, _, err := r.fail(name, stepOutside, err)
		return decodeStep[T](r, name, st, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return v, &coordinator.InvalidRequestError{Reason: fmt.Sprintf("outside call %s: its answer cannot be kept as JSON: %v", name, err)}
	}
	r.kept = append(r.kept, namedStep{name: name, step: step{kind: stepOutside, fp: r.fp, result: b}})
	return v, nil
}

// unkeptPhase runs a phase with the kill switch off: in a transaction of
// its own, which commits fn's writes and nothing else.
func unkeptPhase[T any](r *Run, name string, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	ctx := coordinator.WithDownstreamStep(r.ctx, name)
	tx, err := r.s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		var zero T
		return zero, r.storageError(idemevent.MethodReserve, "begin phase "+name, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		_ = tx.Rollback(rctx) // a no-op after Commit
		cancel()
	}()
	v, err := fn(ctx, &ownedTx{Tx: tx})
	if err != nil {
		return v, err
	}
	if err := tx.Commit(ctx); err != nil {
		return v, r.storageError(idemevent.MethodComplete, "commit phase "+name, err)
	}
	return v, nil
}

// begin checks a step's name and returns its committed row, if any.
func (r *Run) begin(name, kind string) (step, bool, error) {
	switch {
	case name == "" || len(name) > maxStepName || !utf8.ValidString(name):
		return step{}, false, &coordinator.InvalidRequestError{Reason: fmt.Sprintf("step name %q: want 1 to %d bytes of UTF-8", name, maxStepName)}
	case r.seen[name]:
		return step{}, false, &coordinator.InvalidRequestError{Reason: fmt.Sprintf("step %q is used twice in one run: name each step once", name)}
	}
	r.seen[name] = true
	st, ok := r.done[name]
	if ok && st.kind != kind {
		return step{}, false, &coordinator.InvalidRequestError{Reason: fmt.Sprintf("step %q committed as a %s step, and is now a %s step", name, st.kind, kind)}
	}
	return st, ok, nil
}

// decodeStep returns what a committed step says: its result, or its
// failure; or err.
func decodeStep[T any](r *Run, name string, st step, err error) (T, error) {
	var v T
	switch {
	case err != nil:
		return v, err
	case st.failed:
		return v, &StepFailedError{Operation: r.key.Operation, Key: r.key.Key, Step: name, Reason: string(st.result)}
	}
	if st.result == nil {
		// The phase's function ended its transaction with SQL, which
		// committed the step without its result.
		return v, fmt.Errorf("idempg: step %q of %s committed without its result: %w", name, r.key, ErrTxEnded)
	}
	if err := json.Unmarshal(st.result, &v); err != nil {
		return v, fmt.Errorf("idempg: step %q of %s: its kept result does not decode: %w", name, r.key, err)
	}
	return v, nil
}

// phase runs one phase's transaction, again after a conflict. ran is true
// when fn's writes committed with the step; otherwise st is the step that
// another run committed, or err says why neither happened.
func (r *Run) phase(name string, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (st step, ran bool, err error) {
	ctx := coordinator.WithDownstreamStep(r.ctx, name)
	for attempt := 0; ; attempt++ {
		st, ran, err = r.phaseOnce(ctx, name, fn)
		if err == nil || !conflict(err) || attempt == maxConflictRetries || !pause(ctx, attempt) {
			break
		}
	}
	var failed *phaseFailed
	switch {
	case err == nil:
		return st, ran, nil
	case errors.As(err, &failed):
		if !permanent(failed.err) {
			return step{}, false, failed.err
		}
		return r.fail(name, stepPhase, failed.err)
	}
	return step{}, false, r.storageError(idemevent.MethodComplete, "phase "+name, err)
}

// phaseFailed is the error of a phase's fn in phaseOnce.
type phaseFailed struct{ err error }

func (e *phaseFailed) Error() string { return e.err.Error() }

// phaseOnce is one attempt of phase.
func (r *Run) phaseOnce(ctx context.Context, name string, fn func(ctx context.Context, tx pgx.Tx) ([]byte, error)) (step, bool, error) {
	tx, err := r.s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return step{}, false, err
	}
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	// The step's row first: a concurrent run of the key waits here for this
	// transaction, and then finds the step committed.
	b := &pgx.Batch{}
	queueHolderSettings(b, tx, coordinator.DefaultLease)
	var inserted bool
	b.Queue(insertStep, r.key.Operation, r.key.Key, name, stepPhase, stepDone, r.fp, []byte(nil), r.ttl.Milliseconds()).
		QueryRow(func(row pgx.Row) error {
			err := row.Scan(&inserted)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return step{}, false, err
	}
	if !inserted {
		st, err := r.read(ctx, tx, name)
		return st, false, err
	}
	result, err := fn(ctx, &ownedTx{Tx: tx})
	if err != nil {
		if conflict(err) {
			return step{}, false, err
		}
		return step{}, false, &phaseFailed{err}
	}
	if tx.Conn().PgConn().TxStatus() == 'I' {
		return step{}, false, &phaseFailed{ErrTxEnded}
	}
	b = &pgx.Batch{}
	b.Queue(setStepResult, r.key.Operation, r.key.Key, name, result)
	r.queueKept(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return step{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return step{}, false, err
	}
	committed = true
	r.kept = r.kept[:0]
	return step{kind: stepPhase, fp: r.fp, result: result}, true, nil
}

// read reads a step that another run committed.
func (r *Run) read(ctx context.Context, q querier, name string) (step, error) {
	var (
		st    step
		state string
	)
	err := q.QueryRow(ctx, readStep, r.key.Operation, r.key.Key, name).Scan(&st.kind, &state, &st.fp, &st.result)
	if err != nil {
		return step{}, err
	}
	st.failed = state == stepFailed
	if err := r.reused(st); err != nil {
		return step{}, err
	}
	if st.kind != stepPhase && st.kind != stepOutside {
		return step{}, fmt.Errorf("idempg: step %q of %s has kind %q, which this package does not write", name, r.key, st.kind)
	}
	return st, nil
}

// queueKept queues the outside answers not kept yet.
func (r *Run) queueKept(b *pgx.Batch) {
	for _, k := range r.kept {
		b.Queue(insertStep, r.key.Operation, r.key.Key, k.name, k.kind, stepDone, k.fp, k.result, r.ttl.Milliseconds())
	}
}

// storageError is a *coordinator.StorageError of the run's key.
func (r *Run) storageError(m idemevent.Method, what string, err error) error {
	var kr *coordinator.KeyReuseError
	if errors.As(err, &kr) {
		return kr
	}
	return &coordinator.StorageError{Method: m, Operation: r.key.Operation, Key: r.key.Key,
		Err: fmt.Errorf("idempg: %s of %s: %w", what, r.key, classify(err))}
}

// finish runs in the claim's transaction that completes the key: it keeps
// the outside answers that no phase kept, and has the claim keep the
// steps as long as the record.
func (r *Run) finish(ctx context.Context) error {
	t, ok := ctx.Value(txKey{}).(*ownedTx)
	if !ok || t.claim == nil {
		return &coordinator.InvalidRequestError{Reason: "the coordinator's store is not an *idempg.Store: Steps needs the PostgreSQL store"}
	}
	if t.claim.s.db != r.s.db {
		return &coordinator.InvalidRequestError{Reason: "the store given to Steps is not on the coordinator's database (the pool of its store)"}
	}
	t.claim.steps = true
	if len(r.kept) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	r.queueKept(b)
	if err := t.Tx.SendBatch(ctx, b).Close(); err != nil {
		return r.storageError(idemevent.MethodComplete, "keep the outside answers", err)
	}
	return nil
}

// ErrStepFailed matches the *StepFailedError of a step that failed for
// good.
var ErrStepFailed = errors.New("idempg: step failed for good")
