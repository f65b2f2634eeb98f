package orders

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
)

// TenantHeader names the caller. It stands in for authentication: a real
// service takes the tenant from verified credentials, never from what the
// client merely asserts.
const TenantHeader = "X-Tenant"

// Charge is a charge of an order: money moved.
type Charge struct {
	ID       string `json:"id"`
	Order    string `json:"order"`
	Tenant   string `json:"tenant"`
	Amount   int64  `json:"amount"` // in minor units: 1999 is 19.99
	Currency string `json:"currency"`
}

// chargesTable is the app's own table, beside the store's.
const chargesTable = `CREATE TABLE IF NOT EXISTS charges (
    id         bigserial PRIMARY KEY,
    order_ref  text NOT NULL,
    tenant     text NOT NULL,
    amount     bigint NOT NULL CHECK (amount > 0),
    currency   text NOT NULL
)`

// Ledger records every charge really made, in PostgreSQL. If idempotency
// works, a retry never adds a second one.
type Ledger struct{ pool *pgxpool.Pool }

// NewLedger creates the charges table on start. Ask for the
// *coordinator.Coordinator before the Ledger, so that idempg.Module's start
// hook, which applies the store's schema, comes first.
func NewLedger(lc fx.Lifecycle, pool *pgxpool.Pool) *Ledger {
	lc.Append(fx.StartHook(func(ctx context.Context) error {
		_, err := pool.Exec(ctx, chargesTable)
		return err
	}))
	return &Ledger{pool: pool}
}

// Add records ch through tx, the transaction of the key's claim
// (idempg.Tx), and returns it with its charge ID: the charge commits with
// the key's record, or neither does.
func (l *Ledger) Add(ctx context.Context, tx pgx.Tx, ch Charge) (Charge, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO charges (order_ref, tenant, amount, currency) VALUES ($1, $2, $3, $4) RETURNING id`,
		ch.Order, ch.Tenant, ch.Amount, ch.Currency).Scan(&id)
	ch.ID = fmt.Sprintf("ch_%d", id)
	return ch, err
}

// View is the JSON of GET /ledger.
type View struct {
	Count   int      `json:"count"`
	Charges []Charge `json:"charges"`
}

// View returns every charge, oldest first.
func (l *Ledger) View(ctx context.Context) (View, error) {
	rows, _ := l.pool.Query(ctx, `SELECT 'ch_' || id, order_ref, tenant, amount, currency FROM charges ORDER BY id`)
	charges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Charge, error) {
		var ch Charge
		err := row.Scan(&ch.ID, &ch.Order, &ch.Tenant, &ch.Amount, &ch.Currency)
		return ch, err
	})
	return View{Count: len(charges), Charges: charges}, err
}
