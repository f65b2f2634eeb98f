package idempotency_test

import (
	"os"
	"regexp"
	"sort"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// counterValue returns the value of the counter series name{labels}, or -1
// when there is none.
func counterValue(mfs []*dto.MetricFamily, name string, labels map[string]string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// documentedMetrics returns every metric name docs/observability.md names.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`(idempotency_[a-z_]+)`").FindAllStringSubmatch(string(doc), -1) {
		seen[m[1]] = true
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) < 5 {
		t.Fatalf("docs/observability.md names only %v", names)
	}
	return names
}
