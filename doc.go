// Package idempotency makes an operation run once per idempotency key, in
// services built on go.uber.org/fx.
//
// The engine lives in package coordinator: it reserves a key in a store, runs
// the action, stores its result and replays that result to every later call
// with the same key. This package is the thin layer that configures it from
// the environment:
//
//	s, err := idempotency.LoadSettings() // IDEMPOTENCY_* variables, validated
//	if err != nil {
//		return err // names every bad variable: "IDEMPOTENCY_LEASE: must be at least 1ms, got 0s"
//	}
//	c, err := coordinator.New(store, s.CoordinatorOptions()...)
//
// Settings holds every variable with its default (see DefaultSettings), and
// Settings.Validate checks a Settings built in code the same way LoadSettings
// checks the environment.
//
// Status: the fx module (idempotency.Module, which provides the Settings, the
// Redis-backed store and the *coordinator.Coordinator to an fx app) and the
// constructors it wires are being built; until they land, build the
// coordinator yourself as above.
package idempotency
