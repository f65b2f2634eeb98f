package idempg

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sweepRecords deletes up to $1 expired records, those that expired first
// first, through the index on expires_at. now() (stable within the
// statement, unlike clock_timestamp()) is what lets the index be used. Rows
// that a transaction has locked (a key being claimed or taken over) are
// skipped, not waited for; FOR UPDATE re-checks expiry on the newest version
// of a row, so a record renewed meanwhile stays.
const sweepRecords = `DELETE FROM idempotency_records r
USING (
	SELECT operation, key FROM idempotency_records
	WHERE expires_at <= now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) old
WHERE r.operation = old.operation AND r.key = old.key`

// sweepSteps is sweepRecords for the steps of Steps.
const sweepSteps = `DELETE FROM idempotency_steps r
USING (
	SELECT operation, key, step FROM idempotency_steps
	WHERE expires_at <= now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) old
WHERE r.operation = old.operation AND r.key = old.key AND r.step = old.step`

// Sweep deletes at most limit expired records, those that expired first
// first, and at most limit expired steps of Steps, and returns how many rows
// it deleted. Expired records are already absent
// for every reader; Sweep only gives their space back. It takes no lock that
// a request waits for: rows that a transaction holds are skipped. It
// returns an error for a limit that is not positive, and the driver's error
// when the statement fails.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idempg: sweep: limit %d is not positive", limit)
	}
	var n int64
	err := s.send(ctx, func(b *pgx.Batch) {
		n = 0
		for _, sql := range []string{sweepRecords, sweepSteps} {
			b.Queue(sql, limit).Exec(func(tag pgconn.CommandTag) error {
				n += tag.RowsAffected()
				return nil
			})
		}
	})
	if err != nil {
		return 0, fmt.Errorf("idempg: sweep: %w", err)
	}
	return int(n), nil
}

// Sweeper deletes expired records in the background; StartSweeper starts
// one and Stop stops it.
type Sweeper struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// StartSweeper starts a goroutine that calls Sweep every interval, with
// batches of limit records, until a batch deletes fewer than limit (so that
// a backlog drains batch after batch, each a short statement). Failures go
// to onError, which may be nil and must not block for long; the sweeper
// tries again at the next tick. Call Stop to end it. It returns an error for
// an interval or a limit that is not positive.
func (s *Store) StartSweeper(interval time.Duration, limit int, onError func(error)) (*Sweeper, error) {
	var errs []error
	if interval <= 0 {
		errs = append(errs, fmt.Errorf("interval %v is not positive", interval))
	}
	if limit <= 0 {
		errs = append(errs, fmt.Errorf("limit %d is not positive", limit))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("idempg: start sweeper: %w", errors.Join(errs...))
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Sweeper{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for ctx.Err() == nil {
				n, err := s.Sweep(ctx, limit)
				if err != nil {
					if ctx.Err() == nil && onError != nil {
						onError(err)
					}
					break
				}
				if n < limit {
					break
				}
			}
		}
	}()
	return w, nil
}

// Stop stops the sweeper, cancelling a sweep in progress, and waits for its
// goroutine to end. It may be called more than once.
func (w *Sweeper) Stop() {
	w.once.Do(w.cancel)
	<-w.done
}
