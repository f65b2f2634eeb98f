package mixintest_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/idemkit/idempotency/idemconsume"
	"github.com/idemkit/idempotency/observability"
	"github.com/idemkit/idempotency/observability/mixin"
	"github.com/idemkit/idempotency/observability/mixin/mixintest/internal/promcheck"
)

var (
	schemaOnce sync.Once
	schema     *promcheck.Schema
	schemaErr  error
)

// librarySchema returns the schema of a running coordinator's registry,
// built once for all tests.
func librarySchema(t *testing.T) *promcheck.Schema {
	t.Helper()
	schemaOnce.Do(func() { schema, schemaErr = promcheck.LibrarySchema("") })
	if schemaErr != nil {
		t.Fatal(schemaErr)
	}
	return schema
}

// readFile reads a file of the mixin, the directory above this module.
func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestDashboardQueriesMatchTheRegistry(t *testing.T) {
	c := promcheck.NewChecker(librarySchema(t))
	for _, err := range c.CheckDashboard(readFile(t, "dashboard.json")) {
		t.Error(err)
	}
}

// With a namespace, the generated dashboard matches a registry with that
// namespace, and the plain one does not: the caveat the README states.
func TestNamespacedDashboard(t *testing.T) {
	s, err := promcheck.LibrarySchema("shop")
	if err != nil {
		t.Fatal(err)
	}
	c := promcheck.NewChecker(s)
	data, err := mixin.Dashboard("shop")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range c.CheckDashboard(data) {
		t.Error(err)
	}
	if errs := c.CheckDashboard(readFile(t, "dashboard.json")); len(errs) == 0 {
		t.Error("the dashboard without namespace passed against a shop_ registry")
	}
	// The namespaces observability.WithNamespace refuses, and only those.
	for _, ns := range []string{"9shop", "my-app", "shop:api"} {
		if _, err := mixin.Dashboard(ns); err == nil || !strings.Contains(err.Error(), "is not a Prometheus name") {
			t.Errorf("Dashboard(%q) = %v, want the refusal observability.WithNamespace gives", ns, err)
		}
		if _, err := observability.New(observability.WithNamespace(ns)); err == nil {
			t.Errorf("observability.WithNamespace(%q) accepted what the dashboard refuses", ns)
		}
	}
	for _, ns := range []string{"shop", "Shop_2", "_x"} {
		if _, err := mixin.Dashboard(ns); err != nil {
			t.Errorf("Dashboard(%q): %v", ns, err)
		}
	}
}

// TestDashboardContents checks what an operator looks for: the panels the
// issue asks for, the variables, and the datasource of every panel.
func TestDashboardContents(t *testing.T) {
	var d struct {
		Title, UID    string
		SchemaVersion int
		Templating    struct {
			List []struct{ Name, Type, Query string }
		}
		Panels []struct {
			Title, Type string
			Datasource  struct{ Type, UID string }
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(readFile(t, "dashboard.json"), &d); err != nil {
		t.Fatal(err)
	}
	if d.UID != mixin.DashboardUID || d.SchemaVersion != 39 {
		t.Errorf("uid %q, schemaVersion %d", d.UID, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type + " " + v.Query
	}
	for name, want := range map[string]string{
		"datasource": "datasource prometheus",
		"operation":  "query label_values(idempotency_requests_total, operation)",
		"method":     "query label_values(idempotency_storage_duration_seconds_count, method)",
	} {
		if vars[name] != want {
			t.Errorf("variable %s = %q, want %q", name, vars[name], want)
		}
	}

	exprs := map[string]string{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: title, targets or datasource missing: %+v", p.Title, p)
		}
		for _, tg := range p.Targets {
			exprs[p.Title] += tg.Expr + "\n"
		}
	}
	// Each panel the issue asks for, by title, and a part of its query.
	for title, want := range map[string]string{
		"Request outcomes by operation":            "sum by (operation, outcome) (rate(idempotency_requests_total",
		"Hit ratio by operation":                   `outcome=~"hit|miss"`,
		"Stored results by operation":              "idempotency_stored_total",
		"Unprotected runs by operation and method": "sum by (operation, method) (rate(idempotency_unprotected_total",
		"Storage latency (successful calls)":       "histogram_quantile(0.99, sum by (le, method) (rate(idempotency_storage_duration_seconds_bucket",
		"Storage errors by method and result":      "sum by (method, result) (rate(idempotency_storage_duration_seconds_count",
		"Storage error ratio by method":            `result=~"error|timeout"`,
		"Wait outcomes":                            "idempotency_wait_duration_seconds_count",
		"Wait duration":                            "idempotency_wait_duration_seconds_bucket",
		"Lease lost by operation":                  `error_type="lease_lost"`,
		"Errors by type":                           "sum by (error_type) (rate(idempotency_errors_total",
		"Unprotected runs":                         "idempotency_unprotected_total",
		"Consumer deliveries by decision":          "sum by (operation, decision, reason) (rate(idempotency_consumer_deliveries_total",
		"Consumer dead letters":                    "idempotency_consumer_dead_letters_total",
		"Consumer command errors":                  "sum by (operation, command) (rate(idempotency_consumer_errors_total",
		"Consumer claims":                          "idempotency_consumer_claims_total",
	} {
		if !strings.Contains(exprs[title], want) {
			t.Errorf("panel %q: query %q does not contain %q", title, exprs[title], want)
		}
	}
	if !strings.Contains(exprs["Storage latency (successful calls)"], "histogram_quantile(0.5,") {
		t.Error("storage latency panel has no p50")
	}
}

// TestSchemaIsTheDocumentedOne checks the checker's ground truth: the
// registry of a running coordinator has the six metrics of
// docs/observability.md, with exactly the label values the coordinator's
// lists give.
func TestSchemaIsTheDocumentedOne(t *testing.T) {
	s := librarySchema(t)
	str := func(vs ...[]string) []string {
		var out []string
		for _, v := range vs {
			out = append(out, v...)
		}
		sort.Strings(out)
		return out
	}
	methods := func(extra ...idemevent.Method) []string {
		var out []string
		for _, m := range append(idemevent.Methods(), extra...) {
			out = append(out, string(m))
		}
		return out
	}
	var errorTypes, waitOutcomes []string
	for _, e := range idemevent.ErrorTypes() {
		errorTypes = append(errorTypes, string(e))
	}
	for _, o := range idemevent.WaitOutcomes() {
		waitOutcomes = append(waitOutcomes, string(o))
	}
	ops := str(promcheck.Operations, []string{observability.OtherOperation})
	consumerOp := []string{promcheck.ConsumerOperation}
	var reasons, deadReasons []string
	for _, r := range idemconsume.Reasons() {
		reasons = append(reasons, string(r))
		if r.Action() == idemconsume.DeadLetter {
			deadReasons = append(deadReasons, string(r))
		}
	}
	want := map[string]map[string][]string{
		"idempotency_requests_total":                 {"operation": ops, "outcome": str(promcheck.RequestOutcomes())},
		"idempotency_errors_total":                   {"operation": ops, "error_type": str(errorTypes)},
		"idempotency_stored_total":                   {"operation": ops},
		"idempotency_unprotected_total":              {"operation": ops, "method": str(methods(idemevent.MethodNone))},
		"idempotency_wait_duration_seconds_count":    {"operation": ops, "outcome": str(waitOutcomes)},
		"idempotency_storage_duration_seconds_count": {"method": str(methods()), "result": str(promcheck.StorageResults)},
		"idempotency_storage_refusals_total":         {"operation": ops, "reason": str(promcheck.RefusalReasons)},
		"idempotency_bulk_keys_total":                {"operation": ops, "outcome": {"hit", "miss"}},
		"idempotency_consumer_deliveries_total":      {"operation": consumerOp, "decision": str([]string{"ack", "retry", "dead_letter"}), "reason": str(reasons)},
		"idempotency_consumer_dead_letters_total":    {"operation": consumerOp, "reason": str(deadReasons)},
		"idempotency_consumer_claims_total":          {"operation": consumerOp},
		"idempotency_consumer_errors_total":          {"operation": consumerOp, "command": str(promcheck.ConsumerCommands, []string{"unknown"})},
	}
	for name, labels := range want {
		se, ok := s.Series[name]
		if !ok {
			t.Errorf("registry has no %s; it has %v", name, s.Names())
			continue
		}
		for _, l := range promcheck.TargetLabels {
			labels[l] = nil
		}
		if len(se.Labels) != len(labels) {
			t.Errorf("%s has labels %v, want %v", name, se.Labels, labels)
		}
		for l, values := range labels {
			var got []string
			for v := range se.Labels[l] {
				got = append(got, v)
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(values, ",") {
				t.Errorf("%s{%s}: values %v, want %v", name, l, got, values)
			}
		}
	}
	for _, name := range []string{"idempotency_wait_duration_seconds", "idempotency_storage_duration_seconds"} {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if se, ok := s.Series[name+suffix]; !ok || !se.Counter || se.Bucket != (suffix == "_bucket") {
				t.Errorf("%s%s: missing or of the wrong kind", name, suffix)
			}
		}
	}
	if n := len(s.Series); n != 16 {
		t.Errorf("%d series names, want 10 counters and 2 histograms of 3: %v", n, s.Names())
	}
}

// TestRulesFile checks every expression of rules.yml against the registry.
func TestRulesFile(t *testing.T) {
	if _, err := os.Stat("../rules.yml"); errors.Is(err, os.ErrNotExist) {
		t.Skip("rules.yml does not exist (yet): no rules to check")
	}
	c := promcheck.NewChecker(librarySchema(t))
	for _, err := range c.CheckRulesFile("../rules.yml") {
		t.Error(err)
	}
}
