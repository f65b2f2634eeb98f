package observability_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/observability"
)

// documented is every metric docs/observability.md lists, with the number of
// series a fresh registry has for one operation given to WithOperations.
var documented = []struct {
	name   string
	series int
}{
	{"idempotency_requests_total", 4},                                                                         // hit, miss, in_flight, not_replayable
	{"idempotency_errors_total", len(idemevent.ErrorTypes())},                                                 // 9
	{"idempotency_stored_total", 1},                                                                           //
	{"idempotency_unprotected_total", len(idemevent.Methods()) + 1},                                           // 7 store methods and none
	{"idempotency_wait_duration_seconds", len(idemevent.WaitOutcomes())},                                      // 6
	{"idempotency_storage_duration_seconds", len(idemevent.Methods()) * 4 /* ok, error, timeout, canceled */}, // 28
	{"idempotency_storage_refusals_total", 4},                                                                 // credentials, permission, database, breaker_open
	{"idempotency_bulk_keys_total", 2},                                                                        // hit, miss
}

func TestFreshRegistryHasEveryMetricAtZero(t *testing.T) {
	_, reg := newObserver(t, observability.WithOperations("payment.charge"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, d := range documented {
		if !slices.Contains(names, d.name) {
			t.Errorf("metric %s missing from a fresh scrape (got %v)", d.name, names)
			continue
		}
		if got := seriesCount(t, reg, d.name); got != d.series {
			t.Errorf("%s has %d series, want %d", d.name, got, d.series)
		}
	}
	if len(names) != len(documented) {
		t.Errorf("scrape has %d metrics %v, want the %d documented", len(names), names, len(documented))
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			if v != 0 {
				t.Errorf("%s %v = %v, want 0", mf.GetName(), m.GetLabel(), v)
			}
		}
	}
}

func TestZeroSeriesOfKnownOperations(t *testing.T) {
	_, reg := newObserver(t, observability.WithOperations("payment.charge", "order.create", "payment.charge"))
	for _, op := range []string{"payment.charge", "order.create"} {
		for _, outcome := range []string{"hit", "miss", "in_flight", "not_replayable"} {
			if got := counter(t, reg, "idempotency_requests_total", "operation", op, "outcome", outcome); got != 0 {
				t.Errorf("requests_total{%s,%s} = %v, want 0", op, outcome, got)
			}
		}
		for _, et := range idemevent.ErrorTypes() {
			counter(t, reg, "idempotency_errors_total", "operation", op, "error_type", string(et))
		}
		for _, m := range idemevent.Methods() {
			counter(t, reg, "idempotency_unprotected_total", "operation", op, "method", string(m))
		}
		for _, w := range idemevent.WaitOutcomes() {
			histogram(t, reg, "idempotency_wait_duration_seconds", "operation", op, "outcome", string(w))
		}
		counter(t, reg, "idempotency_stored_total", "operation", op)
	}
	want := `
# HELP idempotency_stored_total Action results stored for replay.
# TYPE idempotency_stored_total counter
idempotency_stored_total{operation="order.create"} 0
idempotency_stored_total{operation="payment.charge"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idempotency_stored_total"); err != nil {
		t.Fatal(err)
	}
}

func TestWithoutOperationsOnlyStorageSeriesExist(t *testing.T) {
	_, reg := newObserver(t)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 4*len(idemevent.Methods()) {
		t.Fatalf("GatherAndCount = %d, %v; want the %d storage series", n, err, 4*len(idemevent.Methods()))
	}
}

func TestMetricsPassLint(t *testing.T) {
	o, reg := newObserver(t, observability.WithOperations("payment.charge"))
	feed(t, o, idemevent.Event{Kind: idemevent.Hit, Key: key("payment.charge")})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestEventsCount(t *testing.T) {
	const op = "payment.charge"
	k := key(op)
	storeDown := &coordinator.StorageError{Method: idemevent.MethodReserve, Err: errors.New("connection refused")}
	tests := []struct {
		name   string
		event  idemevent.Event
		metric string
		labels []string
	}{
		{"hit", idemevent.Event{Kind: idemevent.Hit, Key: k},
			"idempotency_requests_total", []string{"operation", op, "outcome", "hit"}},
		{"miss", idemevent.Event{Kind: idemevent.Miss, Key: k},
			"idempotency_requests_total", []string{"operation", op, "outcome", "miss"}},
		{"in flight", idemevent.Event{Kind: idemevent.InFlight, Key: k, Mode: string(coordinator.InFlightWait)},
			"idempotency_requests_total", []string{"operation", op, "outcome", "in_flight"}},
		{"not replayable", idemevent.Event{Kind: idemevent.NotReplayable, Key: k,
			Err: &coordinator.NotReplayableError{Operation: op, Key: k.Key, Reason: "too large"}},
			"idempotency_requests_total", []string{"operation", op, "outcome", "not_replayable"}},
		{"stored", idemevent.Event{Kind: idemevent.Stored, Key: k},
			"idempotency_stored_total", []string{"operation", op}},
		{"storage error", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorStorageReserve, Method: idemevent.MethodReserve, Err: storeDown},
			"idempotency_errors_total", []string{"operation", op, "error_type", "storage_reserve_error"}},
		{"lease lost", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorLeaseLost, Err: coordinator.ErrLeaseLost},
			"idempotency_errors_total", []string{"operation", op, "error_type", "lease_lost"}},
		{"unknown error type", idemevent.Event{Kind: idemevent.Error, Key: k, ErrorType: "new_kind_of_error"},
			"idempotency_errors_total", []string{"operation", op, "error_type", "unknown"}},
		{"unprotected", idemevent.Event{Kind: idemevent.Unprotected, Key: k, Method: idemevent.MethodGet},
			"idempotency_unprotected_total", []string{"operation", op, "method", "get"}},
		{"unprotected, no key", idemevent.Event{Kind: idemevent.Unprotected, Key: idemstore.Key{Operation: op}, Method: idemevent.MethodNone},
			"idempotency_unprotected_total", []string{"operation", op, "method", "none"}},
		{"unprotected, unknown method", idemevent.Event{Kind: idemevent.Unprotected, Key: k, Method: "scan"},
			"idempotency_unprotected_total", []string{"operation", op, "method", "unknown"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, reg := newObserver(t, observability.WithOperations(op))
			feed(t, o, tt.event, tt.event)
			if got := counter(t, reg, tt.metric, tt.labels...); got != 2 {
				t.Fatalf("%s%v = %v, want 2", tt.metric, tt.labels, got)
			}
		})
	}
}

func TestWaitDurations(t *testing.T) {
	o, reg := newObserver(t)
	k := key("payment.charge")
	feed(t, o,
		idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitHit, Duration: 40 * time.Millisecond},
		idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitHit, Duration: 60 * time.Millisecond},
		idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitTimeout, Duration: 30 * time.Second},
		idemevent.Event{Kind: idemevent.Waited, Key: k, Outcome: "eternity", Duration: time.Second},
	)
	for _, tt := range []struct {
		outcome string
		count   uint64
		sum     float64
	}{
		{"hit", 2, 0.1},
		{"timeout", 1, 30},
		{"takeover", 0, 0},
		{"unknown", 1, 1},
	} {
		n, sum := histogram(t, reg, "idempotency_wait_duration_seconds", "operation", "payment.charge", "outcome", tt.outcome)
		if n != tt.count || !near(sum, tt.sum) {
			t.Errorf("wait{%s}: count %d sum %v, want %d and %v", tt.outcome, n, sum, tt.count, tt.sum)
		}
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// timeoutError is a net.Error that timed out, as a driver returns it.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

var _ net.Error = timeoutError{}

func TestStorageCallResults(t *testing.T) {
	tests := []struct {
		err    error
		result string
	}{
		{nil, "ok"},
		{errors.New("READONLY You can't write against a read only replica"), "error"},
		{fmt.Errorf("reserve: %w", context.DeadlineExceeded), "timeout"},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutError{}}, "timeout"},
		{context.Canceled, "canceled"},
		{&coordinator.StorageError{Method: idemevent.MethodGet, Err: context.Canceled}, "canceled"},
	}
	for _, tt := range tests {
		t.Run(tt.result+"/"+fmt.Sprint(tt.err), func(t *testing.T) {
			o, reg := newObserver(t)
			feed(t, o, idemevent.Event{Kind: idemevent.StorageCall, Key: key("payment.charge"),
				Method: idemevent.MethodGet, Duration: 300 * time.Microsecond, Err: tt.err})
			n, sum := histogram(t, reg, "idempotency_storage_duration_seconds", "method", "get", "result", tt.result)
			if n != 1 || !near(sum, 0.0003) {
				t.Fatalf("storage{get,%s}: count %d sum %v, want 1 and 0.0003", tt.result, n, sum)
			}
		})
	}
}

func TestStorageBucketsResolveSubMillisecondCalls(t *testing.T) {
	o, reg := newObserver(t)
	feed(t, o, idemevent.Event{Kind: idemevent.StorageCall, Key: key("op"), Method: idemevent.MethodReserve, Duration: 80 * time.Microsecond})
	h := series(t, reg, "idempotency_storage_duration_seconds", "method", "reserve", "result", "ok").GetHistogram()
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
		if b.GetUpperBound() == 0.0001 && b.GetCumulativeCount() != 1 {
			t.Errorf("le=0.0001 holds %d calls, want the 80µs call", b.GetCumulativeCount())
		}
		if b.GetUpperBound() == 0.00005 && b.GetCumulativeCount() != 0 {
			t.Errorf("le=0.00005 holds %d calls, want 0", b.GetCumulativeCount())
		}
	}
	if bounds[0] != 0.00005 || bounds[len(bounds)-1] != 2.5 {
		t.Fatalf("buckets %v: want 50µs to 2.5s", bounds)
	}
}

func TestNamespacePrefixesEveryName(t *testing.T) {
	_, reg := newObserver(t, observability.WithNamespace("shop"), observability.WithOperations("payment.charge"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != len(documented) {
		t.Fatalf("%d metrics, want %d", len(mfs), len(documented))
	}
	for _, d := range documented {
		if family(t, reg, "shop_"+d.name) == nil {
			t.Errorf("no metric shop_%s", d.name)
		}
	}
}

func TestTwoObserversOnOneRegistryShareSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	var obs []*observability.Observer
	for range 2 {
		o, err := observability.New(observability.WithRegisterer(reg), observability.WithOperations("payment.charge"))
		if err != nil {
			t.Fatalf("New on a registry that has the metrics already: %v", err)
		}
		obs = append(obs, o)
	}
	for _, o := range obs {
		feed(t, o,
			idemevent.Event{Kind: idemevent.Hit, Key: key("payment.charge")},
			idemevent.Event{Kind: idemevent.Miss, Key: key("order.create")},
			idemevent.Event{Kind: idemevent.StorageCall, Key: key("order.create"), Method: idemevent.MethodReserve, Duration: time.Millisecond},
		)
	}
	if got := counter(t, reg, "idempotency_requests_total", "operation", "payment.charge", "outcome", "hit"); got != 2 {
		t.Errorf("hits = %v, want 2 (one per observer)", got)
	}
	if got := counter(t, reg, "idempotency_requests_total", "operation", "order.create", "outcome", "miss"); got != 2 {
		t.Errorf("misses = %v, want 2 (one per observer)", got)
	}
	if n, _ := histogram(t, reg, "idempotency_storage_duration_seconds", "method", "reserve", "result", "ok"); n != 2 {
		t.Errorf("reserve calls = %d, want 2", n)
	}
	if got := seriesCount(t, reg, "idempotency_requests_total"); got != 8 {
		t.Errorf("requests_total has %d series, want 8 (4 outcomes x 2 operations)", got)
	}
}

func TestTwoObserversOnWrappedDefaultStyleRegisterer(t *testing.T) {
	// An app often registers through a wrapping registerer; the collector
	// that comes back is the unwrapped one, which must still be reused.
	reg := prometheus.NewRegistry()
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"service": "shop"}, reg)
	for range 2 {
		o, err := observability.New(observability.WithRegisterer(wrapped))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		feed(t, o, idemevent.Event{Kind: idemevent.Stored, Key: key("payment.charge")})
	}
	if got := counter(t, reg, "idempotency_stored_total", "operation", "payment.charge", "service", "shop"); got != 2 {
		t.Fatalf("stored = %v, want 2", got)
	}
}

func TestConflictingCollectorIsAnErrorAndRollsBack(t *testing.T) {
	tests := []struct {
		name      string
		collector prometheus.Collector
	}{
		{"same name, other type", prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idempotency_stored_total", Help: "Action results stored for replay."}, []string{"operation"})},
		{"same name, other labels", prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idempotency_stored_total", Help: "Action results stored for replay."}, []string{"op"})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if err := reg.Register(tt.collector); err != nil {
				t.Fatal(err)
			}
			o, err := observability.New(observability.WithRegisterer(reg))
			if err == nil || o != nil {
				t.Fatalf("New = %v, %v; want an error", o, err)
			}
			if !strings.Contains(err.Error(), "register idempotency_stored_total") {
				t.Errorf("error %q does not name the metric", err)
			}
			// Only the conflicting collector is left: New rolled its own back.
			if family(t, reg, "idempotency_requests_total") != nil || family(t, reg, "idempotency_errors_total") != nil {
				t.Errorf("New left its collectors registered after failing")
			}
			if _, err := observability.New(observability.WithRegisterer(prometheus.NewRegistry())); err != nil {
				t.Fatalf("New on a clean registry: %v", err)
			}
		})
	}
}

func TestNilRegistererRecordsNothing(t *testing.T) {
	o, err := observability.New(observability.WithRegisterer(nil))
	if err != nil {
		t.Fatal(err)
	}
	// Nothing to gather: the test is that every kind of event is accepted.
	for k := idemevent.Hit; k <= idemevent.Unprotected+1; k++ {
		feed(t, o, idemevent.Event{Kind: k, Key: key("payment.charge")})
	}
}

func TestOperationLimit(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	o, reg := newObserver(t,
		observability.WithOperations("payment.charge"),
		observability.WithOperationLimit(2),
		observability.WithLogger(zap.New(core)))
	for _, op := range []string{"payment.charge", "order.create", "order.cancel", "refund.create", "order.create"} {
		feed(t, o, idemevent.Event{Kind: idemevent.Miss, Key: key(op)})
	}
	for _, tt := range []struct {
		op   string
		want float64
	}{
		{"payment.charge", 1},
		{"order.create", 2},
		{observability.OtherOperation, 2},
	} {
		if got := counter(t, reg, "idempotency_requests_total", "operation", tt.op, "outcome", "miss"); got != tt.want {
			t.Errorf("misses of %s = %v, want %v", tt.op, got, tt.want)
		}
	}
	if got := seriesCount(t, reg, "idempotency_requests_total"); got != 12 {
		t.Errorf("requests_total has %d series, want 12 (3 operation values x 4 outcomes)", got)
	}
	warns := logs.FilterMessageSnippet("operation label limit").All()
	if len(warns) != 1 {
		t.Fatalf("%d limit warnings, want 1: %v", len(warns), logs.All())
	}
	if f := warns[0].ContextMap(); f["operation"] != "order.cancel" || f["limit"] != int64(2) {
		t.Errorf("limit warning fields %v", f)
	}
}

func TestOperationsBeyondTheLimitAreKept(t *testing.T) {
	o, reg := newObserver(t, observability.WithOperations("a", "b", "c"), observability.WithOperationLimit(1))
	feed(t, o, idemevent.Event{Kind: idemevent.Hit, Key: key("c")}, idemevent.Event{Kind: idemevent.Hit, Key: key("d")})
	if got := counter(t, reg, "idempotency_requests_total", "operation", "c", "outcome", "hit"); got != 1 {
		t.Errorf("hits of c = %v, want 1", got)
	}
	if got := counter(t, reg, "idempotency_requests_total", "operation", observability.OtherOperation, "outcome", "hit"); got != 1 {
		t.Errorf("hits of %s = %v, want 1", observability.OtherOperation, got)
	}
}

func TestInvalidOperationIsCountedAsOther(t *testing.T) {
	o, reg := newObserver(t)
	for _, op := range []string{"", "bad op", "caf\xe9", strings.Repeat("x", coordinator.MaxOperationLen+1)} {
		feed(t, o, idemevent.Event{Kind: idemevent.Hit, Key: key(op)})
	}
	if got := counter(t, reg, "idempotency_requests_total", "operation", observability.OtherOperation, "outcome", "hit"); got != 4 {
		t.Fatalf("hits of %s = %v, want 4", observability.OtherOperation, got)
	}
}

func TestInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  observability.Option
		want string
	}{
		{"namespace with a dash", observability.WithNamespace("my-shop"), "WithNamespace"},
		{"namespace with a leading digit", observability.WithNamespace("1shop"), "WithNamespace"},
		{"namespace with a colon", observability.WithNamespace("shop:x"), "WithNamespace"},
		{"invalid operation", observability.WithOperations("payment charge"), "WithOperations"},
		{"zero operation limit", observability.WithOperationLimit(0), "WithOperationLimit"},
		{"unknown key logging", observability.WithLogKeys("loud"), "WithLogKeys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			o, err := observability.New(observability.WithRegisterer(reg), tt.opt)
			var oe *coordinator.OptionError
			if err == nil || o != nil || !errors.As(err, &oe) || oe.Option != tt.want {
				t.Fatalf("New = %v, %v; want an *OptionError of %s", o, err, tt.want)
			}
			if verr := observability.ValidateOptions(tt.opt); verr == nil || verr.Error() != err.Error() {
				t.Fatalf("ValidateOptions = %v, want New's error", verr)
			}
			if n, _ := testutil.GatherAndCount(reg); n != 0 {
				t.Errorf("a refused New registered %d series", n)
			}
		})
	}
}

func TestConcurrentObserve(t *testing.T) {
	o, reg := newObserver(t, observability.WithOperationLimit(10))
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				op := fmt.Sprintf("op%d", (g+i)%12) // 12 operations, limit 10
				feed(t, o,
					idemevent.Event{Kind: idemevent.Miss, Key: key(op)},
					idemevent.Event{Kind: idemevent.StorageCall, Key: key(op), Method: idemevent.MethodComplete, Duration: time.Millisecond},
				)
			}
		})
	}
	wg.Wait()
	var total float64
	mf := family(t, reg, "idempotency_requests_total")
	values := map[string]bool{}
	for _, m := range mf.GetMetric() {
		if hasLabels(m, []string{"operation", labelOf(m, "operation"), "outcome", "miss"}) {
			total += m.GetCounter().GetValue()
		}
		values[labelOf(m, "operation")] = true
	}
	if total != 16*500 {
		t.Errorf("misses = %v, want %d", total, 16*500)
	}
	if len(values) != 11 {
		t.Errorf("%d operation label values %v, want 10 plus %s", len(values), values, observability.OtherOperation)
	}
	if n, _ := histogram(t, reg, "idempotency_storage_duration_seconds", "method", "complete", "result", "ok"); n != 16*500 {
		t.Errorf("complete calls = %d, want %d", n, 16*500)
	}
}

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func TestObserveDoesNotAllocate(t *testing.T) {
	o, _ := newObserver(t, observability.WithOperations("payment.charge"))
	k := key("payment.charge")
	events := []idemevent.Event{
		{Kind: idemevent.Hit, Key: k},
		{Kind: idemevent.Miss, Key: k},
		{Kind: idemevent.Stored, Key: k},
		{Kind: idemevent.StorageCall, Key: k, Method: idemevent.MethodReserve, Duration: time.Millisecond},
		{Kind: idemevent.Waited, Key: k, Outcome: idemevent.WaitHit, Duration: time.Millisecond},
		{Kind: idemevent.Error, Key: k, ErrorType: idemevent.ErrorKeyReuse, Err: coordinator.ErrKeyReuse},
	}
	ctx := t.Context()
	for _, e := range events {
		if n := testing.AllocsPerRun(100, func() { o.Observe(ctx, e) }); n != 0 {
			t.Errorf("Observe(%s) allocates %v times per call with the no-op logger, want 0", e.Kind, n)
		}
	}
}

// Registering on prometheus.DefaultRegisterer, as the fx module does when the
// app provides no registerer, twice in one process.
// The metrics stay registered there for the rest of the test binary, under a
// namespace no other test uses.
func TestDefaultRegistererTwice(t *testing.T) {
	for range 2 {
		if _, err := observability.New(observability.WithRegisterer(prometheus.DefaultRegisterer), observability.WithNamespace("obstest")); err != nil {
			t.Fatalf("New on the default registerer: %v", err)
		}
	}
	if family(t, prometheus.DefaultGatherer, "obstest_idempotency_storage_duration_seconds") == nil {
		t.Fatal("no storage histogram on the default registry")
	}
}

func BenchmarkObserve(b *testing.B) {
	reg := prometheus.NewRegistry()
	o, err := observability.New(observability.WithRegisterer(reg), observability.WithOperations("payment.charge"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	hit := idemevent.Event{Kind: idemevent.Hit, Key: key("payment.charge")}
	call := idemevent.Event{Kind: idemevent.StorageCall, Key: key("payment.charge"), Method: idemevent.MethodReserve, Duration: 300 * time.Microsecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			o.Observe(ctx, hit)
			o.Observe(ctx, call)
		}
	})
}
