package promcheck

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"

	"github.com/idemkit/idempotency/internal/unprotected"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/observability"
)

// Schema is what queries may refer to: the series names a registry exposes,
// the labels of each, the label values seen there, and the label values the
// library documents.
type Schema struct {
	// Series maps a series name as Prometheus stores it (a histogram's
	// name_bucket, name_sum, name_count) to its description.
	Series map[string]*Series
}

// Series describes one series name.
type Series struct {
	// Counter is true for a counter and for the cumulative series of a
	// histogram: rate() and increase() apply to them.
	Counter bool
	// Bucket is true for a histogram's _bucket series.
	Bucket bool
	// Labels maps each label name to the values seen in the registry.
	Labels map[string]map[string]bool
	// Recorded is true for a series a recording rule defines; its labels
	// are an upper bound.
	Recorded bool
}

// SchemaFromGatherer reads the series of g.
func SchemaFromGatherer(g prometheus.Gatherer) (*Schema, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("promcheck: gather: %w", err)
	}
	s := &Schema{Series: map[string]*Series{}}
	add := func(name string, counter, bucket bool, m *dto.Metric, extra ...string) {
		se := s.Series[name]
		if se == nil {
			se = &Series{Counter: counter, Bucket: bucket, Labels: map[string]map[string]bool{}}
			s.Series[name] = se
		}
		for _, lp := range m.GetLabel() {
			if se.Labels[lp.GetName()] == nil {
				se.Labels[lp.GetName()] = map[string]bool{}
			}
			se.Labels[lp.GetName()][lp.GetValue()] = true
		}
		for i := 0; i+1 < len(extra); i += 2 {
			if se.Labels[extra[i]] == nil {
				se.Labels[extra[i]] = map[string]bool{}
			}
			if extra[i+1] != "" {
				se.Labels[extra[i]][extra[i+1]] = true
			}
		}
	}
	for _, mf := range mfs {
		name := mf.GetName()
		var target []string
		for _, l := range TargetLabels {
			target = append(target, l, "")
		}
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, true, false, m, target...)
			case dto.MetricType_HISTOGRAM:
				add(name+"_count", true, false, m, target...)
				add(name+"_sum", true, false, m, target...)
				for _, b := range m.GetHistogram().GetBucket() {
					add(name+"_bucket", true, true, m, slices.Concat(target, []string{"le", formatLe(b.GetUpperBound())})...)
				}
				add(name+"_bucket", true, true, m, slices.Concat(target, []string{"le", "+Inf"})...)
			default:
				add(name, false, false, m, target...)
			}
		}
	}
	return s, nil
}

// TargetLabels are the labels Prometheus adds to every series it scrapes;
// queries may use them although no registry has them.
var TargetLabels = []string{"job", "instance"}

func formatLe(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// Operations are the operations LibrarySchema calls. Its observer's
// operation limit is their number, so that a call of a third operation is
// counted under observability.OtherOperation.
var Operations = []string{"payment.charge", "order.create"}

// ConsumerOperation and ConsumerCommands are the operation and the broker
// commands of the queue consumer whose metrics LibrarySchema registers (a
// sample of redisstream.Commands, which the mixin does not import: it would
// bring go-redis into its module graph).
var (
	ConsumerOperation = "billing.credit"
	ConsumerCommands  = []string{"xreadgroup", "xclaim", "xack", "xadd"}
)

// LibrarySchema runs a coordinator with an observer that registers its
// metrics, prefixed with namespace, on a new registry, drives calls through
// it until every metric has series (a miss and a stored result, a hit, a
// storage error with an unprotected run, a call without a key, an operation
// past the label limit), and returns the registry's schema.
func LibrarySchema(namespace string) (*Schema, error) {
	reg := prometheus.NewRegistry()
	obs, err := observability.New(
		observability.WithRegisterer(reg),
		observability.WithNamespace(namespace),
		observability.WithOperationLimit(len(Operations)),
	)
	if err != nil {
		return nil, err
	}
	store := faultstore.Wrap(memstore.New())
	c, err := coordinator.New(store, coordinator.WithObserver(obs), coordinator.WithOnStorageError(coordinator.OnStorageErrorRun))
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()

	ctx := context.Background()
	action := func(context.Context) (string, error) { return "done", nil }
	do := func(op, key string) error {
		_, err := coordinator.Do(ctx, c, coordinator.Call{Operation: op, Key: key}, action)
		return err
	}
	var errs []error
	errs = append(errs,
		do(Operations[0], "k-1"), // miss, stored
		do(Operations[0], "k-1"), // hit
	)
	store.FailOnce(idemevent.MethodReserve, errors.New("connection refused"))
	errs = append(errs,
		do(Operations[1], "k-2"),    // storage error, unprotected
		do("refund.process", "k-3"), // past the limit: ~other
	)
	unprotected.Report(c, ctx, Operations[1]) // no key: method none
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("promcheck: drive the coordinator: %w", err)
	}
	// A queue consumer's metrics, whose series exist from the start.
	if _, err := observability.NewConsumerObserver(ConsumerOperation, ConsumerCommands,
		observability.WithRegisterer(reg), observability.WithNamespace(namespace)); err != nil {
		return nil, err
	}
	return SchemaFromGatherer(reg)
}

// Names returns the series names of s, sorted.
func (s *Schema) Names() []string {
	names := make([]string, 0, len(s.Series))
	for n := range s.Series {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
