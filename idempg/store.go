package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// Store is a coordinator.Store on PostgreSQL, and the transactional call
// (Do) over the same table. Create one with New. It is safe for concurrent
// use.
//
// Leases and time to live are expires_at on the database's clock
// (clock_timestamp()): a record whose expires_at has passed is absent for
// every method, and the sweeper (Sweep, StartSweeper) deletes it later.
// Each method touches only its key's row, in one round trip. Record.TTL is
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
	db DB
}

var _ coordinator.Store = (*Store)(nil)

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

// The states as the table spells them: coordinator.State's names.
const (
	statePending       = "pending"
	stateCompleted     = "completed"
	stateNotReplayable = "not_replayable"
)

// stateName returns the name the table keeps for st, or "" for a state no
// record is written in.
func stateName(st coordinator.State) string {
	switch st {
	case coordinator.StatePending:
		return statePending
	case coordinator.StateCompleted:
		return stateCompleted
	case coordinator.StateNotReplayable:
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

// Reserve implements coordinator.Store: if the key is absent (no row, or an
// expired one), or w.Replace is set and the record is not pending and has
// token w.ReplaceToken, it writes w with time to live w.TTL and returns
// (coordinator.Record{}, true, nil); otherwise it returns the record under
// the key and false. It is one round trip: the INSERT ... ON CONFLICT and
// the read of the record that stopped it run as one implicit transaction.
// A key held by an open transaction of Do is reported as pending with an
// empty token once a lock wait of three quarters of the time left before
// ctx's deadline has passed (see Store). It returns an error for a Write
// whose State is not pending, completed or not replayable, or whose TTL is
// not positive.
func (s *Store) Reserve(ctx context.Context, key coordinator.Key, w coordinator.Write) (coordinator.Record, bool, error) {
	st := stateName(w.State)
	if st == "" {
		return coordinator.Record{}, false, fmt.Errorf("idempg: reserve %s: write state is %s, want pending, completed or not_replayable", key, w.State)
	}
	if err := checkTTL("reserve", key, w.TTL); err != nil {
		return coordinator.Record{}, false, err
	}
	var result []byte
	if st != statePending {
		result = nonNil(w.Result)
	}
	b := &pgx.Batch{}
	if d, ok := ctx.Deadline(); ok {
		// Waiting longer than the caller would only turn a held key into a
		// timeout, which a coordinator takes for a storage failure.
		b.Queue(setLockWait, lockTimeout(time.Until(d)*3/4))
	}
	var written bool
	b.Queue(insertRecord, key.Operation, key.Key, st, w.Token, w.Fingerprint, result, w.TTL.Milliseconds(),
		w.Replace, w.ReplaceToken).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&written)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	var rec coordinator.Record
	b.Queue(selectRecord, key.Operation, key.Key).QueryRow(func(row pgx.Row) error {
		var err error
		rec, err = scanRecord(row)
		return err
	})
	err := s.db.SendBatch(ctx, b).Close()
	switch {
	case lockNotAvailable(err):
		return coordinator.Record{State: coordinator.StatePending}, false, nil
	case err != nil:
		return coordinator.Record{}, false, fmt.Errorf("idempg: reserve %s: %w", key, err)
	case written:
		return coordinator.Record{}, true, nil
	}
	return rec, false, nil
}

// Get implements coordinator.Store: it returns the live record under key, or
// a Record with State coordinator.StateAbsent.
func (s *Store) Get(ctx context.Context, key coordinator.Key) (coordinator.Record, error) {
	rec, err := scanRecord(s.db.QueryRow(ctx, selectRecord, key.Operation, key.Key))
	if err != nil {
		return coordinator.Record{}, fmt.Errorf("idempg: get %s: %w", key, err)
	}
	return rec, nil
}

// Complete implements coordinator.Store: if key holds a live pending record
// owned by token, it makes it a record in state c.State with c.Result and
// time to live c.TTL, keeping its token and fingerprint, and reports true.
// It returns an error for a Completion whose State is not completed or not
// replayable, or whose TTL is not positive.
func (s *Store) Complete(ctx context.Context, key coordinator.Key, token string, c coordinator.Completion) (bool, error) {
	st := stateName(c.State)
	if st == "" || st == statePending {
		return false, fmt.Errorf("idempg: complete %s: state is %s, want completed or not_replayable", key, c.State)
	}
	if err := checkTTL("complete", key, c.TTL); err != nil {
		return false, err
	}
	return s.exec(ctx, "complete", key, completeRecord, key.Operation, key.Key, token, st, nonNil(c.Result), c.TTL.Milliseconds())
}

// Release implements coordinator.Store: if key holds a live pending record
// owned by token, it deletes it and reports true.
func (s *Store) Release(ctx context.Context, key coordinator.Key, token string) (bool, error) {
	return s.exec(ctx, "release", key, releaseRecord, key.Operation, key.Key, token)
}

// Renew implements coordinator.Store: if key holds a live pending record
// owned by token, it sets its time to live to lease and reports true. It
// returns an error for a lease that is not positive.
func (s *Store) Renew(ctx context.Context, key coordinator.Key, token string, lease time.Duration) (bool, error) {
	if err := checkTTL("renew", key, lease); err != nil {
		return false, err
	}
	return s.exec(ctx, "renew", key, renewRecord, key.Operation, key.Key, token, lease.Milliseconds())
}

// exec runs a statement that changes at most one row and reports whether it
// did.
func (s *Store) exec(ctx context.Context, method string, key coordinator.Key, sql string, args ...any) (bool, error) {
	tag, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return false, fmt.Errorf("idempg: %s %s: %w", method, key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// scanRecord reads a row of selectRecord; no row is an absent record.
func scanRecord(row pgx.Row) (coordinator.Record, error) {
	var (
		state, token, fp string
		result           []byte
		ttl              int64
	)
	if err := row.Scan(&state, &token, &fp, &result, &ttl); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return coordinator.Record{}, nil
		}
		return coordinator.Record{}, err
	}
	rec := coordinator.Record{Token: token, Fingerprint: fp, TTL: time.Duration(ttl) * time.Microsecond}
	switch state {
	case statePending:
		rec.State = coordinator.StatePending
	case stateCompleted:
		rec.State, rec.Result = coordinator.StateCompleted, result
	case stateNotReplayable:
		rec.State, rec.Result = coordinator.StateNotReplayable, result
	default:
		rec.State, rec.Result = coordinator.StateUnreadable, result
	}
	return rec, nil
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

func checkTTL(method string, key coordinator.Key, ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("idempg: %s %s: time to live %v is not positive", method, key, ttl)
	}
	return nil
}
