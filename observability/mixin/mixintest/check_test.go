package mixintest_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idempotency/observability/mixin/mixintest/internal/promcheck"
)

// The checker accepts what is right: the queries docs/observability.md
// recommends, and other valid forms.
func TestCheckExprAccepts(t *testing.T) {
	c := promcheck.NewChecker(librarySchema(t))
	for _, expr := range []string{
		`sum by (operation) (increase(idempotency_unprotected_total[5m])) > 0`,
		`sum by (method) (rate(idempotency_storage_duration_seconds_count{result=~"error|timeout"}[5m])) / sum by (method) (rate(idempotency_storage_duration_seconds_count[5m])) > 0.01`,
		`sum by (error_type) (rate(idempotency_errors_total{error_type=~"storage_.*"}[5m])) > 0`,
		`histogram_quantile(0.99, sum by (le, method) (rate(idempotency_storage_duration_seconds_bucket{result="ok"}[5m]))) > 0.05`,
		`sum(rate(idempotency_requests_total{operation="~other"}[15m])) > 0`,
		`sum(rate(idempotency_requests_total{operation="payment.charge", outcome!="in_flight"}[5m]))`,
		`sum by (operation) (rate(idempotency_wait_duration_seconds_count{outcome="timeout"}[5m])) > 0`,
		`count by (job, instance) (idempotency_stored_total)`,
		`{__name__="idempotency_stored_total", operation=~".+"}`,
		`sum without (method) (rate(idempotency_unprotected_total{method=~"reserve|get|none"}[5m]))`,
		`label_replace(sum by (method) (rate(idempotency_storage_duration_seconds_sum[5m])), "m", "$1", "method", "(.*)")`,
		`sum by (operation, reason) (increase(idempotency_storage_refusals_total{reason=~"credentials|permission|database|breaker_open"}[5m])) > 0`,
	} {
		for _, err := range c.CheckExpr(expr) {
			t.Errorf("%s: %v", expr, err)
		}
	}
}

// The checker catches what is wrong, each with a message that says what.
func TestCheckExprRejects(t *testing.T) {
	c := promcheck.NewChecker(librarySchema(t))
	for _, tc := range []struct{ expr, want string }{
		{`rate(idempotency_request_total[5m])`, `idempotency_request_total: no such series`},
		{`rate(shop_idempotency_requests_total[5m])`, `no such series`},
		{`idempotency_storage_duration_seconds`, `no such series`}, // a histogram has no series of its own name
		{`{__name__=~"idempotency_nothing_.*"}`, `no such series`},
		{`idempotency_requests_total{result="hit"}`, `label "result" does not exist`},
		{`idempotency_storage_duration_seconds_count{operation="payment.charge"}`, `label "operation" does not exist`},
		{`idempotency_requests_total{outcome="hits"}`, `"hits" is not one of hit, in_flight, miss`},
		{`idempotency_requests_total{outcome=~"hit|mis"}`, `"mis" is not one of`},
		{`idempotency_requests_total{outcome!="timeout"}`, `"timeout" is not one of`},
		{`idempotency_errors_total{error_type="storage_error"}`, `is not one of`},
		{`idempotency_errors_total{error_type=~"storge_.*"}`, `matches none of`},
		{`idempotency_unprotected_total{method="put"}`, `"put" is not one of`},
		{`idempotency_storage_duration_seconds_count{method="none"}`, `"none" is not one of`}, // none is for unprotected only
		{`idempotency_storage_duration_seconds_count{result="failed"}`, `"failed" is not one of canceled, error, ok, timeout`},
		{`idempotency_wait_duration_seconds_count{outcome="miss"}`, `"miss" is not one of`},
		{`idempotency_storage_refusals_total{reason="password"}`, `"password" is not one of breaker_open, credentials, database, permission`},
		{`idempotency_storage_refusals_total{method="reserve"}`, `label "method" does not exist`},
		{`idempotency_requests_total{operation="bad op"}`, `is not an operation name`},
		{`idempotency_requests_total{outcome=""}`, `empty value`},
		{`histogram_quantile(0.99, sum by (method) (rate(idempotency_storage_duration_seconds_bucket[5m])))`, `drops le`},
		{`histogram_quantile(0.99, sum by (le) (rate(idempotency_storage_duration_seconds_count[5m])))`, `not a histogram's _bucket series`},
		{`sum by (operation) (rate(idempotency_storage_duration_seconds_count[5m]))`, `no series aggregated there has label "operation"`},
		{`sum by (outcome) (rate(idempotency_requests_total[5m`, `parse`},
		{`rate(idempotency_requests_total[$__rate_interval])`, `parse`},
	} {
		errs := c.CheckExpr(tc.expr)
		if !containsErr(errs, tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.expr, errs, tc.want)
		}
	}
}

// rate() of a gauge is caught; the library has none, so this uses a
// registry of its own.
func TestCheckExprRejectsRateOfGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "queue_depth", Help: "h"}, []string{"queue"})
	g.WithLabelValues("a").Set(1)
	reg.MustRegister(g)
	s, err := promcheck.SchemaFromGatherer(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := promcheck.NewChecker(s)
	if errs := c.CheckExpr(`rate(queue_depth[5m])`); !containsErr(errs, "not a counter") {
		t.Errorf("rate of a gauge: %v", errs)
	}
	if errs := c.CheckExpr(`max by (queue) (queue_depth)`); len(errs) > 0 {
		t.Errorf("a valid gauge query: %v", errs)
	}
}

// A copy of the committed dashboard with one mistake each fails the check
// with an error that names it.
func TestCheckDashboardRejectsBrokenCopies(t *testing.T) {
	c := promcheck.NewChecker(librarySchema(t))
	good := readFile(t, "dashboard.json")
	for _, tc := range []struct {
		name, old, new, want string
		n                    int // occurrences to replace; 0: the first
	}{
		{"wrong metric name", `idempotency_unprotected_total{`, `idempotency_unprotected_count{`, `idempotency_unprotected_count: no such series`, 0},
		{"wrong label", `sum by (error_type) (rate(idempotency_errors_total{operation`, `sum by (error_type) (rate(idempotency_errors_total{op`, `label "op" does not exist`, 0},
		{"wrong label value", `error_type=\"lease_lost\"`, `error_type=\"lease_lot\"`, `"lease_lot" is not one of`, 0},
		{"undefined variable", `operation=~\"$operation\", outcome=\"hit\"`, `operation=~\"$opration\", outcome=\"hit\"`, `undefined variable $opration`, 0},
		{"syntax error", `sum by (method, result) (rate(`, `sum by (method, result) (rate((`, `parse`, 0},
		{"legend label not in result", `"legendFormat": "{{error_type}}"`, `"legendFormat": "{{operation}}"`, `the result has no label operation`, 0},
		{"panel without datasource variable", `"uid": "${datasource}"`, `"uid": "P1809F7CD0C75ACF3"`, `want {"type": "prometheus", "uid": "${datasource}"}`, -1},
		{"panel without title", `"title": "Errors by type"`, `"title": ""`, `no title`, 0},
		{"panel without targets", `"targets": [`, `"targetz": [`, `no targets`, 0},
		{"variable of a missing metric", `label_values(idempotency_requests_total, operation)`, `label_values(idempotency_request_total, operation)`, `variable operation`, -1},
		{"variable of a missing label", `label_values(idempotency_storage_duration_seconds_count, method)`, `label_values(idempotency_storage_duration_seconds_count, methods)`, `no series with label methods`, -1},
		{"variable definition not its query", `"definition": "label_values(idempotency_requests_total, operation)"`, `"definition": "label_values(idempotency_stored_total, operation)"`, `definition`, 0},
		{"datasource variable of another type", `"query": "prometheus"`, `"query": "loki"`, `want prometheus`, 0},
		{"overlapping panels", `"x": 12,`, `"x": 6,`, `overlaps panel`, 0},
		{"invalid JSON", `"panels": [`, `"panels": [[`, `dashboard JSON`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(good, []byte(tc.old)) {
				t.Fatalf("dashboard.json does not contain %s", tc.old)
			}
			n := tc.n
			if n == 0 {
				n = 1
			}
			bad := bytes.Replace(good, []byte(tc.old), []byte(tc.new), n)
			errs := c.CheckDashboard(bad)
			if !containsErr(errs, tc.want) {
				t.Errorf("got %v, want an error containing %q", errs, tc.want)
			}
		})
	}
}

// Each of the dashboard's metric names, misspelt in a copy, is caught.
func TestCheckDashboardCatchesEveryMetricName(t *testing.T) {
	c := promcheck.NewChecker(librarySchema(t))
	good := readFile(t, "dashboard.json")
	names := regexp.MustCompile(`idempotency_[a-z_]+`).FindAll(good, -1)
	seen := map[string]bool{}
	for _, n := range names {
		if seen[string(n)] {
			continue
		}
		seen[string(n)] = true
		bad := bytes.ReplaceAll(good, n, []byte(strings.Replace(string(n), "idempotency_", "idempotence_", 1)))
		if errs := c.CheckDashboard(bad); !containsErr(errs, "no such series") {
			t.Errorf("%s renamed: got %v", n, errs)
		}
	}
	if len(seen) < 6 {
		t.Errorf("only %d metric names in the dashboard: %v", len(seen), seen)
	}
}

// A rules file with a mistake fails; one whose alert uses a series recorded
// in the same file passes.
func TestCheckRulesFile(t *testing.T) {
	c := promcheck.NewChecker(librarySchema(t))
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yml", `groups:
  - name: g
    rules:
      - alert: UsesLaterRecord
        expr: operation:idempotency_hit_ratio:rate5m{operation="payment.charge"} < 0.5
      - record: operation:idempotency_hit_ratio:rate5m
        expr: sum by (operation) (rate(idempotency_requests_total{outcome="hit"}[5m])) / sum by (operation) (rate(idempotency_requests_total{outcome=~"hit|miss"}[5m]))
`)
	for _, err := range c.CheckRulesFile(good) {
		t.Error(err)
	}
	for _, tc := range []struct{ content, want string }{
		{`groups:
  - name: g
    rules:
      - alert: Typo
        expr: sum(rate(idempotency_unprotected_totals[5m])) > 0
`, "idempotency_unprotected_totals: no such series"},
		{`groups:
  - name: g
    rules:
      - record: operation:x:rate5m
        expr: sum by (operation) (rate(idempotency_requests_total[5m]))
      - alert: LabelNotRecorded
        expr: operation:x:rate5m{method="get"} > 0
`, `label "method" does not exist`},
		{`groups:
  - name: g
    rules:
      - record: operation:x:rate5m
        expr: sum by (operation) (rate(idempotency_requests_total[5m]))
      - alert: RateOfARate
        expr: rate(operation:x:rate5m[5m]) > 0
`, "not a counter"},
		{`groups:
  - name: g
    rules:
      - alert: Unparsable
        expr: sum(rate(idempotency_requests_total[5m]) > 0
`, "parse error"},
	} {
		errs := c.CheckRulesFile(write("bad.yml", tc.content))
		if !containsErr(errs, tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.content, errs, tc.want)
		}
	}
}

func containsErr(errs []error, want string) bool {
	return len(errs) > 0 && strings.Contains(errors.Join(errs...).Error(), want)
}
