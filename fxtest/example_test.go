package fxtest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/fx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/fxtest"
)

// noMetrics keeps the examples off prometheus.DefaultRegisterer.
var noMetrics = idempotency.OverrideSettings(func(s *idempotency.Settings) { s.MetricsEnabled = false })

func Example() {
	// In a test, use go.uber.org/fx/fxtest.New(t, ...) instead of fx.New, and
	// import this package as idemfxtest beside it.
	var c *coordinator.Coordinator
	var store *memstore.Store
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(), // not the environment
		fxtest.MemoryStore(),       // not Redis
		noMetrics,
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

// Store swaps in a store the test built itself, here one on a fake clock, so
// the test decides when a record expires.
func ExampleStore() {
	clock := memstore.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var c *coordinator.Coordinator
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(),
		fxtest.Store(memstore.New(memstore.WithClock(clock.Now))),
		noMetrics,
		fx.Populate(&c),
	)
	if err := app.Start(context.Background()); err != nil {
		panic(err)
	}
	defer app.Stop(context.Background())

	runs := 0
	call := coordinator.Call{Operation: "order.create", Key: "k-1", TTL: time.Hour}
	charge := func(context.Context) (int, error) { runs++; return 42, nil }
	_, _ = coordinator.Do(context.Background(), c, call, charge)
	_, _ = coordinator.Do(context.Background(), c, call, charge)
	fmt.Println("runs within the TTL:", runs)
	clock.Advance(2 * time.Hour)
	_, _ = coordinator.Do(context.Background(), c, call, charge)
	fmt.Println("runs after it:", runs)
	// Output:
	// runs within the TTL: 1
	// runs after it: 2
}

// MemoryStore provides the *memstore.Store it swapped in, so a test can look
// at the records its calls left.
func ExampleMemoryStore() {
	var c *coordinator.Coordinator
	var store *memstore.Store
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(),
		fxtest.MemoryStore(),
		noMetrics,
		fx.Populate(&c, &store),
	)
	if err := app.Start(context.Background()); err != nil {
		panic(err)
	}
	defer app.Stop(context.Background())

	_, _ = coordinator.Do(context.Background(), c, coordinator.Call{Operation: "order.create", Key: "k-1"},
		func(context.Context) (string, error) { return "ord_1", nil })
	rec := store.Snapshot(idemstore.Key{Operation: "order.create", Key: "k-1"})
	fmt.Println(rec.State == idemstore.StateCompleted, string(rec.Result))
	// Output: true "ord_1"
}

// FailingStore provides the *faultstore.Store it swapped in, to make the store
// fail where the test needs it: here the reservation, in raise mode, so the
// action does not run.
func ExampleFailingStore() {
	var c *coordinator.Coordinator
	var fs *faultstore.Store
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(),
		fxtest.FailingStore(),
		idempotency.OverrideSettings(func(s *idempotency.Settings) {
			s.MetricsEnabled = false
			s.OnStorageError = coordinator.OnStorageErrorRaise
		}),
		fx.Populate(&c, &fs),
	)
	if err := app.Start(context.Background()); err != nil {
		panic(err)
	}
	defer app.Stop(context.Background())

	fs.FailOnce(idemevent.MethodReserve, nil)
	runs := 0
	_, err := coordinator.Do(context.Background(), c, coordinator.Call{Operation: "order.create", Key: "k-1"},
		func(context.Context) (int, error) { runs++; return 42, nil })
	fmt.Println(errors.Is(err, coordinator.ErrStorage), "runs:", runs)
	// Output: true runs: 0
}

// IgnoreEnvironment gives the module the documented defaults, whatever
// IDEMPOTENCY_* variables the developer's shell has.
func ExampleIgnoreEnvironment() {
	var s idempotency.Settings
	app := fx.New(
		fx.NopLogger,
		idempotency.Module,
		fxtest.IgnoreEnvironment(),
		fxtest.MemoryStore(),
		fx.Populate(&s),
	)
	if err := app.Err(); err != nil {
		panic(err)
	}
	fmt.Println(s.InFlight, s.KeyPrefix, s.Lease)
	// Output: wait idempotency: 30s
}
