package idempg

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
)

// DB is what a Store needs of PostgreSQL: *pgxpool.Pool has it. A Store is
// safe for concurrent use when its DB is (a pool is; a single *pgx.Conn is
// not).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// Store is an idemstore.Store on PostgreSQL, and the transactional call
// (Do) over the same table. Create one with New. It is safe for concurrent
// use.
//
// Leases and time to live are expires_at on the database's clock
// (clock_timestamp()): a record whose expires_at has passed is absent for
// every method, and the sweeper (Sweep, StartSweeper) deletes it later.
// Each method touches only its key's row, in one round trip; each that
// writes does so in a transaction at READ COMMITTED whatever the database's
// default isolation
// (SERIALIZABLE or REPEATABLE READ would fail collisions with
// serialization failures); a serialization failure or a deadlock is sent
// again within the context's deadline, and one that is left matches
// coordinator.ErrConflict, which the coordinator never takes for an outage. Record.TTL is
// the remaining time to live, to the microsecond.
//
// A key that an open transaction of Do holds is not visible to the other
// methods until that transaction ends (its row is not committed yet). Get
// reports such a key as it was before the transaction; Reserve waits for the
// transaction, up to three quarters of the time left before its context's
// deadline, and then reports a pending record with an empty token and TTL 0,
// so that a coordinator waits for the key (or raises) instead of taking the
// wait for a storage failure.
type Store struct {
	db    DB
	gates gates
	txs   connTxs
}

var _ idemstore.Store = (*Store)(nil)

// New returns a Store on db, which must hold the schema (Migrate,
// CheckSchema). It does no I/O; it returns an error when db is nil. The
// transactional call takes its settings from the coordinator over the Store
// (see Do).
func New(db DB) (*Store, error) {
	if db == nil {
		return nil, errors.New("idempg: invalid configuration: db is nil")
	}
	return &Store{db: db}, nil
}

// The states as the table spells them: idemstore.State's names.
const (
	statePending       = "pending"
	stateCompleted     = "completed"
	stateNotReplayable = "not_replayable"
)

// stateName returns the name the table keeps for st, or "" for a state no
// record is written in.
func stateName(st idemstore.State) string {
	switch st {
	case idemstore.StatePending:
		return statePending
	case idemstore.StateCompleted:
		return stateCompleted
	case idemstore.StateNotReplayable:
		return stateNotReplayable
	}
	return ""
}

// The SQL of the methods. Expiry is decided by clock_timestamp(), the
// database's clock at the moment the statement looks, never by the client's.
const (
	// selectRecord reads a live record with its remaining time to live in
	// microseconds (at least 1: a record that is read is not expired).
	selectRecord = `SELECT state, token, fingerprint, result,
	GREATEST(1, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000000))::bigint
FROM idempotency_records
WHERE operation = $1 AND key = $2 AND expires_at > clock_timestamp()`

	// insertRecord writes a record if the key is absent (no row, or an
	// expired one), or when $8 is set and the row is not pending and has
	// token $9 (the compare-and-swap that heals). When it does not write,
	// ON CONFLICT DO UPDATE still locks the row, so the statement that
	// follows in the same transaction reads exactly the record that was
	// there.
	insertRecord = `INSERT INTO idempotency_records AS r
	(operation, key, state, token, fingerprint, result, expires_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp() + $7 * interval '1 millisecond', clock_timestamp())
ON CONFLICT (operation, key) DO UPDATE SET
	state = EXCLUDED.state, token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
	result = EXCLUDED.result, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at
WHERE r.expires_at <= clock_timestamp() OR ($8 AND r.state <> 'pending' AND r.token = $9)
RETURNING true`

	// ownedPending is the condition of Complete, Release and Renew: the
	// key holds a live pending record owned by $3.
	ownedPending = `operation = $1 AND key = $2 AND state = 'pending' AND token = $3 AND expires_at > clock_timestamp()`

	completeRecord = `UPDATE idempotency_records
SET state = $4, result = $5, expires_at = clock_timestamp() + $6 * interval '1 millisecond'
WHERE ` + ownedPending

	releaseRecord = `DELETE FROM idempotency_records WHERE ` + ownedPending

	renewRecord = `UPDATE idempotency_records
SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
WHERE ` + ownedPending

	// setLockWait sets lock_timeout to $1 for the rest of the transaction,
	// and turns statement_timeout off: a session's statement_timeout
	// shorter than the lock wait would end the wait with a statement
	// timeout, which a caller takes for a database failure, not a held key.
	setLockWait = `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)`
)

// Reserve implements idemstore.Store: if the key is absent (no row, or an
// expired one), or w.Replace is set and the record is not pending and has
// token w.ReplaceToken, it writes w with time to live w.TTL and returns
// (idemstore.Record{}, true, nil); otherwise it returns the record under
// the key and false. It is one round trip: the INSERT ... ON CONFLICT and
// the read of the record that stopped it run as one transaction at READ
// COMMITTED, whatever the database's default isolation (a serialization
// failure or a deadlock is sent again within ctx's deadline, and what is
// left matches coordinator.ErrConflict).
// A key held by an open transaction of Do is reported as pending with an
// empty token once a lock wait of three quarters of the time left before
// ctx's deadline has passed (see Store). It returns an error for a Write
// whose State is not pending, completed or not replayable, or whose TTL is
// not positive.
func (s *Store) Reserve(ctx context.Context, key idemstore.Key, w idemstore.Write) (idemstore.Record, bool, error) {
	st := stateName(w.State)
	if st == "" {
		return idemstore.Record{}, false, fmt.Errorf("idempg: reserve %s: write state is %s, want pending, completed or not_replayable", key, w.State)
	}
	if err := checkTTL("reserve", key, w.TTL); err != nil {
		return idemstore.Record{}, false, err
	}
	var result []byte
	if st != statePending {
		result = nonNil(w.Result)
	}
	var (
		written bool
		rec     idemstore.Record
	)
	err := s.send(ctx, func(b *pgx.Batch) {
		written, rec = false, idemstore.Record{}
		if d, ok := ctx.Deadline(); ok {
			// Waiting longer than the caller would only turn a held key into
			// a timeout, which a coordinator takes for a storage failure.
			b.Queue(setLockWait, lockTimeout(time.Until(d)*3/4))
		}
		b.Queue(insertRecord, key.Operation, key.Key, st, w.Token, w.Fingerprint, result, w.TTL.Milliseconds(),
			w.Replace, w.ReplaceToken).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&written)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		b.Queue(selectRecord, key.Operation, key.Key).QueryRow(func(row pgx.Row) error {
			var err error
			rec, err = scanRecord(row)
			return err
		})
	})
	switch {
	case lockNotAvailable(err):
		return idemstore.Record{State: idemstore.StatePending}, false, nil
	case err != nil:
		return idemstore.Record{}, false, fmt.Errorf("idempg: reserve %s: %w", key, err)
	case written:
		return idemstore.Record{}, true, nil
	}
	return rec, false, nil
}

// Get implements idemstore.Store: it returns the live record under key, or
// a Record with State idemstore.StateAbsent.
func (s *Store) Get(ctx context.Context, key idemstore.Key) (idemstore.Record, error) {
	// One statement, with no transaction of its own: a single SELECT sees
	// one snapshot, taken when it starts, at every isolation level, so it
	// reads what it would at READ COMMITTED; a serialization failure that
	// SERIALIZABLE may still raise is read again, as send does.
	var rec idemstore.Record
	var err error
	for attempt := 0; ; attempt++ {
		rec, err = scanRecord(s.db.QueryRow(ctx, selectRecord, key.Operation, key.Key))
		if err == nil || !conflict(err) || attempt == maxConflictRetries || !pause(ctx, attempt) {
			err = classify(err)
			break
		}
	}
	if err != nil {
		return idemstore.Record{}, fmt.Errorf("idempg: get %s: %w", key, err)
	}
	return rec, nil
}

// Complete implements idemstore.Store: if key holds a live pending record
// owned by token, it makes it a record in state c.State with c.Result and
// time to live c.TTL, keeping its token and fingerprint, and reports true.
// It returns an error for a Completion whose State is not completed or not
// replayable, or whose TTL is not positive.
func (s *Store) Complete(ctx context.Context, key idemstore.Key, token string, c idemstore.Completion) (bool, error) {
	st := stateName(c.State)
	if st == "" || st == statePending {
		return false, fmt.Errorf("idempg: complete %s: state is %s, want completed or not_replayable", key, c.State)
	}
	if err := checkTTL("complete", key, c.TTL); err != nil {
		return false, err
	}
	return s.exec(ctx, "complete", key, completeRecord, key.Operation, key.Key, token, st, nonNil(c.Result), c.TTL.Milliseconds())
}

// Release implements idemstore.Store: if key holds a live pending record
// owned by token, it deletes it and reports true.
func (s *Store) Release(ctx context.Context, key idemstore.Key, token string) (bool, error) {
	return s.exec(ctx, "release", key, releaseRecord, key.Operation, key.Key, token)
}

// Renew implements idemstore.Store: if key holds a live pending record
// owned by token, it sets its time to live to lease and reports true. It
// returns an error for a lease that is not positive.
func (s *Store) Renew(ctx context.Context, key idemstore.Key, token string, lease time.Duration) (bool, error) {
	if err := checkTTL("renew", key, lease); err != nil {
		return false, err
	}
	return s.exec(ctx, "renew", key, renewRecord, key.Operation, key.Key, token, lease.Milliseconds())
}

// exec runs a statement that changes at most one row and reports whether it
// did.
func (s *Store) exec(ctx context.Context, method string, key idemstore.Key, sql string, args ...any) (bool, error) {
	var n int64
	err := s.send(ctx, func(b *pgx.Batch) {
		b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error {
			n = tag.RowsAffected()
			return nil
		})
	})
	if err != nil {
		return false, fmt.Errorf("idempg: %s %s: %w", method, key, err)
	}
	return n == 1, nil
}

// send sends, in one round trip, the statements that fill queues, in a
// transaction of their own at READ COMMITTED, whatever the database's or
// the session's default isolation: at SERIALIZABLE or REPEATABLE READ a
// collision on a key would fail with a serialization failure instead of
// reading the record that won. A serialization failure or a deadlock is
// sent again, with a short backoff, while ctx lasts (at most
// maxConflictRetries times): nothing of a failed attempt committed. What is
// left is returned as classify says. fill is called once per attempt and
// must reset what its callbacks set.
func (s *Store) send(ctx context.Context, fill func(b *pgx.Batch)) error {
	for attempt := 0; ; attempt++ {
		b := &pgx.Batch{}
		b.Queue(beginReadCommitted)
		fill(b)
		b.Queue("COMMIT")
		err := s.db.SendBatch(ctx, b).Close()
		if err != nil {
			s.abort(ctx)
		}
		if err == nil || !conflict(err) || attempt == maxConflictRetries || !pause(ctx, attempt) {
			return classify(err)
		}
	}
}

// abort ends the transaction that a failed send may have left open on its
// connection. A pool destroys a connection that comes back in a
// transaction, so only a DB of another kind (a single *pgx.Conn) needs the
// ROLLBACK, sent best effort.
func (s *Store) abort(ctx context.Context) {
	if _, ok := s.db.(*pgxpool.Pool); ok {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = s.db.Exec(rctx, "ROLLBACK")
}

// beginReadCommitted begins the transaction of every statement of the
// store (see send) and of the transactional call.
const beginReadCommitted = "BEGIN ISOLATION LEVEL READ COMMITTED"

// maxConflictRetries bounds the attempts of a statement that meets
// serialization failures or deadlocks; the caller's deadline bounds them in
// time.
const maxConflictRetries = 20

// pause waits before attempt+1 of a statement that met a conflict: a
// random time up to 1ms doubled per attempt, at most 64ms, so that the
// transactions that collided do not collide again. It reports false when
// ctx ended first.
func pause(ctx context.Context, attempt int) bool {
	d := time.Duration(rand.Int64N(int64(time.Millisecond<<min(attempt, 6)))) + time.Microsecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// conflict reports whether err is a serialization failure (40001) or a
// deadlock (40P01): another transaction got in the way, and the same
// statements sent again may go through.
func conflict(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// classify marks an error that the database answered with, and that is
// not an outage, for the coordinator: a conflict (serialization failure,
// deadlock) matches coordinator.ErrConflict; a prepared statement that a
// connection pooler in transaction mode ran on another server connection
// than the one it was prepared on (42P05 duplicate_prepared_statement,
// 26000 invalid_sql_statement_name), or a server that takes no writes
// (25006 read_only_sql_transaction: a standby, a demoted primary), matches
// coordinator.ErrMisconfigured. Either way the coordinator never runs the
// action unprotected: the server answered.
func classify(err error) error {
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "40001", "40P01":
		return fmt.Errorf("%w: %w", coordinator.ErrConflict, err)
	case "42P05", "26000":
		return fmt.Errorf("%w (behind a connection pooler in transaction mode, such as PgBouncer, set default_query_exec_mode=exec in the connection string): %w", coordinator.ErrMisconfigured, err)
	case "25006":
		return fmt.Errorf("%w (%s): %w", coordinator.ErrMisconfigured, readOnly, err)
	}
	return err
}

// scanRecord reads a row of selectRecord; no row is an absent record.
func scanRecord(row pgx.Row) (idemstore.Record, error) {
	var (
		state, token, fp string
		result           []byte
		ttl              int64
	)
	if err := row.Scan(&state, &token, &fp, &result, &ttl); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return idemstore.Record{}, nil
		}
		return idemstore.Record{}, err
	}
	rec := idemstore.Record{State: stateOf(state), Token: token, Fingerprint: fp, TTL: time.Duration(ttl) * time.Microsecond}
	if rec.State != idemstore.StatePending {
		rec.Result = result
	}
	return rec, nil
}

// nullRecord is a record's columns as a LEFT JOIN returns them: all NULL
// when there is no live record.
type nullRecord struct {
	state, token, fp *string
	result           []byte
	ttl              *int64
}

// record returns the record of n's columns, absent when they are NULL.
func (n nullRecord) record() idemstore.Record {
	if n.state == nil || n.token == nil || n.fp == nil || n.ttl == nil {
		return idemstore.Record{}
	}
	rec := idemstore.Record{State: stateOf(*n.state), Token: *n.token, Fingerprint: *n.fp, TTL: time.Duration(*n.ttl) * time.Microsecond}
	if rec.State != idemstore.StatePending {
		rec.Result = n.result
	}
	return rec
}

// nonNil returns b, or an empty slice for nil: a completed record's result
// is never NULL, so that an empty result and a missing one are one thing.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// lockTimeout returns d as a value of the lock_timeout setting: whole
// milliseconds, at least 1 (0 would turn the timeout off).
func lockTimeout(d time.Duration) string {
	return fmt.Sprintf("%dms", max(d.Milliseconds(), 1))
}

// lockNotAvailable reports whether err is PostgreSQL's lock_not_available
// (55P03): a lock_timeout passed.
func lockNotAvailable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

func checkTTL(method string, key idemstore.Key, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("idempg: %s %s: time to live %v is not positive", method, key, ttl)
	}
	return nil
}
