package idempotency_test

import (
	"os"
	"regexp"
	"sort"
	"strings"
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

// pythonSection starts the section of docs/observability.md that maps the
// Python library's metrics to ours.
const pythonSection = "\n## Coming from the Python idempotency-kit\n"

// documentedMetrics returns every metric name docs/observability.md names,
// but in the section on the Python library's metrics.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	// The section on the Python library's metrics names its series too,
	// which we do not export.
	text, _, _ := strings.Cut(string(doc), pythonSection)
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`(idempotency_[a-z_]+)`").FindAllStringSubmatch(text, -1) {
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
