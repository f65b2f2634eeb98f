package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
)

// Info is what Inspect reports of one key: what an operator needs to know of
// its record, without the result.
type Info struct {
	// Key is the key that was inspected.
	Key idemstore.Key
	// State is idemstore.StateAbsent (no live row), StatePending (a caller
	// holds the key), StateCompleted, StateNotReplayable, or
	// StateUnreadable (a state this package does not write).
	State idemstore.State
	// TTL is the time left before expires_at, on the database's clock, to
	// the microsecond; 0 for an absent key.
	TTL time.Duration
	// CreatedAt is when the row was written, on the database's clock (the
	// reservation, for a completed record); the zero time for an absent key.
	CreatedAt time.Time
	// Fingerprint is the request fingerprint stored with the record, "" for
	// none.
	Fingerprint string
	// ResultSize is the size in bytes of a completed record's result, or of
	// a not-replayable record's reason.
	ResultSize int
	// Steps are the live steps of a Steps call under the key, in the order
	// they committed: where a call that stopped will resume. A key whose
	// call stopped has steps and no record.
	Steps []StepInfo
}

// StepInfo is what Inspect reports of one step of a Steps call.
type StepInfo struct {
	// Name is the step's name, as the code gives it to Phase or Outside.
	Name string
	// Outside is true for an outside call's kept answer, false for a
	// phase that committed.
	Outside bool
	// Failed is true for a failure kept for good; Reason is its message.
	Failed bool
	Reason string
	// CommittedAt is when the step's row was written, on the database's
	// clock.
	CommittedAt time.Time
}

// Counts is how many live records of one operation are in each state.
type Counts struct {
	// Pending is the number of records in flight: a caller holds the key.
	Pending int
	// Completed is the number of completed records: with a stored result,
	// or not replayable.
	Completed int
	// NotReplayable is how many of Completed are not replayable.
	NotReplayable int
	// Unreadable is the number of rows in a state this package does not
	// write.
	Unreadable int
}

// Total returns the number of records counted: Pending + Completed +
// Unreadable (NotReplayable is a part of Completed).
func (c Counts) Total() int { return c.Pending + c.Completed + c.Unreadable }

// The SQL of the operator methods. Like the coordinator's, they see a row
// whose expires_at has passed as absent (clock_timestamp(), the database's
// clock).
const (
	// inspectRecords reads the live rows of the keys ($1 operations, $2
	// keys, in pairs) in the order given, one row per key, NULLs for an
	// absent one.
	inspectRecords = `SELECT r.state, r.fingerprint, octet_length(r.result),
	ceil(extract(epoch FROM r.expires_at - clock_timestamp()) * 1000000)::bigint, r.created_at
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(operation, key, n)
LEFT JOIN idempotency_records r
	ON r.operation = k.operation AND r.key = k.key AND r.expires_at > clock_timestamp()
ORDER BY k.n`

	// inspectSteps reads the live steps of the keys ($1 operations, $2
	// keys, in pairs), with n the key's place, in the order they committed.
	inspectSteps = `SELECT k.n, st.step, st.kind, st.state,
	CASE WHEN st.state = 'failed' THEN convert_from(st.result, 'UTF8') ELSE '' END, st.created_at
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(operation, key, n)
JOIN idempotency_steps st ON st.operation = k.operation AND st.key = k.key AND st.expires_at > clock_timestamp()
ORDER BY k.n, st.created_at, st.step`

	// forgetRecords deletes the rows of the keys, live or expired, and
	// their steps, and counts the live records and the records deleted.
	forgetRecords = `WITH st AS (
	DELETE FROM idempotency_steps s
	USING unnest($1::text[], $2::text[]) AS k(operation, key)
	WHERE s.operation = k.operation AND s.key = k.key
), d AS (
	DELETE FROM idempotency_records r
	USING unnest($1::text[], $2::text[]) AS k(operation, key)
	WHERE r.operation = k.operation AND r.key = k.key
	RETURNING r.expires_at
)
SELECT count(*) FILTER (WHERE expires_at > clock_timestamp()), count(*) FROM d`

	// forgetOperation deletes up to $2 records and up to $2 steps of
	// operation $1, live or expired, and counts the live records and all
	// the rows deleted.
	forgetOperation = `WITH d AS (
	DELETE FROM idempotency_records r
	USING (SELECT key FROM idempotency_records WHERE operation = $1 LIMIT $2) old
	WHERE r.operation = $1 AND r.key = old.key
	RETURNING r.expires_at
), st AS (
	DELETE FROM idempotency_steps s
	USING (SELECT key, step FROM idempotency_steps WHERE operation = $1 LIMIT $2) old
	WHERE s.operation = $1 AND s.key = old.key AND s.step = old.step
	RETURNING 1
)
SELECT count(*) FILTER (WHERE expires_at > clock_timestamp()), count(*) + (SELECT count(*) FROM st) FROM d`

	// countRecords counts the live rows per operation and state, of every
	// operation ($1 NULL) or of those in $1.
	countRecords = `SELECT operation, state, count(*)
FROM idempotency_records
WHERE expires_at > clock_timestamp() AND ($1::text[] IS NULL OR operation = ANY($1))
GROUP BY operation, state`
)

// Inspect describes the records of keys, in their order, in one statement.
// It returns an error for an invalid key, and the database's otherwise.
func (s *Store) Inspect(ctx context.Context, keys ...idemstore.Key) ([]Info, error) {
	ops, ks, err := keyColumns("inspect", keys)
	if err != nil {
		return nil, err
	}
	infos := make([]Info, 0, len(keys))
	err = s.query(ctx, inspectRecords, []any{ops, ks}, func(rows pgx.Rows) error {
		infos = infos[:0]
		for rows.Next() {
			var (
				state, fp *string
				size, ttl *int64
				created   *time.Time
			)
			if err := rows.Scan(&state, &fp, &size, &ttl, &created); err != nil {
				return err
			}
			if len(infos) == len(keys) {
				return errors.New("more rows than keys")
			}
			in := Info{Key: keys[len(infos)]}
			if state != nil {
				in.State = stateOf(*state)
				in.Fingerprint = *fp
				in.TTL = time.Duration(max(*ttl, 1)) * time.Microsecond
				in.CreatedAt = *created
				if size != nil {
					in.ResultSize = int(*size)
				}
			}
			infos = append(infos, in)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: inspect: %w", err)
	}
	err = s.query(ctx, inspectSteps, []any{ops, ks}, func(rows pgx.Rows) error {
		for i := range infos {
			infos[i].Steps = nil
		}
		for rows.Next() {
			var (
				n           int
				kind, state string
				st          StepInfo
			)
			if err := rows.Scan(&n, &st.Name, &kind, &state, &st.Reason, &st.CommittedAt); err != nil {
				return err
			}
			st.Outside, st.Failed = kind == stepOutside, state == stepFailed
			infos[n-1].Steps = append(infos[n-1].Steps, st)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: inspect the steps: %w", err)
	}
	return infos, nil
}

// Forget deletes the records of keys whatever their state, and their steps
// (Steps), in one transaction, and returns how many records were live (an
// expired row is deleted too, and not counted). A forgotten key lets the
// next call with it run its action again, every step included. It returns an error for an invalid key, and the
// database's otherwise (then nothing was deleted).
func (s *Store) Forget(ctx context.Context, keys ...idemstore.Key) (int, error) {
	ops, ks, err := keyColumns("forget", keys)
	if err != nil {
		return 0, err
	}
	live, _, err := s.deleteCounting(ctx, forgetRecords, ops, ks)
	if err != nil {
		return 0, fmt.Errorf("idempg: forget: %w", err)
	}
	return live, nil
}

// ForgetOperation deletes up to limit records and up to limit steps
// (Steps) of operation, live or expired, in one transaction, and returns how
// many records were live and how many rows it deleted in all: call it until
// deleted is 0 to forget every record and step of the operation, a batch at
// a time. It returns an error for an invalid
// operation or a limit that is not positive, and the database's otherwise.
func (s *Store) ForgetOperation(ctx context.Context, operation string, limit int) (live, deleted int, err error) {
	if err := coordinator.ValidateOperation(operation); err != nil {
		return 0, 0, fmt.Errorf("idempg: forget %s: %w", operation, err)
	}
	if limit <= 0 {
		return 0, 0, fmt.Errorf("idempg: forget %s: limit %d is not positive", operation, limit)
	}
	live, deleted, err = s.deleteCounting(ctx, forgetOperation, operation, limit)
	if err != nil {
		return 0, 0, fmt.Errorf("idempg: forget %s: %w", operation, err)
	}
	return live, deleted, nil
}

// Count counts the live records by operation and state: of every
// operation, or of operations only, each of them in the map even without a
// record. It returns an error for an invalid operation, and the database's
// otherwise.
func (s *Store) Count(ctx context.Context, operations ...string) (map[string]Counts, error) {
	var filter []string // NULL: every operation
	for _, op := range operations {
		if err := coordinator.ValidateOperation(op); err != nil {
			return nil, fmt.Errorf("idempg: count: %w", err)
		}
		filter = append(filter, op)
	}
	counts := map[string]Counts{}
	err := s.query(ctx, countRecords, []any{filter}, func(rows pgx.Rows) error {
		clear(counts)
		for _, op := range operations {
			counts[op] = Counts{}
		}
		for rows.Next() {
			var (
				op, state string
				n         int
			)
			if err := rows.Scan(&op, &state, &n); err != nil {
				return err
			}
			c := counts[op]
			switch stateOf(state) {
			case idemstore.StatePending:
				c.Pending += n
			case idemstore.StateCompleted:
				c.Completed += n
			case idemstore.StateNotReplayable:
				c.Completed += n
				c.NotReplayable += n
			default:
				c.Unreadable += n
			}
			counts[op] = c
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: count: %w", err)
	}
	return counts, nil
}

// query runs sql, a single statement that only reads, and hands its rows
// to scan; it runs it again after a serialization failure, as Get does
// (scan must reset what it fills), and returns what is left as classify
// says.
func (s *Store) query(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) error {
	for attempt := 0; ; attempt++ {
		b := &pgx.Batch{}
		b.Queue(sql, args...).Query(scan)
		err := s.db.SendBatch(ctx, b).Close()
		if err == nil || !conflict(err) || attempt == maxConflictRetries || !pause(ctx, attempt) {
			return classify(err)
		}
	}
}

// deleteCounting runs a DELETE of forgetRecords' shape in a transaction at
// READ COMMITTED (send), and returns its two counts.
func (s *Store) deleteCounting(ctx context.Context, sql string, args ...any) (live, deleted int, err error) {
	err = s.send(ctx, func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
			return row.Scan(&live, &deleted)
		})
	})
	return live, deleted, err
}

// keyColumns returns the operations and the keys of keys as two arrays, or
// an error that names the first invalid one.
func keyColumns(method string, keys []idemstore.Key) (ops, ks []string, err error) {
	ops, ks = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		if err := errors.Join(coordinator.ValidateOperation(k.Operation), coordinator.ValidateKey(k.Key)); err != nil {
			return nil, nil, fmt.Errorf("idempg: %s %s: %w", method, k, err)
		}
		ops[i], ks[i] = k.Operation, k.Key
	}
	return ops, ks, nil
}

// stateOf returns the state a row's state column names; a name this
// package does not write is idemstore.StateUnreadable.
func stateOf(name string) idemstore.State {
	switch name {
	case statePending:
		return idemstore.StatePending
	case stateCompleted:
		return idemstore.StateCompleted
	case stateNotReplayable:
		return idemstore.StateNotReplayable
	}
	return idemstore.StateUnreadable
}
