// Package mixin holds the monitoring mixin of github.com/idemkit/idempotency:
// a Grafana dashboard (dashboard.json, written by Dashboard) and the
// Prometheus rules in rules.yml, true to the metrics the library exports.
//
// The package needs nothing but the standard library, so importing it adds no
// dependency to a module. The checks that keep the dashboard and the rules
// true to the library's metrics (PromQL parsed with the Prometheus parser,
// the dashboard decoded with Grafana's schema) live in the test-only module
// mixintest, so that the Prometheus server module they need stays out of
// this one.
//
// To regenerate dashboard.json after changing the layout:
//
//	go generate ./...
package mixin

//go:generate go run ./cmd/gendashboard -o dashboard.json
