package observability_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/observability"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newObserver returns an Observer with opts on a fresh registry.
func newObserver(t *testing.T, opts ...observability.Option) (*observability.Observer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o, err := observability.New(append([]observability.Option{observability.WithRegisterer(reg)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return o, reg
}

// feed passes events to o.
func feed(t *testing.T, o idemevent.Observer, events ...idemevent.Event) {
	t.Helper()
	for _, e := range events {
		o.Observe(t.Context(), e)
	}
}

// key is the Key of the events of the tests.
func key(op string) idemstore.Key { return idemstore.Key{Operation: op, Key: "order-42"} }

// family returns the metric family name gathered from g, or nil.
func family(t *testing.T, g prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// series returns the series of family name whose labels are labels (name,
// value pairs), failing the test when there is none.
func series(t *testing.T, g prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	mf := family(t, g, name)
	if mf == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range mf.GetMetric() {
		if hasLabels(m, labels) {
			return m
		}
	}
	t.Fatalf("no series %s{%s}", name, strings.Join(labels, ","))
	return nil
}

func hasLabels(m *dto.Metric, labels []string) bool {
	if len(m.GetLabel())*2 != len(labels) {
		return false
	}
	for i := 0; i < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// counter returns the value of a counter series.
func counter(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return series(t, g, name, labels...).GetCounter().GetValue()
}

// histogram returns the sample count and sum of a histogram series.
func histogram(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (uint64, float64) {
	t.Helper()
	h := series(t, g, name, labels...).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// seriesCount returns how many series family name has (0 when absent).
func seriesCount(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	return len(family(t, g, name).GetMetric())
}
