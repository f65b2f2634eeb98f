package idemfxtest

import (
	"go.uber.org/fx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// Store replaces the module's coordinator.Store with s. The module's Redis
// client is then never built. It is the fx.Replace of an interface done
// right: a plain fx.Replace(s) of a concrete value would not replace the
// coordinator.Store interface at all.
func Store(s coordinator.Store) fx.Option {
	return fx.Replace(fx.Annotate(s, fx.As(new(coordinator.Store))))
}

// MemoryStore replaces the module's store with a fresh in-memory one
// (memstore), and provides that *memstore.Store to the graph so a test can
// fx.Populate it and look inside.
func MemoryStore() fx.Option {
	s := memstore.New()
	return fx.Options(Store(s), fx.Supply(s))
}

// FailingStore replaces the module's store with an in-memory one behind a
// faultstore wrapper, and provides the *faultstore.Store (to arm failures:
// Fail, FailOnce, FailTimes, Before) and the *memstore.Store behind it.
func FailingStore() fx.Option {
	mem := memstore.New()
	fs := faultstore.Wrap(mem)
	return fx.Options(Store(fs), fx.Supply(fs, mem))
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
