package fxtest

import (
	"go.uber.org/fx"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
)

// Store replaces the module's idemstore.Store with s, annotated as the
// interface that a plain fx.Replace(s) would silently miss.
func Store(s idemstore.Store) fx.Option {
	return fx.Replace(fx.Annotate(s, fx.As(new(idemstore.Store))))
}

// MemoryStore replaces the module's store with a fresh *memstore.Store per
// app and provides it to the graph, for fx.Populate.
func MemoryStore() fx.Option {
	return fx.Options(
		fx.Provide(func() *memstore.Store { return memstore.New() }),
		fx.Decorate(func(s *memstore.Store) idemstore.Store { return s }),
	)
}

// FailingStore replaces the module's store with a *faultstore.Store over a
// fresh *memstore.Store and provides both to the graph, to arm failures and
// look inside.
func FailingStore() fx.Option {
	return fx.Options(
		fx.Provide(
			func() *memstore.Store { return memstore.New() },
			func(mem *memstore.Store) *faultstore.Store { return faultstore.Wrap(mem) },
		),
		fx.Decorate(func(fs *faultstore.Store) idemstore.Store { return fs }),
	)
}

// IgnoreEnvironment makes the module start from idempotency.DefaultSettings
// instead of the IDEMPOTENCY_* environment, so a developer's shell cannot
// change what a test sees.
func IgnoreEnvironment() fx.Option {
	s := idempotency.DefaultSettings()
	return fx.Supply(fx.Annotate(&s, fx.ResultTags(`name:"`+idempotency.SettingsBaseName+`"`)))
}
