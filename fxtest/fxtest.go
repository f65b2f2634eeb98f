package fxtest

import (
	"go.uber.org/fx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// Store replaces the module's coordinator.Store with s. Use one of Store,
// MemoryStore and FailingStore per app: each replaces coordinator.Store, and
// fx refuses to replace one type twice. The module's Redis
// client is then never built. It is the fx.Replace of an interface done
// right: a plain fx.Replace(s) of a concrete value would not replace the
// coordinator.Store interface at all.
func Store(s coordinator.Store) fx.Option {
	return fx.Replace(fx.Annotate(s, fx.As(new(coordinator.Store))))
}

// MemoryStore replaces the module's store with a fresh in-memory one
// (memstore), and provides that *memstore.Store to the graph so a test can
// fx.Populate it and look inside.
// Each app gets its own store, even when one option value is reused.
func MemoryStore() fx.Option {
	return fx.Options(
		fx.Provide(func() *memstore.Store { return memstore.New() }),
		fx.Decorate(func(s *memstore.Store) coordinator.Store { return s }),
	)
}

// FailingStore replaces the module's store with an in-memory one behind a
// faultstore wrapper, and provides the *faultstore.Store (to arm failures:
// Fail, FailOnce, FailTimes, Before) and the *memstore.Store behind it.
func FailingStore() fx.Option {
	return fx.Options(
		fx.Provide(
			func() *memstore.Store { return memstore.New() },
			func(mem *memstore.Store) *faultstore.Store { return faultstore.Wrap(mem) },
		),
		fx.Decorate(func(fs *faultstore.Store) coordinator.Store { return fs }),
	)
}

// Settings changes the module's settings after they are loaded from the
// environment (or from DefaultSettings). The changed settings are validated,
// so an invalid change fails start-up as the environment would. Several
// Settings options may be given; they run in no guaranteed order, so let
// each set different fields.
func Settings(change func(*idempotency.Settings)) fx.Option {
	return idempotency.OverrideSettings(change)
}

// DefaultSettings makes the module ignore the IDEMPOTENCY_* environment and
// start from idempotency.DefaultSettings, so that a developer's shell cannot
// change what a test sees. Combine it with Settings to change a field.
func DefaultSettings() fx.Option {
	s := idempotency.DefaultSettings()
	return fx.Supply(fx.Annotate(&s, fx.ResultTags(`name:"`+idempotency.SettingsBaseName+`"`)))
}
