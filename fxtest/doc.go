// Package fxtest has fx options for tests of apps that use idempotency.Module:
// an in-memory store in place of Redis, a store that fails on demand, and
// settings that ignore the environment.
//
// Its name is that of go.uber.org/fx/fxtest, which a test usually imports
// too; import this one as idemfxtest there:
//
//	import (
//		"go.uber.org/fx"
//		"go.uber.org/fx/fxtest"
//
//		"github.com/idemkit/idempotency"
//		"github.com/idemkit/idempotency/coordinator"
//		"github.com/idemkit/idempotency/coordinator/memstore"
//		idemfxtest "github.com/idemkit/idempotency/fxtest"
//	)
//
//	var store *memstore.Store
//	app := fxtest.New(t,
//		idempotency.Module,
//		idemfxtest.IgnoreEnvironment(),
//		idemfxtest.MemoryStore(),
//		idempotency.OverrideSettings(func(s *idempotency.Settings) { s.InFlight = coordinator.InFlightRaise }),
//		fx.Populate(&store),
//		yourModule,
//	)
//
// Give an app one of Store, MemoryStore and FailingStore: each replaces
// idemstore.Store, and fx refuses to replace one type twice. Change settings
// with idempotency.OverrideSettings, on top of IgnoreEnvironment or of the
// environment.
//
// No Redis server is needed: with Store, MemoryStore or FailingStore the
// module's Redis client is never built, unless something in the app injects
// *redisrepo.Store (the module provides it for operator tools such as an
// admin endpoint). Those options replace idemstore.Store only, so such an
// app would still get a Redis store, on a Redis client of its own, that does
// not see the in-memory records. Give a test of such an endpoint a real Redis,
// or leave the endpoint out of the test's graph.
package fxtest
