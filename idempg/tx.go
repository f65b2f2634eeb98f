package idempg

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
	claim  *claim       // the claim whose transaction it is; nil for a phase's (Steps)
	closed *atomic.Bool // set once the claim has ended; nil for a phase's (Steps)
}

// ended reports whether the transaction of closed has ended: the claim
// that owns it committed or rolled it back, and its connection may serve
// another caller by now.
func ended(closed *atomic.Bool) bool { return closed != nil && closed.Load() }

// errOwned is what Commit and Rollback of the action's transaction return.
var errOwned = errors.New("idempg: the transaction belongs to the protected call: return from the action to commit, or return an error to roll back")

// Commit refuses: the protected call commits.
func (*ownedTx) Commit(context.Context) error { return errOwned }

// Rollback refuses: the protected call rolls back when the action returns an
// error.
func (*ownedTx) Rollback(context.Context) error { return errOwned }

// Begin begins a savepoint, whose statements are checked too.
func (t *ownedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return beginSavepoint(ctx, t.Tx, t.closed)
}

// Exec refuses a statement that would end the transaction.
func (t *ownedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return checkedExec(ctx, t.Tx, t.closed, sql, args)
}

// Query refuses a statement that would end the transaction.
func (t *ownedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return checkedQuery(ctx, t.Tx, t.closed, sql, args)
}

// QueryRow refuses a statement that would end the transaction.
func (t *ownedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return checkedQueryRow(ctx, t.Tx, t.closed, sql, args)
}

// SendBatch refuses a batch with a statement that would end the
// transaction.
func (t *ownedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return checkedBatch(ctx, t.Tx, t.closed, b)
}

// CopyFrom refuses once the transaction has ended.
func (t *ownedTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	return checkedCopyFrom(ctx, t.Tx, t.closed, table, columns, rows)
}

// Prepare refuses once the transaction has ended.
func (t *ownedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return checkedPrepare(ctx, t.Tx, t.closed, name, sql)
}

// savepoint is a savepoint of the action's transaction: its Commit and
// Rollback release and roll back the savepoint, and its statements are
// checked as the transaction's are.
type savepoint struct {
	pgx.Tx
	closed *atomic.Bool // the owning transaction's (ownedTx.closed)
}

func (s savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	return beginSavepoint(ctx, s.Tx, s.closed)
}

func (s savepoint) Commit(ctx context.Context) error {
	if ended(s.closed) {
		return pgx.ErrTxClosed
	}
	return s.Tx.Commit(ctx)
}

func (s savepoint) Rollback(ctx context.Context) error {
	if ended(s.closed) {
		return pgx.ErrTxClosed
	}
	return s.Tx.Rollback(ctx)
}

func (s savepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return checkedExec(ctx, s.Tx, s.closed, sql, args)
}

func (s savepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return checkedQuery(ctx, s.Tx, s.closed, sql, args)
}

func (s savepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return checkedQueryRow(ctx, s.Tx, s.closed, sql, args)
}

func (s savepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return checkedBatch(ctx, s.Tx, s.closed, b)
}

func (s savepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	return checkedCopyFrom(ctx, s.Tx, s.closed, table, columns, rows)
}

func (s savepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return checkedPrepare(ctx, s.Tx, s.closed, name, sql)
}

// The checks of the action's transaction and its savepoints, in one place:
// a statement that would end the transaction is refused (ErrTxEnded), and
// so is any use once the call has ended it (pgx.ErrTxClosed).

func beginSavepoint(ctx context.Context, tx pgx.Tx, closed *atomic.Bool) (pgx.Tx, error) {
	if ended(closed) {
		return nil, pgx.ErrTxClosed
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return savepoint{Tx: sp, closed: closed}, nil
}

func checkedExec(ctx context.Context, tx pgx.Tx, closed *atomic.Bool, sql string, args []any) (pgconn.CommandTag, error) {
	switch {
	case ended(closed):
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	case endsTx(sql):
		return pgconn.CommandTag{}, ErrTxEnded
	}
	return tx.Exec(ctx, sql, args...)
}

func checkedQuery(ctx context.Context, tx pgx.Tx, closed *atomic.Bool, sql string, args []any) (pgx.Rows, error) {
	switch {
	case ended(closed):
		return nil, pgx.ErrTxClosed
	case endsTx(sql):
		return nil, ErrTxEnded
	}
	return tx.Query(ctx, sql, args...)
}

func checkedQueryRow(ctx context.Context, tx pgx.Tx, closed *atomic.Bool, sql string, args []any) pgx.Row {
	switch {
	case ended(closed):
		return errRow{pgx.ErrTxClosed}
	case endsTx(sql):
		return errRow{ErrTxEnded}
	}
	return tx.QueryRow(ctx, sql, args...)
}

func checkedBatch(ctx context.Context, tx pgx.Tx, closed *atomic.Bool, b *pgx.Batch) pgx.BatchResults {
	if ended(closed) {
		return refusedBatch{pgx.ErrTxClosed}
	}
	for _, q := range b.QueuedQueries {
		if endsTx(q.SQL) {
			return refusedBatch{ErrTxEnded}
		}
	}
	return tx.SendBatch(ctx, b)
}

func checkedCopyFrom(ctx context.Context, tx pgx.Tx, closed *atomic.Bool, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error) {
	if ended(closed) {
		return 0, pgx.ErrTxClosed
	}
	return tx.CopyFrom(ctx, table, columns, rows)
}

func checkedPrepare(ctx context.Context, tx pgx.Tx, closed *atomic.Bool, name, sql string) (*pgconn.StatementDescription, error) {
	if ended(closed) {
		return nil, pgx.ErrTxClosed
	}
	return tx.Prepare(ctx, name, sql)
}

// errRow is the Row of a refused statement.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// refusedBatch is the BatchResults of a refused batch.
type refusedBatch struct{ err error }

func (b refusedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b refusedBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b refusedBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b refusedBatch) Close() error                     { return b.err }
func (refusedBatch) Tx() pgx.Tx                         { return nil }

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

// connTxs keeps, for each connection that a claim has used, the pgx.Tx that
// pgx began on it for the first claim, and hands it to the later claims on
// that connection, which send their own BEGIN in their first batch: pgx
// makes a Tx only by sending a BEGIN on its own, a round trip of its own.
// pgx's Tx keeps no state of the server's transaction (its methods send
// their statements on the connection), and a claim never calls its Commit
// or Rollback, which would close it: the claim sends COMMIT and ROLLBACK
// itself. The Tx of a connection that is closed is dropped once as many
// Tx as were kept at the last sweep have been added.
type connTxs struct {
	m     sync.Map // *pgx.Conn → pgx.Tx
	added atomic.Int64
	mu    sync.Mutex // one sweep at a time
	sweep int64      // sweep when added reaches it; 0 means 64
}

// get returns the Tx kept for conn.
func (ts *connTxs) get(conn *pgx.Conn) (pgx.Tx, bool) {
	tx, ok := ts.m.Load(conn)
	if !ok {
		return nil, false
	}
	return tx.(pgx.Tx), true
}

// put keeps tx for conn, and drops the Tx of connections that are closed
// when enough have been added since the last time.
func (ts *connTxs) put(conn *pgx.Conn, tx pgx.Tx) {
	ts.m.Store(conn, tx)
	added := ts.added.Add(1)
	if !ts.mu.TryLock() {
		return
	}
	defer ts.mu.Unlock()
	if added < max(ts.sweep, 64) {
		return
	}
	var kept int64
	ts.m.Range(func(k, _ any) bool {
		if k.(*pgx.Conn).IsClosed() {
			ts.m.Delete(k)
		} else {
			kept++
		}
		return true
	})
	ts.added.Store(0)
	ts.sweep = kept
}
