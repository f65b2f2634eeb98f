// Package promcheck checks the mixin's dashboard and rules against the
// metrics the library exports.
//
// LibrarySchema drives a real coordinator with an observability.Observer on
// a new Prometheus registry and reads back the series it exposes; a Checker
// then parses each PromQL expression with the Prometheus parser and reports
// every selector of a series the registry does not have, every label matcher
// on a label the series lacks or with a value the library does not document,
// rate() of a non-counter, histogram_quantile() without le, and aggregation
// by a label that does not exist.
//
// It is internal to the test-only module mixintest: nothing outside the
// mixin's own tests uses it, and its dependencies stay out of the mixin.
package promcheck
