package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
)

var _ idemstore.Transactor = (*Store)(nil)

// Tunables of the transactional call.
const (
	// cleanupTimeout bounds a rollback, and the marking of a key whose
	// action ended its transaction.
	cleanupTimeout = 5 * time.Second
	// checkInterval is client_connection_check_interval in a claim's
	// transaction: how often the server checks, while a statement of the
	// holder runs, that the holder's connection is still there.
	checkInterval = time.Second
	// keepaliveIdle, keepaliveInterval and keepaliveCount are the TCP
	// keepalives of a claim's transaction: a holder whose host or network
	// vanished is found within about idle + interval * count.
	keepaliveIdle     = 5 * time.Second
	keepaliveInterval = time.Second
	keepaliveCount    = 3
	// maxReasonLen bounds the reason a not-replayable record keeps, as in
	// the coordinator.
	maxReasonLen = 256
)

// The SQL of the transactional call, besides the Store's.
const (
	// holderSettings saves the session's lock_timeout and
	// statement_timeout (readRestoring puts them back after a claim's lock
	// wait), and makes the
	// database end the transaction of a holder that died or froze, and so
	// free its key: $1 is idle_in_transaction_session_timeout (the lease: a
	// holder that sends nothing for a lease is taken for frozen), $2 to $4
	// the TCP keepalives. They hold for the transaction only. One statement,
	// so that a claim costs no more statements than it did without them.
	holderSettings = `SELECT set_config('idempg.lock_timeout', current_setting('lock_timeout'), true),
	set_config('idempg.statement_timeout', current_setting('statement_timeout'), true),
	set_config('idle_in_transaction_session_timeout', $1, true),
	set_config('tcp_keepalives_idle', $2, true), set_config('tcp_keepalives_interval', $3, true),
	set_config('tcp_keepalives_count', $4, true)`
	// holderSettings14 is holderSettings with, in $5,
	// client_connection_check_interval (PostgreSQL 14 and later): a holder
	// killed while a statement of its runs is found within it, instead of
	// when the statement ends.
	holderSettings14 = holderSettings + `, set_config('client_connection_check_interval', $5, true)`
	// claimSettings and claimSettings14, the first statement of a claim's
	// transaction, are holderSettings and holderSettings14 that also set
	// the lock wait of the claim's INSERT, in their last parameter, as
	// setLockWait does. PostgreSQL evaluates a SELECT's output columns in
	// order, so the saves read the session's values before the lock wait
	// replaces them.
	claimSettings   = holderSettings + `, set_config('lock_timeout', $5, true), set_config('statement_timeout', '0', true)`
	claimSettings14 = holderSettings14 + `, set_config('lock_timeout', $6, true), set_config('statement_timeout', '0', true)`

	// readRestoring, the last statement of a claim's batch, reads the
	// key's live record as selectRecord does, in exactly one row (NULLs
	// when there is none), and puts back the session's lock_timeout and
	// statement_timeout that claimSettings saved, so that the action runs
	// with them.
	readRestoring = `SELECT r.state, r.token, r.fingerprint, r.result,
	GREATEST(1, ceil(extract(epoch FROM r.expires_at - clock_timestamp()) * 1000000))::bigint,
	set_config('lock_timeout', current_setting('idempg.lock_timeout'), true),
	set_config('statement_timeout', current_setting('idempg.statement_timeout'), true)
FROM (VALUES (1)) AS one
LEFT JOIN idempotency_records r
	ON r.operation = $1 AND r.key = $2 AND r.expires_at > clock_timestamp()`

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
	// When the row is no longer the claim's (the action changed or deleted
	// it), it fails with division_by_zero, which aborts the transaction, so
	// that a COMMIT sent with it does not commit (see errRecordChanged).
	completeClaim = `WITH done AS (UPDATE idempotency_records
SET state = $4, result = $5, expires_at = clock_timestamp() + $6 * interval '1 millisecond'
WHERE operation = $1 AND key = $2 AND token = $3 AND state = 'pending'
RETURNING 1)
SELECT 1 / count(*) FROM done`

	// keepEnded keeps the key of an action that ended its transaction with
	// SQL as not replayable, unless another caller holds it by now: its
	// writes may have committed, so it must not run again.
	keepEnded = `INSERT INTO idempotency_records AS r
	(operation, key, state, token, fingerprint, result, expires_at, created_at)
VALUES ($1, $2, 'not_replayable', $3, $4, $5, clock_timestamp() + $6 * interval '1 millisecond', clock_timestamp())
ON CONFLICT (operation, key) DO UPDATE SET
	state = EXCLUDED.state, result = EXCLUDED.result, expires_at = EXCLUDED.expires_at
WHERE r.token = $3 OR r.expires_at <= clock_timestamp()`
)

// ErrTxEnded is returned, wrapped, when an action ended the transaction it
// was given with SQL (a COMMIT, ROLLBACK, END or ABORT statement) instead
// of returning: a statement that would is refused before it is sent, and a
// transaction found ended when the action returns keeps its key as
// completed and not replayable, since some of its writes may have
// committed: the action never runs again for the key.
var ErrTxEnded = errors.New("idempg: the action ended its transaction with SQL; return from the action to commit, or return an error to roll back")

// Claim implements idemstore.Transactor: it claims key for w in a
// transaction at READ COMMITTED and returns it open, or returns the record
// that holds the key. A caller of this process that claims the key waits
// for it here, without a connection, while another one holds it, so that
// the waiters of one key take at most one connection of the pool each
// process; the holder's transaction is waited for on the row's lock, up to
// wait. It returns a *coordinator.InProgressError when the key was held
// throughout. The claim sets, for its transaction only,
// idle_in_transaction_session_timeout to w.TTL (the lease),
// client_connection_check_interval and TCP keepalives, so that the database
// ends the transaction of a holder that died or froze (see the package
// documentation, "Dead and frozen holders").
func (s *Store) Claim(ctx context.Context, key idemstore.Key, w idemstore.Write, wait time.Duration) (idemstore.Claim, idemstore.Record, error) {
	if w.State != idemstore.StatePending {
		return nil, idemstore.Record{}, fmt.Errorf("idempg: claim %s: write state is %s, want pending", key, w.State)
	}
	if err := checkTTL("claim", key, w.TTL); err != nil {
		return nil, idemstore.Record{}, err
	}
	until := time.Now().Add(wait)
	leave, rec, settled, err := s.gates.enter(ctx, s, key, w, until)
	if err != nil || settled {
		return nil, rec, err
	}
	for attempt := 0; ; attempt++ {
		c, rec, err := s.claimOnce(ctx, key, w, until)
		switch {
		case c != nil:
			c.leave = leave
			return c, idemstore.Record{}, nil
		case err == nil:
			leave()
			return nil, rec, nil
		case conflict(err) && attempt < maxConflictRetries && pause(ctx, attempt):
			continue // a serialization failure or a deadlock: nothing was claimed
		}
		leave()
		if lockNotAvailable(err) {
			return nil, idemstore.Record{}, &coordinator.InProgressError{Operation: key.Operation, Key: key.Key, RetryAfter: time.Second}
		}
		return nil, idemstore.Record{}, fmt.Errorf("idempg: claim %s: %w", key, classify(err))
	}
}

// claimOnce is one attempt of Claim, in a transaction of its own: it
// returns the open claim, or the record there with its transaction rolled
// back, or the database's error with its transaction rolled back.
func (s *Store) claimOnce(ctx context.Context, key idemstore.Key, w idemstore.Write, until time.Time) (*claim, idemstore.Record, error) {
	c, err := s.begin(ctx)
	if err != nil {
		return nil, idemstore.Record{}, err
	}
	c.key, c.token, c.fp = key, w.Token, w.Fingerprint
	held := false
	defer func() {
		if !held {
			c.rollback(ctx)
		}
	}()
	written, rec, err := c.claim(ctx, w, time.Until(until))
	if err != nil {
		return nil, idemstore.Record{}, err
	}
	if !written {
		if !takeable(rec, w) {
			return nil, rec, nil
		}
		// The record must be replaced (expired, or unreadable): lock its
		// row, and look again once it is locked.
		found, locked, err := c.lock(ctx, time.Until(until))
		switch {
		case err != nil:
			return nil, idemstore.Record{}, err
		case !found:
			return nil, idemstore.Record{}, nil // deleted meanwhile (the sweeper)
		case !takeable(locked, w):
			return nil, locked, nil
		}
		tag, err := c.tx.Exec(ctx, takeOver, key.Operation, key.Key, w.Token, w.Fingerprint, w.TTL.Milliseconds())
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("the locked record is gone")
		}
		if err != nil {
			return nil, idemstore.Record{}, err
		}
	}
	held = true
	return c, idemstore.Record{}, nil
}

// Begin implements idemstore.Transactor: a transaction at READ COMMITTED
// with no record, for a call made with the kill switch off.
func (s *Store) Begin(ctx context.Context) (idemstore.Claim, error) {
	c, err := s.begin(ctx)
	if err == nil && c.unbegun {
		c.unbegun = false
		if _, err = c.tx.Conn().Exec(ctx, beginReadCommitted); err != nil {
			c.rollback(ctx)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("idempg: begin: %w", classify(err))
	}
	return c, nil
}

// begin returns a claim's transaction at READ COMMITTED. Over a pool it
// takes a connection, so that the claim hands the connection back itself
// and its COMMIT can travel with the completion, in one round trip; so it
// can over a single connection. There, when pgx has begun a transaction on
// the connection before (connTxs), the claim is returned unbegun: its first
// batch sends the BEGIN (queueBegin), and so a claim costs one round trip
// less. Over another DB its Tx's own Commit and Rollback end it, as that
// DB's Tx needs.
func (s *Store) begin(ctx context.Context) (*claim, error) {
	c := &claim{s: s, leave: func() {}}
	switch db := s.db.(type) {
	case *pgxpool.Pool:
		conn, err := db.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		c.release = conn.Release
		if err := c.beginOn(ctx, conn.Conn()); err != nil {
			c.handBack() // a connection that failed to begin is closed: the pool drops it
			return nil, err
		}
	case *pgx.Conn:
		c.release = func() {}
		if err := c.beginOn(ctx, db); err != nil {
			return nil, err
		}
	default:
		var err error
		if c.tx, err = s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// beginOn makes conn the claim's: with the pgx.Tx that connTxs keeps for
// it, unbegun, or else with a transaction that pgx begins on it now, and
// which connTxs keeps for the next claims on conn.
func (c *claim) beginOn(ctx context.Context, conn *pgx.Conn) error {
	if tx, ok := c.s.txs.get(conn); ok {
		c.tx, c.unbegun = tx, true
		return nil
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return err
	}
	c.tx = tx
	c.s.txs.put(conn, tx)
	return nil
}

// queueBegin queues the BEGIN of an unbegun claim, first in b, the claim's
// first batch.
func (c *claim) queueBegin(b *pgx.Batch) {
	if c.unbegun {
		c.unbegun = false
		b.Queue(beginReadCommitted)
	}
}

// takeable reports whether a claim may take over rec, a record that is
// there: it expired (reported absent), or it is the record w heals.
func takeable(rec idemstore.Record, w idemstore.Write) bool {
	return rec.State == idemstore.StateAbsent ||
		w.Replace && rec.State != idemstore.StatePending && rec.Token == w.ReplaceToken
}

// claim is a transaction that holds a key (or, from Begin, none: key is
// zero).
type claim struct {
	s  *Store
	tx pgx.Tx
	// release hands the transaction's connection back once it is ended;
	// nil when tx's own Commit and Rollback do (see Store.begin). When it
	// is set, the claim sends BEGIN, COMMIT and ROLLBACK itself, and tx,
	// which then never hears of them, serves the next claim on the
	// connection (connTxs), and must not be used through this claim once
	// it ends: closed says so to the action's handles on it (ownedTx,
	// savepoint).
	release  func()
	released bool
	unbegun  bool // the claim's first batch sends its BEGIN (Store.begin)
	closed   atomic.Bool
	key      idemstore.Key
	token    string
	fp       string
	leave    func() // lets the next caller of this process claim the key
	read     idemstore.Record
	ended    bool
	steps    bool // the call is a Steps call: its steps live as long as its record
}

// claim writes the pending record w in the transaction if the key has no
// row, waiting for another transaction that inserted one up to wait; when
// it does not write, it returns the record that is there (absent when it
// expired), with no lock taken. It is one round trip.
func (c *claim) claim(ctx context.Context, w idemstore.Write, wait time.Duration) (written bool, rec idemstore.Record, err error) {
	b := &pgx.Batch{}
	c.queueBegin(b)
	queueClaimSettings(b, c.tx, w.TTL, wait)
	err = c.thenRead(ctx, b, &written, claimRecord,
		c.key.Operation, c.key.Key, statePending, w.Token, w.Fingerprint, w.TTL.Milliseconds())
	return written, c.read, err
}

// queueClaimSettings queues claimSettings, or claimSettings14 when the
// server of tx has client_connection_check_interval (PostgreSQL 14 and
// later), with lease as idle_in_transaction_session_timeout and wait as the
// lock wait.
func queueClaimSettings(b *pgx.Batch, tx pgx.Tx, lease, wait time.Duration) {
	if hasCheckInterval(tx) {
		b.Queue(claimSettings14, millis(lease), keepalives[0], keepalives[1], keepalives[2], checkEvery, lockTimeout(wait))
		return
	}
	b.Queue(claimSettings, millis(lease), keepalives[0], keepalives[1], keepalives[2], lockTimeout(wait))
}

// queueHolderSettings queues holderSettings, or holderSettings14 when the
// server of tx has client_connection_check_interval, with lease as
// idle_in_transaction_session_timeout.
func queueHolderSettings(b *pgx.Batch, tx pgx.Tx, lease time.Duration) {
	if hasCheckInterval(tx) {
		b.Queue(holderSettings14, millis(lease), keepalives[0], keepalives[1], keepalives[2], checkEvery)
		return
	}
	b.Queue(holderSettings, millis(lease), keepalives[0], keepalives[1], keepalives[2])
}

// hasCheckInterval reports whether the server of tx has
// client_connection_check_interval: PostgreSQL 14 and later.
func hasCheckInterval(tx pgx.Tx) bool {
	v := tx.Conn().PgConn().ParameterStatus("server_version")
	v, _, _ = strings.Cut(v, ".")
	major, _ := strconv.Atoi(v)
	return major >= 14
}

// lock locks the key's row, waiting for another transaction that holds it
// up to wait, and returns the record there once locked; found is false
// when there is no row. It is one round trip.
func (c *claim) lock(ctx context.Context, wait time.Duration) (found bool, rec idemstore.Record, err error) {
	b := &pgx.Batch{}
	b.Queue(setLockWait, lockTimeout(wait))
	err = c.thenRead(ctx, b, &found, lockRow, c.key.Operation, c.key.Key)
	return found, c.read, err
}

// thenRead sends b, which sets the lock wait, with after it: sql (which
// returns true or no row, into *flag), and readRestoring, which reads the
// key's record into c.read and puts the session's timeouts back.
func (c *claim) thenRead(ctx context.Context, b *pgx.Batch, flag *bool, sql string, args ...any) error {
	*flag, c.read = false, idemstore.Record{}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(flag)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(readRestoring, c.key.Operation, c.key.Key).QueryRow(func(row pgx.Row) error {
		var (
			rec              nullRecord
			restored, before string
		)
		if err := row.Scan(&rec.state, &rec.token, &rec.fp, &rec.result, &rec.ttl, &restored, &before); err != nil {
			return err
		}
		c.read = rec.record()
		return nil
	})
	return c.tx.SendBatch(ctx, b).Close()
}

// Context implements idemstore.Claim: ctx with the transaction, which Tx
// returns.
func (c *claim) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &ownedTx{Tx: c.tx, claim: c, closed: &c.closed})
}

// Commit implements idemstore.Claim: it writes the completed record in
// place of the claim and commits.
func (c *claim) Commit(ctx context.Context, comp idemstore.Completion) error {
	if c.ended {
		return errors.New("idempg: the claim's transaction is already ended")
	}
	defer c.end()
	if err := c.endedBySQL(ctx); err != nil {
		return err
	}
	b := &pgx.Batch{}
	if c.key != (idemstore.Key{}) {
		st := stateName(comp.State)
		if st == "" || st == statePending {
			c.rollback(ctx)
			return fmt.Errorf("idempg: commit %s: state is %s, want completed or not_replayable", c.key, comp.State)
		}
		b.Queue(completeClaim, c.key.Operation, c.key.Key, c.token, st, nonNil(comp.Result), comp.TTL.Milliseconds())
		if c.steps {
			b.Queue(keepSteps, c.key.Operation, c.key.Key)
		}
	}
	if c.release == nil {
		// The DB's Tx ends itself: the completion, then its Commit.
		if b.Len() > 0 {
			if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
				c.rollback(ctx)
				return c.completeFailed(err)
			}
		}
		if err := c.tx.Commit(ctx); err != nil {
			return c.commitFailed(err)
		}
		return nil
	}
	// The completion and the COMMIT in one round trip. A statement that
	// fails aborts the transaction, and the COMMIT after it in the batch
	// is not run: the server ignores the rest of a batch that failed.
	b.Queue("COMMIT")
	err := c.tx.SendBatch(ctx, b).Close()
	var pe *pgconn.PgError
	switch status := c.tx.Conn().PgConn().TxStatus(); {
	case err == nil:
		c.handBack()
		return nil
	case errors.As(err, &pe) && status == 'E':
		// A completing statement failed: nothing committed.
		c.rollback(ctx)
		return c.completeFailed(err)
	default:
		// The COMMIT failed (rolled back), or the answers were lost (the
		// outcome is unknown).
		c.rollback(ctx)
		return c.commitFailed(err)
	}
}

// completeFailed is the error of a completing statement that failed, its
// transaction rolled back.
func (c *claim) completeFailed(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "22012" { // completeClaim's division_by_zero
		err = errRecordChanged
	}
	return fmt.Errorf("idempg: complete %s in the transaction: %w", c.key, classify(err))
}

// commitFailed is the error of a COMMIT that failed or whose answer was
// lost.
func (c *claim) commitFailed(err error) error {
	return fmt.Errorf("idempg: commit %s (rolled back, or its outcome is unknown: a retry replays or runs once): %w", c.key, classify(err))
}

// errRecordChanged is why a claim whose record the action changed or
// deleted does not commit.
var errRecordChanged = errors.New("the action's transaction changed or deleted the key's record")

// Rollback implements idemstore.Claim: it rolls the transaction back,
// also when ctx has ended (the caller hung up).
func (c *claim) Rollback(ctx context.Context) error {
	if c.ended {
		return nil
	}
	defer c.end()
	if err := c.endedBySQL(ctx); err != nil {
		return err
	}
	c.rollback(ctx)
	return nil
}

// rollback rolls the transaction back and hands its connection back. A
// claim with release sends the ROLLBACK itself, when the server has a
// transaction to end (none after a batch that ended it, such as a failed
// COMMIT, nor before its BEGIN was sent); a connection that is left in a
// transaction is closed by the pool when it is handed back.
func (c *claim) rollback(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	switch {
	case c.release == nil:
		_ = c.tx.Rollback(rctx)
	case c.tx.Conn().PgConn().TxStatus() != 'I':
		_, _ = c.tx.Conn().Exec(rctx, "ROLLBACK")
	}
	c.handBack()
}

// handBack hands the connection of a claim with release back, once.
func (c *claim) handBack() {
	c.closed.Store(true)
	if c.release != nil && !c.released {
		c.released = true
		c.release()
	}
}

// end marks the claim ended and lets the next caller of this process claim
// the key.
func (c *claim) end() {
	c.ended = true
	c.closed.Store(true)
	c.leave()
}

// endedBySQL checks, when the action returns, that its transaction is
// still open. One that the action ended with SQL (a COMMIT, or a ROLLBACK
// and then writes that committed on their own) may have committed some of
// its writes: its key is kept as completed and not replayable, so that the
// action never runs again for it, and the error says what happened.
func (c *claim) endedBySQL(ctx context.Context) error {
	if c.tx.Conn().PgConn().TxStatus() != 'I' {
		return nil
	}
	c.rollback(ctx) // hands the connection back; the server has no transaction to end
	if c.key == (idemstore.Key{}) {
		return ErrTxEnded
	}
	reason := "the action ended its transaction with a COMMIT or ROLLBACK statement, so some of its writes may have committed; the key is kept so that it does not run again"
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := c.s.send(cctx, func(b *pgx.Batch) {
		b.Queue(keepEnded, c.key.Operation, c.key.Key, c.token, c.fp, []byte(reason[:min(len(reason), maxReasonLen)]), keptEnded.Milliseconds())
	})
	if err != nil {
		return fmt.Errorf("%w (and keeping %s as not replayable failed: %w)", ErrTxEnded, c.key, err)
	}
	return fmt.Errorf("%w: %s is kept as completed and not replayable", ErrTxEnded, c.key)
}

// keptEnded is how long the key of an action that ended its transaction
// is kept: a day, longer than any retry of it.
const keptEnded = 24 * time.Hour

// keepalives and checkEvery are the values of the holder's settings.
var (
	keepalives = [3]string{seconds(keepaliveIdle), seconds(keepaliveInterval), strconv.Itoa(keepaliveCount)}
	checkEvery = millis(checkInterval)
)

// millis and seconds format d as a setting's value.
func millis(d time.Duration) string  { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms" }
func seconds(d time.Duration) string { return strconv.FormatInt(max(int64(d/time.Second), 1), 10) }
