package idempg_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
)

// An action may not end its transaction with SQL. A statement that would is
// refused before it is sent (ErrTxEnded), so nothing commits; one that
// gets past the check (through tx.Conn(), the raw connection) is found when
// the action returns, and its key is kept as not replayable, since some of
// its writes may have committed. Either way every key has at most one
// ledger row after four calls, and the error names the misuse.
func TestActionEndsTransactionWithSQL(t *testing.T) {
	type action = func(ctx context.Context, tx pgx.Tx, key string) error
	boom := errors.New("boom")
	for _, tc := range []struct {
		name       string
		act        action
		wantRows   int
		wantRetry  error // what the three retries get; nil: they run
		firstIsErr error
	}{
		{"COMMIT statement refused", func(ctx context.Context, tx pgx.Tx, key string) error {
			if err := insertLedger(ctx, tx, key, "x"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "COMMIT")
			return err
		}, 0, idempg.ErrTxEnded, idempg.ErrTxEnded},
		{"rollback, end, abort and a commented COMMIT refused", func(ctx context.Context, tx pgx.Tx, key string) error {
			for _, sql := range []string{"rollback", "END", "abort work", "/* done */ commit", "-- done\nCOMMIT", "PREPARE TRANSACTION 'x'"} {
				if _, err := tx.Exec(ctx, sql); !errors.Is(err, idempg.ErrTxEnded) {
					return errors.New(sql + " was not refused")
				}
			}
			if err := tx.QueryRow(ctx, "COMMIT").Scan(); !errors.Is(err, idempg.ErrTxEnded) {
				return errors.New("QueryRow(COMMIT) was not refused")
			}
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			b.Queue("COMMIT")
			if err := tx.SendBatch(ctx, b).Close(); !errors.Is(err, idempg.ErrTxEnded) {
				return errors.New("a batch with COMMIT was not refused")
			}
			// A savepoint's own rollback is allowed.
			if _, err := tx.Exec(ctx, "SAVEPOINT s1"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s1"); err != nil {
				return err
			}
			return insertLedger(ctx, tx, key, "x")
		}, 1, nil, nil},
		{"COMMIT through the raw connection, then an error", func(ctx context.Context, tx pgx.Tx, key string) error {
			if err := insertLedger(ctx, tx, key, "x"); err != nil {
				return err
			}
			if _, err := tx.Conn().Exec(ctx, "COMMIT"); err != nil {
				return err
			}
			return boom
		}, 1, coordinator.ErrNotReplayable, boom},
		{"ROLLBACK through the raw connection, then a write", func(ctx context.Context, tx pgx.Tx, key string) error {
			if _, err := tx.Conn().Exec(ctx, "ROLLBACK"); err != nil {
				return err
			}
			return insertLedger(ctx, tx, key, "x") // autocommits
		}, 1, coordinator.ErrNotReplayable, idempg.ErrTxEnded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := newDB(t, 4)
			c := db.coord(t)
			key := uniqueKey("txend")
			var errs []error
			for range 4 {
				_, err := idempg.Do(t.Context(), c, call(key), func(ctx context.Context, tx pgx.Tx) (int, error) {
					return 1, tc.act(ctx, tx, key)
				})
				errs = append(errs, err)
			}
			t.Logf("errors: %v", errs)
			if tc.firstIsErr == nil && errs[0] != nil || tc.firstIsErr != nil && !errors.Is(errs[0], tc.firstIsErr) {
				t.Errorf("first call: %s, want %v", fmtErr(errs[0]), tc.firstIsErr)
			}
			for _, err := range errs[1:] {
				if tc.wantRetry == nil && err != nil || tc.wantRetry != nil && !errors.Is(err, tc.wantRetry) {
					t.Errorf("retry: %s, want %v", fmtErr(err), tc.wantRetry)
				}
			}
			if n := db.ledger(t, key); n != tc.wantRows {
				t.Errorf("%d ledger rows after 4 calls, want %d", n, tc.wantRows)
			}
		})
	}
}
