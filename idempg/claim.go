package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/coordinator"
)

var _ coordinator.Transactor = (*Store)(nil)

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
	// restoreTimeouts puts back the session's lock_timeout and
	// statement_timeout that holderSettings saved before a lock wait
	// (setLockWait), so that the action runs with them.
	restoreTimeouts = `SELECT set_config('lock_timeout', current_setting('idempg.lock_timeout'), true),
	set_config('statement_timeout', current_setting('idempg.statement_timeout'), true)`

	// holderSettings saves the session's lock_timeout and
	// statement_timeout (restoreTimeouts puts them back), and makes the
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

// Claim implements coordinator.Transactor: it claims key for w in a
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
func (s *Store) Claim(ctx context.Context, key coordinator.Key, w coordinator.Write, wait time.Duration) (coordinator.Claim, coordinator.Record, error) {
	if w.State != coordinator.StatePending {
		return nil, coordinator.Record{}, fmt.Errorf("idempg: claim %s: write state is %s, want pending", key, w.State)
	}
	if err := checkTTL("claim", key, w.TTL); err != nil {
		return nil, coordinator.Record{}, err
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
			return c, coordinator.Record{}, nil
		case err == nil:
			leave()
			return nil, rec, nil
		case conflict(err) && attempt < maxConflictRetries && pause(ctx, attempt):
			continue // a serialization failure or a deadlock: nothing was claimed
		}
		leave()
		if lockNotAvailable(err) {
			return nil, coordinator.Record{}, &coordinator.InProgressError{Operation: key.Operation, Key: key.Key, RetryAfter: time.Second}
		}
		return nil, coordinator.Record{}, fmt.Errorf("idempg: claim %s: %w", key, classify(err))
	}
}

// claimOnce is one attempt of Claim, in a transaction of its own: it
// returns the open claim, or the record there with its transaction rolled
// back, or the database's error with its transaction rolled back.
func (s *Store) claimOnce(ctx context.Context, key coordinator.Key, w coordinator.Write, until time.Time) (*claim, coordinator.Record, error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, coordinator.Record{}, err
	}
	c := &claim{s: s, tx: tx, key: key, token: w.Token, fp: w.Fingerprint, leave: func() {}}
	held := false
	defer func() {
		if !held {
			c.rollback(ctx)
		}
	}()
	written, rec, err := c.claim(ctx, w, time.Until(until))
	if err != nil {
		return nil, coordinator.Record{}, err
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
			return nil, coordinator.Record{}, err
		case !found:
			return nil, coordinator.Record{}, nil // deleted meanwhile (the sweeper)
		case !takeable(locked, w):
			return nil, locked, nil
		}
		tag, err := tx.Exec(ctx, takeOver, key.Operation, key.Key, w.Token, w.Fingerprint, w.TTL.Milliseconds())
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("the locked record is gone")
		}
		if err != nil {
			return nil, coordinator.Record{}, err
		}
	}
	held = true
	return c, coordinator.Record{}, nil
}

// Begin implements coordinator.Transactor: a transaction at READ COMMITTED
// with no record, for a call made with the kill switch off.
func (s *Store) Begin(ctx context.Context) (coordinator.Claim, error) {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("idempg: begin: %w", classify(err))
	}
	return &claim{s: s, tx: tx, leave: func() {}}, nil
}

// takeable reports whether a claim may take over rec, a record that is
// there: it expired (reported absent), or it is the record w heals.
func takeable(rec coordinator.Record, w coordinator.Write) bool {
	return rec.State == coordinator.StateAbsent ||
		w.Replace && rec.State != coordinator.StatePending && rec.Token == w.ReplaceToken
}

// claim is a transaction that holds a key (or, from Begin, none: key is
// zero).
type claim struct {
	s     *Store
	tx    pgx.Tx
	key   coordinator.Key
	token string
	fp    string
	leave func() // lets the next caller of this process claim the key
	read  coordinator.Record
	ended bool
	steps bool // the call is a Steps call: its steps live as long as its record
}

// claim writes the pending record w in the transaction if the key has no
// row, waiting for another transaction that inserted one up to wait; when
// it does not write, it returns the record that is there (absent when it
// expired), with no lock taken. It is one round trip.
func (c *claim) claim(ctx context.Context, w coordinator.Write, wait time.Duration) (written bool, rec coordinator.Record, err error) {
	b := &pgx.Batch{}
	queueHolderSettings(b, c.tx, w.TTL)
	err = c.waitThenRead(ctx, b, wait, &written, claimRecord,
		c.key.Operation, c.key.Key, statePending, w.Token, w.Fingerprint, w.TTL.Milliseconds())
	return written, c.read, err
}

// queueHolderSettings queues holderSettings, or holderSettings14 when the
// server of tx has client_connection_check_interval (PostgreSQL 14 and
// later), with lease as idle_in_transaction_session_timeout.
func queueHolderSettings(b *pgx.Batch, tx pgx.Tx, lease time.Duration) {
	v := tx.Conn().PgConn().ParameterStatus("server_version")
	if major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); major >= 14 {
		b.Queue(holderSettings14, millis(lease), keepalives[0], keepalives[1], keepalives[2], checkEvery)
		return
	}
	b.Queue(holderSettings, millis(lease), keepalives[0], keepalives[1], keepalives[2])
}

// lock locks the key's row, waiting for another transaction that holds it
// up to wait, and returns the record there once locked; found is false
// when there is no row. It is one round trip.
func (c *claim) lock(ctx context.Context, wait time.Duration) (found bool, rec coordinator.Record, err error) {
	err = c.waitThenRead(ctx, &pgx.Batch{}, wait, &found, lockRow, c.key.Operation, c.key.Key)
	return found, c.read, err
}

// waitThenRead sends b with, after what it holds: the lock wait set to
// wait, sql (which returns true or no row, into *flag), a read of the
// key's record into c.read, and the session's timeouts put back.
func (c *claim) waitThenRead(ctx context.Context, b *pgx.Batch, wait time.Duration, flag *bool, sql string, args ...any) error {
	*flag, c.read = false, coordinator.Record{}
	b.Queue(setLockWait, lockTimeout(wait))
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(flag)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	b.Queue(selectRecord, c.key.Operation, c.key.Key).QueryRow(func(row pgx.Row) error {
		var err error
		c.read, err = scanRecord(row)
		return err
	})
	b.Queue(restoreTimeouts)
	return c.tx.SendBatch(ctx, b).Close()
}

// Context implements coordinator.Claim: ctx with the transaction, which Tx
// returns.
func (c *claim) Context(ctx context.Context) context.Context {
	return context.WithValue(ctx, txKey{}, &ownedTx{Tx: c.tx, claim: c})
}

// Commit implements coordinator.Claim: it writes the completed record in
// place of the claim and commits.
func (c *claim) Commit(ctx context.Context, comp coordinator.Completion) error {
	if c.ended {
		return errors.New("idempg: the claim's transaction is already ended")
	}
	defer c.end()
	if err := c.endedBySQL(ctx); err != nil {
		return err
	}
	if c.key != (coordinator.Key{}) {
		st := stateName(comp.State)
		if st == "" || st == statePending {
			_ = c.tx.Rollback(ctx)
			return fmt.Errorf("idempg: commit %s: state is %s, want completed or not_replayable", c.key, comp.State)
		}
		var tag pgconn.CommandTag
		b := &pgx.Batch{}
		b.Queue(completeClaim, c.key.Operation, c.key.Key, c.token, st, nonNil(comp.Result), comp.TTL.Milliseconds()).
			Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
		if c.steps {
			b.Queue(keepSteps, c.key.Operation, c.key.Key)
		}
		err := c.tx.SendBatch(ctx, b).Close()
		if err == nil && tag.RowsAffected() != 1 {
			err = errors.New("the action's transaction changed or deleted the key's record")
		}
		if err != nil {
			c.rollback(ctx)
			return fmt.Errorf("idempg: complete %s in the transaction: %w", c.key, classify(err))
		}
	}
	if err := c.tx.Commit(ctx); err != nil {
		return fmt.Errorf("idempg: commit %s (rolled back, or its outcome is unknown: a retry replays or runs once): %w", c.key, classify(err))
	}
	return nil
}

// Rollback implements coordinator.Claim: it rolls the transaction back,
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

func (c *claim) rollback(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = c.tx.Rollback(rctx)
}

// end marks the claim ended and lets the next caller of this process claim
// the key.
func (c *claim) end() {
	c.ended = true
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
	_ = c.tx.Rollback(ctx) // hands the connection back; the server has no transaction to end
	if c.key == (coordinator.Key{}) {
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

// txKey is the context key of the transaction of a claim.
type txKey struct{}

// Tx returns the transaction of the protected call that ctx belongs to:
// the one in which the call's record commits, when the coordinator's store
// is a Store (the handler of idemhttp, idemgin, idemecho, idemgrpc or
// idemconnect, a consumer's handler, and the action of Do or of
// coordinator.Do get such a context). Writes through it commit with the
// call's record, or roll back with it. ok is false when ctx belongs to no
// such call. The action must not end the transaction: its Commit and
// Rollback return an error and do nothing, and a COMMIT, ROLLBACK, END or
// ABORT statement is refused (ErrTxEnded); tx.Begin makes a savepoint, as
// usual.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	t, ok := ctx.Value(txKey{}).(*ownedTx)
	if !ok {
		return nil, false
	}
	return t, true
}

// ownedTx is the transaction as the action gets it: the coordinator commits
// or rolls it back, so its own Commit and Rollback refuse, and so does a
// statement that would end it.
type ownedTx struct {
	pgx.Tx
	claim *claim // the claim whose transaction it is; nil for a phase's (Steps)
}

// errOwned is what Commit and Rollback of the action's transaction return.
var errOwned = errors.New("idempg: the transaction belongs to the protected call: return from the action to commit, or return an error to roll back")

// Commit refuses: the protected call commits.
func (*ownedTx) Commit(context.Context) error { return errOwned }

// Rollback refuses: the protected call rolls back when the action returns an
// error.
func (*ownedTx) Rollback(context.Context) error { return errOwned }

// Begin begins a savepoint, whose statements are checked too.
func (t *ownedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{sp}, nil
}

// Exec refuses a statement that would end the transaction.
func (t *ownedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if endsTx(sql) {
		return pgconn.CommandTag{}, ErrTxEnded
	}
	return t.Tx.Exec(ctx, sql, args...)
}

// Query refuses a statement that would end the transaction.
func (t *ownedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if endsTx(sql) {
		return nil, ErrTxEnded
	}
	return t.Tx.Query(ctx, sql, args...)
}

// QueryRow refuses a statement that would end the transaction.
func (t *ownedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if endsTx(sql) {
		return errRow{}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch refuses a batch with a statement that would end the
// transaction.
func (t *ownedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		if endsTx(q.SQL) {
			return refusedBatch{}
		}
	}
	return t.Tx.SendBatch(ctx, b)
}

// savepoint is a savepoint of the action's transaction: its Commit and
// Rollback release and roll back the savepoint, and its statements are
// checked as the transaction's are.
type savepoint struct{ pgx.Tx }

func (s savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	sp, err := s.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{sp}, nil
}

func (s savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if endsTx(sql) {
		return pgconn.CommandTag{}, ErrTxEnded
	}
	return s.Tx.Exec(ctx, sql, args...)
}

func (s savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if endsTx(sql) {
		return nil, ErrTxEnded
	}
	return s.Tx.Query(ctx, sql, args...)
}

func (s savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if endsTx(sql) {
		return errRow{}
	}
	return s.Tx.QueryRow(ctx, sql, args...)
}

// errRow is the Row of a refused statement.
type errRow struct{}

func (errRow) Scan(...any) error { return ErrTxEnded }

// refusedBatch is the BatchResults of a refused batch.
type refusedBatch struct{}

func (refusedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, ErrTxEnded }
func (refusedBatch) Query() (pgx.Rows, error)         { return nil, ErrTxEnded }
func (refusedBatch) QueryRow() pgx.Row                { return errRow{} }
func (refusedBatch) Close() error                     { return ErrTxEnded }
func (refusedBatch) Tx() pgx.Tx                       { return nil }

// endsTx reports whether sql begins with a statement that ends a
// transaction block: COMMIT, END, ABORT, ROLLBACK (but not ROLLBACK TO a
// savepoint) or PREPARE TRANSACTION. Only the first statement is looked
// at: the extended protocol, which pgx uses unless told to use the simple
// one, runs one statement per query, and what gets past this check is
// found when the action returns.
func endsTx(sql string) bool {
	words := firstWords(sql, 2)
	if len(words) == 0 {
		return false
	}
	switch words[0] {
	case "commit", "end", "abort":
		return true
	case "rollback":
		return len(words) < 2 || words[1] != "to"
	case "prepare":
		return len(words) == 2 && words[1] == "transaction"
	}
	return false
}

// firstWords returns up to n words of sql, lower-cased, after leading
// spaces and comments.
func firstWords(sql string, n int) []string {
	var words []string
	s := sql
	for len(words) < n {
		s = strings.TrimLeft(s, " \t\r\n;")
		switch {
		case strings.HasPrefix(s, "--"):
			if i := strings.IndexByte(s, '\n'); i >= 0 {
				s = s[i+1:]
				continue
			}
			return words
		case strings.HasPrefix(s, "/*"):
			if i := strings.Index(s, "*/"); i >= 0 {
				s = s[i+2:]
				continue
			}
			return words
		}
		i := 0
		for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= 'A' && s[i] <= 'Z' || s[i] == '_') {
			i++
		}
		if i == 0 {
			return words
		}
		words = append(words, strings.ToLower(s[:i]))
		s = s[i:]
	}
	return words
}
