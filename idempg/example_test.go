package idempg_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
)

// The order and its record commit in one transaction: a retry of the same
// key replays the order, and never inserts a second one. (It needs a
// PostgreSQL: the runnable service is idempg/example.)
func ExampleDo() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := idempg.Migrate(ctx, pool); err != nil { // or apply idempg.Schema with your migration tool
		panic(err)
	}
	store, err := idempg.New(pool)
	if err != nil {
		panic(err)
	}
	c, err := coordinator.New(store) // with the fx module: idempg.Module provides it
	if err != nil {
		panic(err)
	}
	defer c.Close()

	type order struct{ ID int64 }
	call := coordinator.Call{Operation: "orders.create", Key: "tenant-7:order-42"}
	o, err := idempg.Do(ctx, c, call, func(ctx context.Context, tx pgx.Tx) (order, error) {
		var o order
		err := tx.QueryRow(ctx, `INSERT INTO orders (sku) VALUES ('tea') RETURNING id`).Scan(&o.ID)
		return o, err // an error rolls the INSERT and the claim back: the key is free again
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("order", o.ID)
}
