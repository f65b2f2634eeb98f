package observability

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/telemetry"
)

// subsystem is the fixed part of every metric name: [namespace_]idempotency_.
const subsystem = "idempotency"

// unknownLabel stands in for an error type, store method or wait outcome
// that is not in the coordinator's lists, so that such a value cannot make a
// label unbounded.
const unknownLabel = "unknown"

// The outcome label values of requests_total.
const (
	outcomeHit      = "hit"
	outcomeMiss     = "miss"
	outcomeInFlight = "in_flight"
	outcomeNotRepl  = "not_replayable"
)

// storageBuckets are the buckets of idempotency_storage_duration_seconds, in
// seconds: from 50µs, which resolves a Redis round trip on a local network,
// to 2.5s, past the default storage timeout of 1s.
var storageBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5,
}

// waitBuckets are the buckets of idempotency_wait_duration_seconds, in
// seconds: from 5ms, below the first poll interval of 10ms, to 60s, past the
// default wait bound of one 30s lease.
var waitBuckets = []float64{
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60,
}

// metrics holds the collectors and the cached series of one Observer. The
// collectors may be shared with other Observers registered on the same
// registry; the caches are its own.
type metrics struct {
	requests    *prometheus.CounterVec
	errors      *prometheus.CounterVec
	stored      *prometheus.CounterVec
	unprotected *prometheus.CounterVec
	wait        *prometheus.HistogramVec
	storage     *prometheus.HistogramVec
	refusals    *prometheus.CounterVec
	bulk        *prometheus.CounterVec

	// storageSeries holds the storage_duration_seconds series by method.
	storageSeries map[idemevent.Method]*[telemetry.NumResults]prometheus.Observer

	// ops maps an operation label value to its series. It is copied on
	// write under mu, so that the hot path reads it without a lock.
	ops    atomic.Pointer[map[string]*opSeries]
	mu     sync.Mutex
	limit  int
	other  *opSeries // created on first use, under mu
	warned bool      // the limit was logged, under mu
	log    *zap.Logger
}

// opSeries are the series of one operation label value.
type opSeries struct {
	hit, miss, inFlight prometheus.Counter
	notReplayable       prometheus.Counter
	stored              prometheus.Counter
	bulkHit, bulkMiss   prometheus.Counter
	errors              map[idemevent.ErrorType]prometheus.Counter
	unprotected         map[idemevent.Method]prometheus.Counter
	waits               map[idemevent.WaitOutcome]prometheus.Observer
	refusals            [len(refusalReasons)]prometheus.Counter // by refusalReasons' index
	op                  string
}

// newMetrics creates the collectors, registers them with reg (reusing those
// another Observer registered before) and creates the series of ops.
func newMetrics(reg prometheus.Registerer, namespace string, ops []string, limit int, log *zap.Logger) (*metrics, error) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	hopts := func(name, help string, buckets []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}
	}
	m := &metrics{limit: limit, log: log}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total",
		"Outcomes of idempotent calls looking up their key: hit (a stored result was replayed), miss (the action runs), in_flight (another caller held the key), not_replayable (the key completed but its result was not kept: the call got ErrNotReplayable).")),
		[]string{"operation", "outcome"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts(opts("errors_total",
		"Errors the idempotency coordinator reported, by error type.")),
		[]string{"operation", "error_type"})
	m.stored = prometheus.NewCounterVec(prometheus.CounterOpts(opts("stored_total",
		"Action results stored for replay.")),
		[]string{"operation"})
	m.unprotected = prometheus.NewCounterVec(prometheus.CounterOpts(opts("unprotected_total",
		"Actions run without idempotency protection: because the store failed, by the store method that failed, or because the request had no key (method none).")),
		[]string{"operation", "method"})
	m.wait = prometheus.NewHistogramVec(hopts("wait_duration_seconds",
		"Time callers waited for another caller's result, by how the wait ended.", waitBuckets),
		[]string{"operation", "outcome"})
	m.storage = prometheus.NewHistogramVec(hopts("storage_duration_seconds",
		"Duration of idempotency store calls, by store method and result.", storageBuckets),
		[]string{"method", "result"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts(opts("storage_refusals_total",
		"Failed store calls that were refusals, by reason: Redis refused the credentials (WRONGPASS, NOAUTH), denied a permission (NOPERM) or has no such database, or the module's circuit breaker was open. Each is also counted in errors_total under its storage error type.")),
		[]string{"operation", "reason"})
	m.bulk = prometheus.NewCounterVec(prometheus.CounterOpts(opts("bulk_keys_total",
		"Keys of batch calls (DoBatch) by outcome: hit (replayed), miss (run under the batch's reservation). Each is also counted in requests_total.")),
		[]string{"operation", "outcome"})

	fq := func(name string) string { return prometheus.BuildFQName(namespace, subsystem, name) }
	var registered []prometheus.Collector
	var err error
	for _, c := range []struct {
		vec  **prometheus.CounterVec
		name string
	}{
		{&m.requests, "requests_total"},
		{&m.errors, "errors_total"},
		{&m.stored, "stored_total"},
		{&m.unprotected, "unprotected_total"},
		{&m.refusals, "storage_refusals_total"},
		{&m.bulk, "bulk_keys_total"},
	} {
		if *c.vec, err = register(reg, *c.vec, fq(c.name), &registered); err != nil {
			break
		}
	}
	if err == nil {
		m.wait, err = register(reg, m.wait, fq("wait_duration_seconds"), &registered)
	}
	if err == nil {
		m.storage, err = register(reg, m.storage, fq("storage_duration_seconds"), &registered)
	}
	if err != nil {
		for _, c := range registered {
			reg.Unregister(c)
		}
		return nil, err
	}

	m.storageSeries = make(map[idemevent.Method]*[telemetry.NumResults]prometheus.Observer, len(idemevent.Methods()))
	for _, method := range idemevent.Methods() {
		var s [telemetry.NumResults]prometheus.Observer
		for r := range s {
			s[r] = m.storage.WithLabelValues(string(method), telemetry.Result(r).String())
		}
		m.storageSeries[method] = &s
	}

	known := make(map[string]*opSeries, len(ops))
	for _, op := range ops {
		if _, ok := known[op]; !ok {
			known[op] = m.newOpSeries(op)
		}
	}
	if m.limit < len(known) {
		m.limit = len(known)
	}
	m.ops.Store(&known)
	return m, nil
}

// register registers c with reg and appends it to registered. If reg holds an
// equal collector already (another Observer registered it), it returns that
// one instead, so that both count into the same series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, name string, registered *[]prometheus.Collector) (C, error) {
	err := reg.Register(c)
	if err == nil {
		*registered = append(*registered, c)
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
		return c, fmt.Errorf("observability: register %s: a %T is registered under that name", name, are.ExistingCollector)
	}
	return c, fmt.Errorf("observability: register %s: %w", name, err)
}

// newOpSeries creates the series of operation label value op at zero.
func (m *metrics) newOpSeries(op string) *opSeries {
	s := &opSeries{
		hit:           m.requests.WithLabelValues(op, outcomeHit),
		miss:          m.requests.WithLabelValues(op, outcomeMiss),
		inFlight:      m.requests.WithLabelValues(op, outcomeInFlight),
		notReplayable: m.requests.WithLabelValues(op, outcomeNotRepl),
		stored:        m.stored.WithLabelValues(op),
		bulkHit:       m.bulk.WithLabelValues(op, outcomeHit),
		bulkMiss:      m.bulk.WithLabelValues(op, outcomeMiss),
		errors:        make(map[idemevent.ErrorType]prometheus.Counter, len(idemevent.ErrorTypes())),
		unprotected:   make(map[idemevent.Method]prometheus.Counter, len(idemevent.Methods())+1),
		waits:         make(map[idemevent.WaitOutcome]prometheus.Observer, len(idemevent.WaitOutcomes())),
		op:            op,
	}
	for _, t := range idemevent.ErrorTypes() {
		s.errors[t] = m.errors.WithLabelValues(op, string(t))
	}
	for _, method := range append(idemevent.Methods(), idemevent.MethodNone) {
		s.unprotected[method] = m.unprotected.WithLabelValues(op, string(method))
	}
	for _, o := range idemevent.WaitOutcomes() {
		s.waits[o] = m.wait.WithLabelValues(op, string(o))
	}
	for i, r := range refusalReasons {
		s.refusals[i] = m.refusals.WithLabelValues(op, r)
	}
	return s
}

// series returns the series of operation op, creating them on first use
// within the operation limit.
func (m *metrics) series(op string) *opSeries {
	if s, ok := (*m.ops.Load())[op]; ok {
		return s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ops := *m.ops.Load()
	if s, ok := ops[op]; ok {
		return s
	}
	if coordinator.ValidateOperation(op) != nil {
		return m.otherSeries()
	}
	if len(ops) >= m.limit {
		if !m.warned {
			m.warned = true
			m.log.Warn("operation label limit reached; further operations are counted as "+OtherOperation,
				zap.Int("limit", m.limit), zap.String("operation", op))
		}
		return m.otherSeries()
	}
	s := m.newOpSeries(op)
	next := make(map[string]*opSeries, len(ops)+1)
	for k, v := range ops {
		next[k] = v
	}
	next[op] = s
	m.ops.Store(&next)
	return s
}

// otherSeries returns the OtherOperation series; m.mu is held.
func (m *metrics) otherSeries() *opSeries {
	if m.other == nil {
		m.other = m.newOpSeries(OtherOperation)
	}
	return m.other
}

// observe records e. It does not allocate on the paths the coordinator
// takes on every call.
func (m *metrics) observe(e idemevent.Event) {
	switch e.Kind {
	case idemevent.Hit:
		m.series(e.Key.Operation).hit.Inc()
	case idemevent.Miss:
		m.series(e.Key.Operation).miss.Inc()
	case idemevent.InFlight:
		m.series(e.Key.Operation).inFlight.Inc()
	case idemevent.NotReplayable:
		m.series(e.Key.Operation).notReplayable.Inc()
	case idemevent.Stored:
		m.series(e.Key.Operation).stored.Inc()
	case idemevent.BulkHit:
		m.series(e.Key.Operation).bulkHit.Add(float64(e.Count))
	case idemevent.BulkMiss:
		m.series(e.Key.Operation).bulkMiss.Add(float64(e.Count))
	case idemevent.Waited:
		s := m.series(e.Key.Operation)
		o, ok := s.waits[e.Outcome]
		if !ok {
			o = m.wait.WithLabelValues(s.op, unknownLabel)
		}
		o.Observe(seconds(e.Duration))
	case idemevent.Error:
		s := m.series(e.Key.Operation)
		c, ok := s.errors[e.ErrorType]
		if !ok {
			c = m.errors.WithLabelValues(s.op, unknownLabel)
		}
		c.Inc()
		if isStorageErrorType(e.ErrorType) {
			if r := refusalIndex(refusalOf(e.Err)); r >= 0 {
				s.refusals[r].Inc()
			}
		}
	case idemevent.Unprotected:
		s := m.series(e.Key.Operation)
		c, ok := s.unprotected[e.Method]
		if !ok {
			c = m.unprotected.WithLabelValues(s.op, unknownLabel)
		}
		c.Inc()
	case idemevent.StorageCall:
		r := telemetry.StorageResult(e.Err)
		if s, ok := m.storageSeries[e.Method]; ok {
			s[r].Observe(seconds(e.Duration))
		} else {
			m.storage.WithLabelValues(unknownLabel, r.String()).Observe(seconds(e.Duration))
		}
	}
}

// isStorageErrorType reports whether t is the error type of a failed store
// call: the events storage_refusals_total looks at.
func isStorageErrorType(t idemevent.ErrorType) bool {
	switch t {
	case idemevent.ErrorStorageGet, idemevent.ErrorStorageReserve,
		idemevent.ErrorStorageSave, idemevent.ErrorStorageRelease,
		idemevent.ErrorStorageRenew:
		return true
	}
	return false
}

// refusalIndex returns the index of reason in refusalReasons, or -1.
func refusalIndex(reason string) int {
	for i, r := range refusalReasons {
		if r == reason {
			return i
		}
	}
	return -1
}

func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}
