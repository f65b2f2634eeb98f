package idempotency_test

import (
	"context"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/redisrepo"
)

// The fx traps that docs/testing.md warns about, pinned as tests so the docs
// stay true.

// A plain fx.Replace of a concrete value replaces that concrete type, which
// nobody asked for: the module's coordinator.Store stays the Redis store.
func TestTrap_ReplaceWithoutAsDoesNothing(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	var store coordinator.Store
	app := fxtest.New(t, idempotency.Module, regOpt,
		fx.Replace(memstore.New()), // the trap
		fx.Populate(&store))
	defer app.RequireStart().RequireStop()
	if _, ok := store.(*redisrepo.Store); !ok {
		t.Fatalf("store is %T; the trap no longer springs, update docs/testing.md", store)
	}
}

// With fx.As, the interface is replaced.
func TestTrap_ReplaceWithAsWorks(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	mem := memstore.New()
	var store coordinator.Store
	app := fxtest.New(t, idempotency.Module, regOpt,
		fx.Replace(fx.Annotate(mem, fx.As(new(coordinator.Store)))),
		fx.Populate(&store))
	defer app.RequireStart().RequireStop()
	if store != coordinator.Store(mem) {
		t.Fatalf("store is %T", store)
	}
}

// The module keeps its observer private; a root-level fx.Decorate of it
// fails at start-up. Add observers through the idempotency.observers group
// instead.
func TestTrap_DecorateOfAPrivateTypeFails(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	app := fx.New(idempotency.Module, idemfxtest.MemoryStore(), regOpt, fx.NopLogger,
		fx.Decorate(func(o coordinator.Observer) coordinator.Observer { return o }),
		fx.Invoke(func(*coordinator.Coordinator) {}))
	if app.Err() == nil {
		t.Fatal("decorating the module's private observer worked; update docs/testing.md")
	}
}

func TestExtraObserversFromTheGroup(t *testing.T) {
	clearEnv(t)
	_, regOpt := registry()
	var seen []coordinator.EventKind
	obs := coordinator.ObserverFunc(func(_ context.Context, e coordinator.Event) { seen = append(seen, e.Kind) })
	var c *coordinator.Coordinator
	app := fxtest.New(t, idempotency.Module, idemfxtest.MemoryStore(), regOpt,
		fx.Supply(fx.Annotate(obs, fx.As(new(coordinator.Observer)), fx.ResultTags(`group:"`+idempotency.ObserversGroup+`"`))),
		fx.Populate(&c))
	defer app.RequireStart().RequireStop()
	if _, err := coordinator.Do(t.Context(), c, coordinator.Call{Operation: "op", Key: "k"}, func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 || seen[0] != coordinator.EventStorageCall {
		t.Fatalf("the app's observer saw %v", seen)
	}
}
