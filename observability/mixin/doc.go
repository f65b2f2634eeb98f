// Package mixin holds the monitoring mixin of github.com/idemkit/idempotency:
// a Grafana dashboard (dashboard.json, written by Dashboard) and the checks
// that keep it, and the Prometheus rules in rules.yml, true to the metrics
// the library exports.
//
// The checks run against the library itself: LibrarySchema drives a real
// coordinator with an observability.Observer on a new Prometheus registry
// and reads back the series it exposes; a Checker then parses each PromQL
// expression with the Prometheus parser and reports every selector of a
// series the registry does not have, every label matcher on a label the
// series lacks or with a value the library does not document, rate() of a
// non-counter, histogram_quantile() without le, and aggregation by a label
// that does not exist.
//
// The package lives in a module of its own, so that the Prometheus server
// module it needs for the parser stays out of the library's dependencies.
//
// To regenerate dashboard.json after changing the layout:
//
//	go generate ./...
package mixin

//go:generate go run ./cmd/gendashboard -o dashboard.json
