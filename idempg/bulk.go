package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idempotency/coordinator"
)

var _ idemstore.BulkStore = (*Store)(nil)

// The SQL of the bulk methods: each takes a batch as parallel arrays, so
// that its size changes the arguments, never the statements.
const (
	// selectRecords reads the live records of the keys ($1 operations, $2
	// keys, in pairs) in the order given, one row per key, NULLs for an
	// absent one; the remaining time to live is selectRecord's.
	selectRecords = `SELECT r.state, r.token, r.fingerprint, r.result,
	GREATEST(1, ceil(extract(epoch FROM r.expires_at - clock_timestamp()) * 1000000))::bigint
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(operation, key, n)
LEFT JOIN idempotency_records r
	ON r.operation = k.operation AND r.key = k.key AND r.expires_at > clock_timestamp()
ORDER BY k.n`

	// insertRecords is insertRecord for distinct keys: it writes each
	// entry whose key is absent (no row, or an expired one), or whose
	// replace flag is set and whose row is not pending and has the entry's
	// replace token, and returns the keys it wrote. It takes the keys in
	// one order whatever the caller's, so that batches that overlap lock
	// their rows in the same order instead of deadlocking; like
	// insertRecord it locks the rows it does not write.
	insertRecords = `WITH k AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bigint[], $8::bool[], $9::text[])
		AS k(operation, key, state, token, fingerprint, result, ttl, replace, replace_token)
)
INSERT INTO idempotency_records AS r
	(operation, key, state, token, fingerprint, result, expires_at, created_at)
SELECT operation, key, state, token, fingerprint, result, clock_timestamp() + ttl * interval '1 millisecond', clock_timestamp()
FROM k
ORDER BY operation COLLATE "C", key COLLATE "C"
ON CONFLICT (operation, key) DO UPDATE SET
	state = EXCLUDED.state, token = EXCLUDED.token, fingerprint = EXCLUDED.fingerprint,
	result = EXCLUDED.result, expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at
WHERE r.expires_at <= clock_timestamp()
	OR (r.state <> 'pending' AND (r.operation, r.key, r.token) IN (SELECT operation, key, replace_token FROM k WHERE replace))
RETURNING r.operation, r.key`

	// completeRecords is completeRecord for many entries ($1 operations, $2
	// keys, $3 tokens, $4 states, $5 results, $6 times to live), and
	// returns the places (from 1) of the entries it completed. Of the
	// entries of one key with one token only the first can complete: the
	// record is not pending after it.
	completeRecords = `UPDATE idempotency_records r
SET state = k.state, result = k.result, expires_at = clock_timestamp() + k.ttl * interval '1 millisecond'
FROM (
	SELECT DISTINCT ON (operation, key, token) *
	FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bigint[]) WITH ORDINALITY
		AS k(operation, key, token, state, result, ttl, n)
	ORDER BY operation, key, token, n
) k
WHERE r.operation = k.operation AND r.key = k.key AND r.state = 'pending' AND r.token = k.token
	AND r.expires_at > clock_timestamp()
RETURNING k.n`

	// releaseRecords deletes the live pending records of the entries ($1
	// operations, $2 keys, $3 tokens) that their tokens own: Release for each.
	releaseRecords = `DELETE FROM idempotency_records r
USING unnest($1::text[], $2::text[], $3::text[]) AS k(operation, key, token)
WHERE r.operation = k.operation AND r.key = k.key AND r.state = 'pending' AND r.token = k.token
	AND r.expires_at > clock_timestamp()`
)

// GetMany implements idemstore.BulkStore: it returns the live record
// under each of keys, in their order, as Get does, in one statement.
func (s *Store) GetMany(ctx context.Context, keys []idemstore.Key) ([]idemstore.Record, error) {
	recs := make([]idemstore.Record, len(keys))
	if len(keys) == 0 {
		return recs, nil
	}
	ops, ks := columns(keys)
	err := s.query(ctx, selectRecords, []any{ops, ks}, func(rows pgx.Rows) error {
		return scanRecords(rows, recs)
	})
	if err != nil {
		return nil, bulkError(idemevent.MethodGet, "get", err)
	}
	return recs, nil
}

// ReserveMany implements idemstore.BulkStore: it is Reserve for each
// entry, in one round trip, in one transaction at READ COMMITTED. The
// entries of distinct keys go in one INSERT; a key given again goes in a
// second INSERT after the first, and so on, so that every entry sees the
// record the one before it left. A serialization failure or a deadlock is
// sent again, as Reserve's, and a key that an open transaction of Do holds
// for longer than three quarters of the time left before ctx's deadline
// fails the call with an error that matches coordinator.ErrConflict (the
// batch does not know which entry waited).
//
// With allOrNothing set the statements run in a transaction that commits
// only when every entry wrote, and is rolled back otherwise, which restores
// the records that replacing entries wrote over: three round trips
// (BEGIN, the statements, COMMIT or ROLLBACK). When the transaction rolls
// back, existing holds what the entries met, as without allOrNothing: the
// record of each entry that did not write, the zero Record for the others.
// The database ends that transaction, and so frees its keys, if this
// process dies or freezes before its COMMIT, within the entries' shortest
// lease (as a claim's; package documentation, "Dead and frozen holders").
//
// It returns an error, and sends nothing, when the lengths of keys and ws
// differ or an entry is not one Reserve takes. After an error that leaves
// unknown whether the transaction committed (the connection, the context),
// it releases, best effort, the pending records it may have written.
func (s *Store) ReserveMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write, allOrNothing bool) ([]idemstore.Record, []bool, error) {
	if err := checkWrites(keys, ws); err != nil {
		return nil, nil, bulkError(idemevent.MethodReserve, "reserve", err)
	}
	b := newReservation(keys, ws)
	if len(keys) == 0 {
		return b.existing, b.written, nil
	}
	var err error
	if allOrNothing {
		err = s.reserveAll(ctx, b)
	} else {
		err = s.send(ctx, func(batch *pgx.Batch) { b.queue(ctx, batch) })
	}
	if err != nil {
		if uncertain(err) {
			s.releaseMany(ctx, keys, ws)
		}
		return nil, nil, bulkError(idemevent.MethodReserve, "reserve", lockConflict(err))
	}
	return b.existing, b.written, nil
}

// CompleteMany implements idemstore.BulkStore: it is Complete for each
// entry, in one statement. It returns an error, and sends nothing, when
// the lengths of keys, tokens and cs differ or an entry is not one Complete
// takes.
func (s *Store) CompleteMany(ctx context.Context, keys []idemstore.Key, tokens []string, cs []idemstore.Completion) ([]bool, error) {
	args, err := completionColumns(keys, tokens, cs)
	if err != nil {
		return nil, bulkError(idemevent.MethodComplete, "complete", err)
	}
	ok := make([]bool, len(keys))
	if len(keys) == 0 {
		return ok, nil
	}
	err = s.send(ctx, func(b *pgx.Batch) {
		clear(ok)
		b.Queue(completeRecords, args...).Query(func(rows pgx.Rows) error {
			return scanPlaces(rows, ok)
		})
	})
	if err != nil {
		return nil, bulkError(idemevent.MethodComplete, "complete", err)
	}
	return ok, nil
}

// DeleteMany implements idemstore.BulkStore: it is Forget, which also
// deletes the keys' steps; n counts the live records it deleted. Its errors
// carry idemevent.MethodRelease, the method that deletes a record.
func (s *Store) DeleteMany(ctx context.Context, keys []idemstore.Key) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	n, err := s.Forget(ctx, keys...)
	if err != nil {
		return 0, &coordinator.StorageError{Method: idemevent.MethodRelease, Err: err}
	}
	return n, nil
}

// reservation is the state of one ReserveMany: its entries split into
// passes (pass p holds the (p+1)th entry of each key), and what the
// entries met.
type reservation struct {
	keys     []idemstore.Key
	ws       []idemstore.Write
	passes   [][]int
	existing []idemstore.Record
	written  []bool
}

// lease is the shortest lease of the entries: how long the transaction of
// reserveAll may hold their keys without a word.
func (b *reservation) lease() time.Duration {
	l := b.ws[0].TTL
	for _, w := range b.ws[1:] {
		l = min(l, w.TTL)
	}
	return l
}

// newReservation splits the entries of keys and ws into passes of
// distinct keys, in the order the entries of each key are given.
func newReservation(keys []idemstore.Key, ws []idemstore.Write) *reservation {
	b := &reservation{keys: keys, ws: ws, existing: make([]idemstore.Record, len(keys)), written: make([]bool, len(keys))}
	seen := make(map[idemstore.Key]int, len(keys))
	for i, k := range keys {
		p := seen[k]
		seen[k] = p + 1
		if p == len(b.passes) {
			b.passes = append(b.passes, nil)
		}
		b.passes[p] = append(b.passes[p], i)
	}
	return b
}

// queue resets what the entries met and queues the statements of every
// pass: its INSERT, then the read of the records its entries met.
func (b *reservation) queue(ctx context.Context, batch *pgx.Batch) {
	clear(b.existing)
	clear(b.written)
	if d, ok := ctx.Deadline(); ok {
		batch.Queue(setLockWait, lockTimeout(time.Until(d)*3/4))
	}
	for _, pass := range b.passes {
		batch.Queue(insertRecords, b.writeColumns(pass)...).Query(func(rows pgx.Rows) error {
			return b.scanWritten(rows, pass)
		})
		ops, ks := make([]string, len(pass)), make([]string, len(pass))
		for j, i := range pass {
			ops[j], ks[j] = b.keys[i].Operation, b.keys[i].Key
		}
		batch.Queue(selectRecords, ops, ks).Query(func(rows pgx.Rows) error {
			return b.scanMet(rows, pass)
		})
	}
}

// writeColumns returns the arguments of insertRecords for the entries of
// pass.
func (b *reservation) writeColumns(pass []int) []any {
	n := len(pass)
	var (
		ops, ks, states, tokens, fps, replaceTokens = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		results                                     = make([][]byte, n)
		ttls                                        = make([]int64, n)
		replace                                     = make([]bool, n)
	)
	for j, i := range pass {
		k, w := b.keys[i], b.ws[i]
		ops[j], ks[j], states[j], tokens[j], fps[j] = k.Operation, k.Key, stateName(w.State), w.Token, w.Fingerprint
		if w.State != idemstore.StatePending {
			results[j] = nonNil(w.Result)
		}
		ttls[j], replace[j], replaceTokens[j] = w.TTL.Milliseconds(), w.Replace, w.ReplaceToken
	}
	return []any{ops, ks, states, tokens, fps, results, ttls, replace, replaceTokens}
}

// scanWritten marks the entries of pass whose keys insertRecords returned.
func (b *reservation) scanWritten(rows pgx.Rows, pass []int) error {
	at := make(map[idemstore.Key]int, len(pass))
	for _, i := range pass {
		at[b.keys[i]] = i
	}
	for rows.Next() {
		var k idemstore.Key
		if err := rows.Scan(&k.Operation, &k.Key); err != nil {
			return err
		}
		i, ok := at[k]
		if !ok {
			return fmt.Errorf("wrote %s, which is not in the batch", k)
		}
		b.written[i] = true
	}
	return rows.Err()
}

// scanMet reads the records that the entries of pass met: the record of
// each entry that did not write.
func (b *reservation) scanMet(rows pgx.Rows, pass []int) error {
	recs := make([]idemstore.Record, len(pass))
	if err := scanRecords(rows, recs); err != nil {
		return err
	}
	for j, i := range pass {
		if !b.written[i] {
			b.existing[i] = recs[j]
		}
	}
	return nil
}

// all reports whether every entry wrote.
func (b *reservation) all() bool {
	for _, w := range b.written {
		if !w {
			return false
		}
	}
	return true
}

// reserveAll runs the statements of b in a transaction at READ COMMITTED
// that it commits only when every entry wrote; when one did not, it rolls
// the transaction back and reports no entry written. A serialization
// failure or a deadlock is tried again, as send does.
func (s *Store) reserveAll(ctx context.Context, b *reservation) error {
	for attempt := 0; ; attempt++ {
		err := s.tryAll(ctx, b)
		if err == nil || !conflict(err) || attempt == maxConflictRetries || !pause(ctx, attempt) {
			return classify(err)
		}
	}
}

// tryAll is one attempt of reserveAll.
func (s *Store) tryAll(ctx context.Context, b *reservation) error {
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return err
	}
	batch := &pgx.Batch{}
	// The transaction holds the keys it wrote until its COMMIT, a round
	// trip later: the database ends it if this process dies or freezes in
	// between, as it does a claim's (Claim).
	queueHolderSettings(batch, tx, b.lease())
	b.queue(ctx, batch)
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		rollback(ctx, tx)
		return err
	}
	if b.all() {
		return tx.Commit(ctx)
	}
	clear(b.written)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return tx.Rollback(rctx)
}

// rollback ends tx after a failure, best effort.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// releaseMany releases, best effort and whatever ctx says, the pending
// records that the entries of a failed ReserveMany may have written.
func (s *Store) releaseMany(ctx context.Context, keys []idemstore.Key, ws []idemstore.Write) {
	ops, ks := columns(keys)
	tokens := make([]string, len(ws))
	for i, w := range ws {
		tokens[i] = w.Token
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_ = s.send(rctx, func(b *pgx.Batch) { b.Queue(releaseRecords, ops, ks, tokens) })
}

// uncertain reports whether err may have come after the transaction
// committed: an error the database did not answer with (the connection,
// the context). An error the database answered with ended the transaction
// without a commit.
func uncertain(err error) bool {
	var pe *pgconn.PgError
	return !errors.As(err, &pe)
}

// lockConflict returns err, matching coordinator.ErrConflict when it is a
// lock wait that passed: a key of the batch is held by an open transaction
// of Do.
func lockConflict(err error) error {
	if lockNotAvailable(err) {
		return fmt.Errorf("%w: a key is held by an open transaction: %w", coordinator.ErrConflict, err)
	}
	return err
}

// bulkError returns err as a *coordinator.StorageError of method m.
func bulkError(m idemevent.Method, verb string, err error) *coordinator.StorageError {
	return &coordinator.StorageError{Method: m, Err: fmt.Errorf("idempg: %s many: %w", verb, err)}
}

// checkWrites returns an error when keys and ws differ in length or an
// entry of ws is not one Reserve takes.
func checkWrites(keys []idemstore.Key, ws []idemstore.Write) error {
	if len(keys) != len(ws) {
		return fmt.Errorf("%d keys and %d writes", len(keys), len(ws))
	}
	for i, w := range ws {
		if stateName(w.State) == "" {
			return fmt.Errorf("entry %d (%s): write state is %s, want pending, completed or not_replayable", i, keys[i], w.State)
		}
		if err := checkTTL("reserve", keys[i], w.TTL); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	return nil
}

// completionColumns returns the arguments of completeRecords, or an error
// when keys, tokens and cs differ in length or an entry of cs is not one
// Complete takes.
func completionColumns(keys []idemstore.Key, tokens []string, cs []idemstore.Completion) ([]any, error) {
	if len(keys) != len(tokens) || len(keys) != len(cs) {
		return nil, fmt.Errorf("%d keys, %d tokens and %d completions", len(keys), len(tokens), len(cs))
	}
	ops, ks := columns(keys)
	states, results, ttls := make([]string, len(cs)), make([][]byte, len(cs)), make([]int64, len(cs))
	for i, c := range cs {
		st := stateName(c.State)
		if st == "" || st == statePending {
			return nil, fmt.Errorf("entry %d (%s): state is %s, want completed or not_replayable", i, keys[i], c.State)
		}
		if err := checkTTL("complete", keys[i], c.TTL); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		states[i], results[i], ttls[i] = st, nonNil(c.Result), c.TTL.Milliseconds()
	}
	return []any{ops, ks, tokens, states, results, ttls}, nil
}

// columns returns the operations and the keys of keys as two arrays.
func columns(keys []idemstore.Key) (ops, ks []string) {
	ops, ks = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ops[i], ks[i] = k.Operation, k.Key
	}
	return ops, ks
}

// scanRecords reads the rows of selectRecords into recs, one per key, an
// absent record for a row of NULLs.
func scanRecords(rows pgx.Rows, recs []idemstore.Record) error {
	clear(recs)
	n := 0
	for rows.Next() {
		if n == len(recs) {
			return errors.New("more rows than keys")
		}
		var rec nullRecord
		if err := rows.Scan(&rec.state, &rec.token, &rec.fp, &rec.result, &rec.ttl); err != nil {
			return err
		}
		recs[n] = rec.record()
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(recs) {
		return fmt.Errorf("%d rows for %d keys", n, len(recs))
	}
	return nil
}

// scanPlaces sets ok[n-1] for each place n that rows return.
func scanPlaces(rows pgx.Rows, ok []bool) error {
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return err
		}
		if n < 1 || n > len(ok) {
			return fmt.Errorf("place %d out of %d entries", n, len(ok))
		}
		ok[n-1] = true
	}
	return rows.Err()
}
