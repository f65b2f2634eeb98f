package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
)

// Do runs action exactly once per (call.Operation, call.Key) for the writes
// it makes through tx, and returns its result to every call with the same
// key, encoded as JSON in between, as coordinator.Do does. c is the
// coordinator whose store is an idempg *Store (the one the fx module
// provides, or coordinator.New over New's Store); Do follows its settings
// (in-flight mode, wait timeout, TTLs, result limit, kill switch) and
// reports to its observer, so the metrics, logs and spans are those of
// c.Do. A result stored by Do replays in c.Do, and the other way round.
// DoResult also says whether the result was replayed; DoWithCodec takes
// another encoding.
//
// Do begins a READ COMMITTED transaction, claims the key in it (an INSERT of
// a pending record that stays uncommitted), runs action with the
// transaction, writes the completed record in the same transaction and
// commits. The action's writes and the record commit together or not at
// all. A concurrent caller with the same key waits on the row's lock for
// the holder's transaction, then replays what committed or, after a
// rollback, runs itself.
//
// Do returns the action's own error unchanged, after rolling the transaction
// back (the key is left free: nothing happened); or an error matching
// coordinator.ErrInvalidRequest when the call is invalid or c's store is not
// an idempg *Store; coordinator.ErrKeyReuse when the key was used for a
// request with another fingerprint; coordinator.ErrInProgress (a
// *coordinator.InProgressError) when another caller holds the key and the
// in-flight mode is raise, or the wait bound (the wait timeout, ctx's
// deadline) passed; a *coordinator.NotReplayableError for a key whose result
// could not be kept; ctx's error when ctx ended before the action ran; or a
// *coordinator.StorageError (coordinator.ErrStorage) when the database
// failed. A storage error means the transaction did not commit, or, for a
// COMMIT whose answer was lost, that its outcome is unknown: in every case a
// retry with the same key is safe, since it replays what committed or runs
// the action once. The on-storage-error mode does not apply: without the
// database the action's writes cannot happen either, so a storage error
// never runs the action. In-flight mode run is treated as wait: the
// transactional call always holds its key, since that is what makes it
// exactly once.
//
// With the kill switch off (coordinator.WithEnabled(false)), Do runs action
// in a transaction and commits it, and reads and writes no record.
//
// The action must not end the transaction: Commit and Rollback of tx return
// an error and do nothing (tx.Begin makes a savepoint, as usual). It runs
// with ctx; a ctx that ends before the COMMIT rolls everything back.
func Do[T any](ctx context.Context, c *coordinator.Coordinator, call coordinator.Call, action func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	res, err := DoWithCodec(ctx, c, call, coordinator.JSONCodec[T]{}, action)
	return res.Value, err
}

// DoResult is Do that also reports, in Result.Replayed, whether the value is
// a stored result rather than this call's own.
func DoResult[T any](ctx context.Context, c *coordinator.Coordinator, call coordinator.Call, action func(ctx context.Context, tx pgx.Tx) (T, error)) (coordinator.Result[T], error) {
	return DoWithCodec(ctx, c, call, coordinator.JSONCodec[T]{}, action)
}

// DoWithCodec is DoResult with codec in place of JSON. When the action
// fails, Result.Value is the value it returned with its error. A nil
// coordinator, action or codec is an invalid request.
func DoWithCodec[T any](ctx context.Context, c *coordinator.Coordinator, call coordinator.Call, codec coordinator.Codec[T], action func(ctx context.Context, tx pgx.Tx) (T, error)) (coordinator.Result[T], error) {
	switch {
	case c == nil:
		return coordinator.Result[T]{}, invalid("coordinator is nil")
	case action == nil:
		return coordinator.Result[T]{}, invalid("action is nil")
	case codec == nil:
		return coordinator.Result[T]{}, invalid("codec is nil")
	}
	s, ok := c.Store().(*Store)
	if !ok {
		return coordinator.Result[T]{}, invalid("the coordinator's store is a %T, not an *idempg.Store: the transactional call needs the PostgreSQL store", c.Store())
	}
	if !c.Enabled() {
		return unprotected(ctx, s, action)
	}
	plan, err := c.Plan(call)
	if err != nil {
		return coordinator.Result[T]{}, err
	}
	if plan.InFlight == coordinator.InFlightRun {
		plan.InFlight = coordinator.InFlightWait
	}
	f := &txFlow[T]{
		s:      s,
		c:      c,
		plan:   plan,
		codec:  codec,
		action: action,
	}
	return f.do(ctx)
}

// unprotected runs action in a transaction of its own, with no record: the
// kill switch is off.
func unprotected[T any](ctx context.Context, s *Store, action func(context.Context, pgx.Tx) (T, error)) (res coordinator.Result[T], err error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return res, err
	}
	committed := false
	defer rollbackUnless(ctx, tx, &committed)
	if res.Value, err = action(ctx, ownedTx{tx}); err != nil {
		return res, err
	}
	committed = true
	return res, tx.Commit(ctx)
}

// rollbackUnless rolls tx back unless *committed, bounded by cleanupTimeout
// and also when ctx has ended (the caller hung up).
func rollbackUnless(ctx context.Context, tx pgx.Tx, committed *bool) {
	if !*committed {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}
}

func invalid(format string, args ...any) error {
	return &coordinator.InvalidRequestError{Reason: fmt.Sprintf(format, args...)}
}

// Tunables of the transactional call.
const (
	// maxRounds bounds the rounds of a call (a read, or a transaction that
	// meets a record it cannot settle): takeovers that keep losing races
	// end in ErrInProgress instead of looping.
	maxRounds = 64
	// maxPoll is the longest interval between the reads of a wait for a
	// coordinator's reservation.
	maxPoll = 500 * time.Millisecond
	// claimLease is the expiry of the pending record that a transaction
	// writes as its claim. Nobody else sees that record before it is
	// completed in the same transaction; the lease only matters if an action
	// commits the transaction behind Do's back (with SQL), so that the key
	// is not held for a whole record TTL.
	claimLease = coordinator.DefaultLease
	// txRetryAfter is InProgressError.RetryAfter for a key that another
	// transaction holds: nothing says how long it will run.
	txRetryAfter = time.Second
	// cleanupTimeout bounds a rollback.
	cleanupTimeout = 5 * time.Second
	// maxReasonLen bounds the reason a not-replayable record keeps, as in
	// the coordinator.
	maxReasonLen = 256
)

// The SQL of the transactional call, besides the Store's.
const (
	// saveTimeouts and restoreTimeouts keep the session's lock_timeout and
	// statement_timeout across a lock wait (setLockWait), so that the
	// action runs with them.
	saveTimeouts = `SELECT set_config('idempg.lock_timeout', current_setting('lock_timeout'), true),
	set_config('idempg.statement_timeout', current_setting('statement_timeout'), true)`
	restoreTimeouts = `SELECT set_config('lock_timeout', current_setting('idempg.lock_timeout'), true),
	set_config('statement_timeout', current_setting('idempg.statement_timeout'), true)`

	// claimRecord writes the call's pending record if the key has no row.
	// When another transaction holds an uncommitted row of the key, it
	// waits for that transaction's end (lock_timeout bounds the wait), and
	// then writes if that transaction rolled back. When a row is there, it
	// writes nothing and takes no lock: the waiters of a key that completes
	// all read its record at once, instead of queueing on its row.
	claimRecord = `INSERT INTO idempotency_records
	(operation, key, state, token, fingerprint, result, expires_at, created_at)
VALUES ($1, $2, $3, $4, $5, NULL, clock_timestamp() + $6 * interval '1 millisecond', clock_timestamp())
ON CONFLICT (operation, key) DO NOTHING
RETURNING true`

	// lockRow locks the key's row, expired or not.
	lockRow = `SELECT true FROM idempotency_records WHERE operation = $1 AND key = $2 FOR UPDATE`

	// takeOver makes the row, which the transaction has locked, its own
	// pending record: a heal of a record nobody can read, or of one that
	// expired since the claim looked.
	takeOver = `UPDATE idempotency_records
SET state = 'pending', token = $3, fingerprint = $4, result = NULL,
	expires_at = clock_timestamp() + $5 * interval '1 millisecond', created_at = clock_timestamp()
WHERE operation = $1 AND key = $2`

	// completeClaim completes the transaction's own claim; no expiry
	// check: the row is the transaction's, however long the action ran.
	completeClaim = `UPDATE idempotency_records
SET state = $4, result = $5, expires_at = clock_timestamp() + $6 * interval '1 millisecond'
WHERE operation = $1 AND key = $2 AND token = $3 AND state = 'pending'`
)

// step is what a round of the call does next.
type step uint8

const (
	stepDone step = iota // the call's answer is known
	stepRun              // claim the key and run the action
	stepWait             // a coordinator holds the key: wait until it lets go
)

// txFlow is one transactional call.
type txFlow[T any] struct {
	s      *Store
	c      *coordinator.Coordinator
	plan   coordinator.Plan
	codec  coordinator.Codec[T]
	action func(context.Context, pgx.Tx) (T, error)
	until  time.Time          // the wait bound
	read   coordinator.Record // the record the last claim or lock read
}

func (f *txFlow[T]) do(ctx context.Context) (coordinator.Result[T], error) {
	f.until = time.Now().Add(f.plan.WaitTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(f.until) {
		f.until = d
	}
	// A read first, outside any transaction: a replay costs one round trip
	// and takes no lock.
	rec, err := f.get(ctx)
	if err != nil {
		return coordinator.Result[T]{}, f.failed(ctx, coordinator.MethodGet, err)
	}
	for range maxRounds {
		res, next, err := f.settle(ctx, rec)
		if next == stepRun {
			res, rec, next, err = f.inTx(ctx)
		}
		switch next {
		case stepDone:
			return res, err
		case stepWait:
			if rec, err = f.await(ctx, rec); err != nil {
				return coordinator.Result[T]{}, err
			}
		}
	}
	return coordinator.Result[T]{}, f.inProgress(0)
}

// settle decides what a record means for the call: an answer (a replay, a
// reused key, a not-replayable result, ErrInProgress in mode raise), a run
// (absent, unreadable, or a result the codec cannot decode: the key heals),
// or a wait for a coordinator's reservation.
func (f *txFlow[T]) settle(ctx context.Context, rec coordinator.Record) (coordinator.Result[T], step, error) {
	if f.plan.Fingerprint != "" && rec.Fingerprint != "" && f.plan.Fingerprint != rec.Fingerprint {
		err := &coordinator.KeyReuseError{Operation: f.plan.Key.Operation, Key: f.plan.Key.Key, Stored: rec.Fingerprint, Got: f.plan.Fingerprint}
		f.report(ctx, coordinator.Event{Kind: coordinator.EventError, ErrorType: coordinator.ErrorKeyReuse, Err: err})
		return coordinator.Result[T]{}, stepDone, err
	}
	switch rec.State {
	case coordinator.StatePending:
		f.report(ctx, coordinator.Event{Kind: coordinator.EventInFlight, Mode: f.plan.InFlight})
		if f.plan.InFlight == coordinator.InFlightRaise {
			return coordinator.Result[T]{}, stepDone, f.inProgress(rec.TTL)
		}
		return coordinator.Result[T]{}, stepWait, nil
	case coordinator.StateNotReplayable:
		err := &coordinator.NotReplayableError{Operation: f.plan.Key.Operation, Key: f.plan.Key.Key, Reason: string(rec.Result)}
		f.report(ctx, coordinator.Event{Kind: coordinator.EventNotReplayable, Err: err})
		return coordinator.Result[T]{}, stepDone, err
	case coordinator.StateCompleted:
		v, err := f.codec.Decode(rec.Result)
		if err == nil {
			f.report(ctx, coordinator.Event{Kind: coordinator.EventHit})
			return coordinator.Result[T]{Value: v, Replayed: true}, stepDone, nil
		}
		f.report(ctx, coordinator.Event{Kind: coordinator.EventError, ErrorType: coordinator.ErrorDecode,
			Err: fmt.Errorf("the stored result cannot be decoded, so the key runs again: %w", err)})
	}
	return coordinator.Result[T]{}, stepRun, nil
}

// inTx is one transaction: claim the key, and run the action and commit
// its result, or settle the record that holds the key. It returns the
// record and stepWait when a coordinator's reservation holds the key.
func (f *txFlow[T]) inTx(ctx context.Context) (res coordinator.Result[T], rec coordinator.Record, next step, err error) {
	wait, ok := f.lockWait(ctx)
	if !ok {
		return res, rec, stepDone, f.inProgress(0)
	}
	start := time.Now()
	tx, err := f.s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		f.stored(ctx, coordinator.MethodReserve, start, err)
		return res, rec, stepDone, f.failed(ctx, coordinator.MethodReserve, err)
	}
	// Rolled back on every way out but a commit, a panicking action's
	// included. The rollback runs when the caller has hung up too.
	committed := false
	defer rollbackUnless(ctx, tx, &committed)

	written, rec, err := f.claim(ctx, tx, wait)
	f.stored(ctx, coordinator.MethodReserve, start, err)
	if err != nil {
		return res, rec, stepDone, f.claimFailed(ctx, start, err)
	}
	if !written {
		// The claim took no lock: rec is the record that committed, and
		// the other waiters of the key read it at the same time.
		if res, next, err = f.settle(ctx, rec); next != stepRun {
			return res, rec, next, err
		}
		// The record must be replaced (expired, or unreadable): lock its
		// row, and settle what is there once it is locked.
		found, locked, err := f.lock(ctx, tx)
		if err != nil {
			return res, rec, stepDone, f.claimFailed(ctx, start, err)
		}
		if !found {
			// Deleted meanwhile (the sweeper): claim again, in a new round.
			return res, coordinator.Record{}, stepRun, nil
		}
		if locked.State != rec.State || locked.Token != rec.Token {
			if res, next, err = f.settle(ctx, locked); next != stepRun {
				return res, locked, next, err
			}
		}
		rec = locked
		tag, err := tx.Exec(ctx, takeOver, f.plan.Key.Operation, f.plan.Key.Key, f.plan.Token, f.plan.Fingerprint, claimLease.Milliseconds())
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("the locked record is gone")
		}
		if err != nil {
			return res, rec, stepDone, f.failed(ctx, coordinator.MethodReserve, err)
		}
	}

	f.report(ctx, coordinator.Event{Kind: coordinator.EventMiss})
	v, err := f.action(ctx, ownedTx{tx})
	if err != nil {
		return coordinator.Result[T]{Value: v}, rec, stepDone, err
	}
	state, payload := f.keep(ctx, v)
	start = time.Now()
	tag, err := tx.Exec(ctx, completeClaim, f.plan.Key.Operation, f.plan.Key.Key, f.plan.Token, state, payload, f.plan.TTL.Milliseconds())
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("the action's transaction changed or deleted the key's record")
	}
	if err != nil {
		f.stored(ctx, coordinator.MethodComplete, start, err)
		return res, rec, stepDone, f.saveFailed(ctx, fmt.Errorf("complete in the transaction: %w", err))
	}
	committed = true // by now or never: pgx closes the transaction whatever Commit returns
	err = tx.Commit(ctx)
	f.stored(ctx, coordinator.MethodComplete, start, err)
	if err != nil {
		return res, rec, stepDone, f.saveFailed(ctx,
			fmt.Errorf("commit (rolled back, or its outcome is unknown: a retry replays or runs once): %w", err))
	}
	f.report(ctx, coordinator.Event{Kind: coordinator.EventStored})
	return coordinator.Result[T]{Value: v}, rec, stepDone, nil
}

// claim writes the call's pending record in tx if the key has no row,
// waiting for another transaction that inserted one, for as long as the
// in-flight mode and the wait bound allow (wait): lock_timeout is set for
// the claim, and statement_timeout turned off, and both are put back as
// they were for the action. When it does not write,
// it returns the record that is there (absent when it expired), with no
// lock taken. It is one round trip.
func (f *txFlow[T]) claim(ctx context.Context, tx pgx.Tx, wait time.Duration) (written bool, rec coordinator.Record, err error) {
	b := &pgx.Batch{}
	b.Queue(saveTimeouts)
	err = f.waitThenRead(ctx, tx, b, wait, &written, claimRecord,
		f.plan.Key.Operation, f.plan.Key.Key, statePending, f.plan.Token, f.plan.Fingerprint, claimLease.Milliseconds())
	return written, f.read, err
}

// lock locks the key's row in tx, waiting for another transaction that
// holds it as long as the in-flight mode and the wait bound allow, and
// returns the record there once locked; found is false when there is no row
// (deleted since the claim looked). It is one round trip.
func (f *txFlow[T]) lock(ctx context.Context, tx pgx.Tx) (found bool, rec coordinator.Record, err error) {
	wait, ok := f.lockWait(ctx)
	if !ok {
		wait = time.Millisecond
	}
	err = f.waitThenRead(ctx, tx, &pgx.Batch{}, wait, &found, lockRow, f.plan.Key.Operation, f.plan.Key.Key)
	return found, f.read, err
}

// waitThenRead sends b with, after what it holds: the lock wait set to
// wait, sql (which returns true or no row, into *flag), a read of the
// key's record into f.read, and the session's timeouts put back.
func (f *txFlow[T]) waitThenRead(ctx context.Context, tx pgx.Tx, b *pgx.Batch, wait time.Duration, flag *bool, sql string, args ...any) error {
	*flag, f.read = false, coordinator.Record{}
	b.Queue(setLockWait, lockTimeout(wait))
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(flag)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(selectRecord, f.plan.Key.Operation, f.plan.Key.Key).QueryRow(func(row pgx.Row) error {
		var err error
		f.read, err = scanRecord(row)
		return err
	})
	b.Queue(restoreTimeouts)
	return tx.SendBatch(ctx, b).Close()
}

// lockWait is how long a claim or a lock may wait for another transaction:
// a millisecond in mode raise (at once, but for a brief lock); in mode wait
// until the wait bound, ending before ctx's deadline so that a caller whose
// deadline is the wait bound hears ErrInProgress. ok is false when the
// bound has passed.
func (f *txFlow[T]) lockWait(ctx context.Context) (wait time.Duration, ok bool) {
	if f.plan.InFlight != coordinator.InFlightWait {
		return time.Millisecond, true
	}
	wait = time.Until(f.until)
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)*9/10)
	}
	return wait, wait >= time.Millisecond
}

// claimFailed is the error of a claim or a lock that failed: ErrInProgress
// when another transaction held the key past the wait, else a storage
// error (or ctx's).
func (f *txFlow[T]) claimFailed(ctx context.Context, start time.Time, err error) error {
	if !lockNotAvailable(err) {
		return f.failed(ctx, coordinator.MethodReserve, err)
	}
	f.report(ctx, coordinator.Event{Kind: coordinator.EventInFlight, Mode: f.plan.InFlight})
	if f.plan.InFlight == coordinator.InFlightWait {
		f.report(ctx, coordinator.Event{Kind: coordinator.EventWaited, Outcome: coordinator.WaitTimeout, Duration: time.Since(start)})
	}
	return f.inProgress(txRetryAfter)
}

// keep returns what the record of the action's result v holds: the
// encoded result, or, when it cannot be kept (the codec failed or panicked,
// or the result is over the size limit), a not-replayable record with the
// reason, so that the action never runs again for the key.
func (f *txFlow[T]) keep(ctx context.Context, v T) (state string, payload []byte) {
	payload, err := safeEncode(f.codec, v)
	var why string
	switch {
	case err != nil:
		why = "the result cannot be encoded: " + err.Error()
	case len(payload) > f.plan.MaxResultBytes:
		why = fmt.Sprintf("the result is %d bytes, more than the limit of %d", len(payload), f.plan.MaxResultBytes)
	default:
		return stateCompleted, nonNil(payload)
	}
	if len(why) > maxReasonLen {
		why = why[:maxReasonLen]
	}
	f.report(ctx, coordinator.Event{Kind: coordinator.EventError, ErrorType: coordinator.ErrorRecordValidation, Err: errors.New(why)})
	return stateNotReplayable, []byte(why)
}

// safeEncode encodes v, turning a panic of the codec into an error.
func safeEncode[T any](codec coordinator.Codec[T], v T) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			b, err = nil, fmt.Errorf("codec panicked: %v", p)
		}
	}()
	return codec.Encode(v)
}

// await waits, polling with backoff, until the record under the key is no
// longer a pending reservation (of a coordinator), and returns it. It
// returns ErrInProgress at the wait bound, a *coordinator.StorageError when a
// read fails, or ctx's error.
func (f *txFlow[T]) await(ctx context.Context, rec coordinator.Record) (coordinator.Record, error) {
	start := time.Now()
	waited := func(o coordinator.WaitOutcome) {
		f.report(ctx, coordinator.Event{Kind: coordinator.EventWaited, Outcome: o, Duration: time.Since(start)})
	}
	interval := f.plan.PollInterval
	for rec.State == coordinator.StatePending {
		wait := min(interval, time.Until(f.until))
		if wait <= 0 {
			waited(coordinator.WaitTimeout)
			return rec, f.inProgress(rec.TTL)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				waited(coordinator.WaitTimeout)
				return rec, f.inProgress(rec.TTL)
			}
			waited(coordinator.WaitCanceled)
			return rec, ctx.Err()
		case <-t.C:
		}
		interval = min(interval*2, max(maxPoll, f.plan.PollInterval))
		var err error
		if rec, err = f.get(ctx); err != nil {
			waited(coordinator.WaitError)
			return rec, f.failed(ctx, coordinator.MethodGet, err)
		}
	}
	switch {
	case f.plan.Fingerprint != "" && rec.Fingerprint != "" && f.plan.Fingerprint != rec.Fingerprint:
		waited(coordinator.WaitReuse)
	case rec.State == coordinator.StateAbsent:
		waited(coordinator.WaitTakeover)
	default:
		waited(coordinator.WaitHit)
	}
	return rec, nil
}

// inProgress is the error for a key that another caller holds.
func (f *txFlow[T]) inProgress(retryAfter time.Duration) *coordinator.InProgressError {
	if retryAfter <= 0 {
		retryAfter = txRetryAfter
	}
	return &coordinator.InProgressError{Operation: f.plan.Key.Operation, Key: f.plan.Key.Key, RetryAfter: retryAfter}
}

// failed returns the error of a database failure before the action ran:
// ctx's error when ctx has ended, a *coordinator.StorageError otherwise.
func (f *txFlow[T]) failed(ctx context.Context, m coordinator.Method, err error) error {
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && time.Now().After(f.until) && m == coordinator.MethodReserve {
			return f.inProgress(0)
		}
		return ctx.Err()
	}
	t := coordinator.ErrorStorageGet
	if m == coordinator.MethodReserve {
		t = coordinator.ErrorStorageReserve
	}
	se := &coordinator.StorageError{Method: m, Operation: f.plan.Key.Operation, Key: f.plan.Key.Key, Err: err}
	f.report(ctx, coordinator.Event{Kind: coordinator.EventError, ErrorType: t, Method: m, Err: se})
	return se
}

// saveFailed returns, and reports, the error of a completion or commit that
// failed after the action ran.
func (f *txFlow[T]) saveFailed(ctx context.Context, err error) error {
	se := &coordinator.StorageError{Method: coordinator.MethodComplete, Operation: f.plan.Key.Operation, Key: f.plan.Key.Key, Err: err}
	f.report(ctx, coordinator.Event{Kind: coordinator.EventError, ErrorType: coordinator.ErrorStorageSave,
		Method: coordinator.MethodComplete, Err: se})
	return se
}

// get reads the key's record and reports the store call. The read is not
// bounded by the coordinator's storage timeout: it waits for a connection of
// the pool, which the transactions of other calls may all hold for as long
// as their actions run; ctx bounds it.
func (f *txFlow[T]) get(ctx context.Context) (coordinator.Record, error) {
	start := time.Now()
	rec, err := f.s.Get(ctx, f.plan.Key)
	f.stored(ctx, coordinator.MethodGet, start, err)
	return rec, err
}

// stored reports a store call of method m that began at start.
func (f *txFlow[T]) stored(ctx context.Context, m coordinator.Method, start time.Time, err error) {
	f.report(ctx, coordinator.Event{Kind: coordinator.EventStorageCall, Method: m, Duration: time.Since(start), Err: err})
}

// report sends e, for the call's key, to the coordinator's observer.
func (f *txFlow[T]) report(ctx context.Context, e coordinator.Event) {
	e.Key = f.plan.Key
	f.c.Report(ctx, e)
}

// ownedTx is the transaction as the action gets it: Do commits or rolls it
// back, so its own Commit and Rollback refuse.
type ownedTx struct{ pgx.Tx }

// errOwned is what Commit and Rollback of the action's transaction return.
var errOwned = errors.New("idempg: the transaction belongs to Do: return from the action to commit, or return an error to roll back")

// Commit refuses: Do commits.
func (ownedTx) Commit(context.Context) error { return errOwned }

// Rollback refuses: Do rolls back when the action returns an error.
func (ownedTx) Rollback(context.Context) error { return errOwned }
