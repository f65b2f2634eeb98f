package fxtest_test

import (
	"context"
	"fmt"

	"go.uber.org/fx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	idemfxtest "github.com/idemkit/idempotency/fxtest"
)

func Example() {
	// In a test, use go.uber.org/fx/fxtest.New(t, ...) instead of fx.New.
	var c *coordinator.Coordinator
	var store *memstore.Store
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		idemfxtest.DefaultSettings(), // not the environment
		idemfxtest.MemoryStore(),     // not Redis
		idemfxtest.Settings(func(s *idempotency.Settings) { s.MetricsEnabled = false }),
		fx.Populate(&c, &store),
	)
	if err := app.Start(context.Background()); err != nil {
		panic(err)
	}
	defer app.Stop(context.Background())

	runs := 0
	for range 3 {
		_, _ = coordinator.Do(context.Background(), c, coordinator.Call{Operation: "order.create", Key: "k-1"},
			func(context.Context) (int, error) { runs++; return 42, nil })
	}
	fmt.Println("runs:", runs, "records:", store.Len())
	// Output: runs: 1 records: 1
}
