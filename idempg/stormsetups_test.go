package idempg_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/coordinator"
)

// The storms of issue 39's paths, each checked as every storm is (the
// ledger against the records by SQL, every key's history with porcupine):
// the baseline storm on a database whose default isolation is SERIALIZABLE,
// and through a PgBouncer in transaction mode (exec mode, the database at
// SERIALIZABLE); and a storm in which every fourth holder stays idle in its
// transaction for longer than the lease, so that the database ends it (the
// frozen-holder bound), and its key goes to a waiter.
func TestStormSetups(t *testing.T) {
	for _, setup := range []struct {
		name string
		open func(t *testing.T) *testDB
	}{
		{"serializable", func(t *testing.T) *testDB { return isolatedDB(t, "serializable") }},
		{"pgbouncer_transaction_mode", bouncerDB},
	} {
		t.Run(setup.name, func(t *testing.T) {
			db := setup.open(t)
			st := newStorm(t, "setup/"+setup.name)
			c := st.coordinator(db.pool, coordinator.InFlightWait, time.Minute)
			keys := stormKeys("setup", 24)
			hold := func(ctx context.Context, tx pgx.Tx, _ int64) error {
				_, err := tx.Exec(ctx, sleepSQL(3*time.Millisecond))
				return err
			}
			for chunk := range slices.Chunk(keys, 12) {
				st.wave(chunk, 12, func(_ int, key string) { st.call(t.Context(), c, key, hold) })
			}
			byClass, _ := st.counts()
			if byClass[classRun] != len(keys) {
				t.Errorf("%d runs, want one per key (%d)", byClass[classRun], len(keys))
			}
			for cl, n := range byClass {
				if cl != classRun && cl != classReplay {
					t.Errorf("%d calls ended in %s, want none on a %s setup without faults", n, cl, setup.name)
				}
			}
			st.finish(t.Context(), db.pool, keys)
		})
	}
}

func TestStormIdleHolders(t *testing.T) {
	const lease = 500 * time.Millisecond
	db := newDB(t, 16)
	st := newStorm(t, "idle-holders")
	c := st.coordinator(db.pool, coordinator.InFlightWait, time.Minute, coordinator.WithLease(lease), coordinator.WithStorageTimeout(200*time.Millisecond))
	keys := stormKeys("idle", 16)
	freeze := func(ctx context.Context, tx pgx.Tx, attempt int64) error {
		if attempt%4 != 0 {
			return nil
		}
		st.kills.Add(1)
		time.Sleep(2 * lease) // idle in the transaction: the database ends it
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	}
	for chunk := range slices.Chunk(keys, 8) {
		st.wave(chunk, 8, func(_ int, key string) { st.call(t.Context(), c, key, freeze) })
	}
	byClass, _ := st.counts()
	if byClass[classRun] == 0 || st.kills.Load() == 0 {
		t.Errorf("runs %d, frozen holders %d: the storm did not happen", byClass[classRun], st.kills.Load())
	}
	st.finish(t.Context(), db.pool, keys)
}
