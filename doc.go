// Package idempotency makes an operation run once per idempotency key, in
// services built on go.uber.org/fx.
//
// Add Module to an fx app and inject *coordinator.Coordinator wherever an
// operation must run once per key:
//
//	fx.New(idempotency.Module, fx.Provide(NewPayments), ...)
//
//	func NewPayments(c *coordinator.Coordinator) *Payments { ... }
//
//	charge, err := coordinator.Do(ctx, c, coordinator.Call{
//		Operation: "payment.charge",
//		Key:       key,
//	}, func(ctx context.Context) (Charge, error) { ... })
//
// Module reads Settings from the IDEMPOTENCY_* environment (LoadSettings;
// invalid values and unknown IDEMPOTENCY_* variables stop start-up with an
// error that names the variable), builds a Redis client and the Redis store
// (package redisrepo), an observer that turns the coordinator's events into
// Prometheus metrics and zap log lines (package observability), and the
// coordinator (package coordinator, the engine). UseRedisClient points it at
// the app's own Redis client instead, OverrideSettings and
// OverrideSettingsWith change settings in code, and the package fxtest
// (github.com/idemkit/idempotency/fxtest) swaps Redis out in tests.
//
// Every constructor Module wires is exported, so the library works without fx
// too:
//
//	s, err := idempotency.LoadSettings()
//	client, err := idempotency.NewRedisClient(s)
//	obs, err := idempotency.NewObserver(s, logger, prometheus.DefaultRegisterer)
//	c, err := idempotency.NewCoordinator(s, idempotency.NewStore(s, client), obs)
package idempotency
