package observability

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/metricname"
)

// Observer turns the coordinator's events into Prometheus metrics and zap log
// lines. Create one with New and pass it to coordinator.WithObserver; it is
// safe for concurrent use. The zero value and a nil *Observer discard every
// event.
type Observer struct {
	metrics *metrics // nil: no registerer
	log     *eventLogger
}

var _ idemevent.Observer = (*Observer)(nil)

// New returns an Observer configured by opts. Without WithRegisterer it
// records no metrics; without WithLogger it logs nothing.
//
// The metrics are registered with the registerer at once. A metric that an
// earlier Observer registered on the same registerer (another fx app in the
// same process, say) is not an error: the new Observer counts into the
// registered collector. New returns an error when opts are invalid (a bad
// namespace, operation name, key logging mode or operation limit) or when a
// metric cannot be registered, e.g. because a different collector holds its
// name; it then leaves the registerer as it found it.
func New(opts ...Option) (*Observer, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	log := c.logger.Named(subsystem)
	o := &Observer{log: &eventLogger{log: log, keys: c.logKeys}}
	if c.registerer != nil {
		m, err := newMetrics(c.registerer, c.namespace, c.operations, c.operationLimit, log)
		if err != nil {
			return nil, err
		}
		o.metrics = m
	}
	return o, nil
}

// ValidateOptions returns the error New would return for opts before it
// registers anything: nil when their values are accepted. As with
// coordinator.New, each refused option is a *coordinator.OptionError, all of
// them joined.
func ValidateOptions(opts ...Option) error {
	_, err := newConfig(opts)
	return err
}

// newConfig applies opts over the defaults and checks the result: every rule
// on an option's value lives here.
func newConfig(opts []Option) (config, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.logger == nil {
		c.logger = zap.NewNop()
	}
	var errs []error
	bad := func(option string, err error) {
		errs = append(errs, &coordinator.OptionError{Option: option, Err: err})
	}
	var err error
	if c.logKeys, err = c.logKeys.parse(); err != nil {
		bad("WithLogKeys", err)
	}
	if err := metricname.CheckNamespace(c.namespace); err != nil {
		bad("WithNamespace", err)
	}
	if c.operationLimit < 1 {
		bad("WithOperationLimit", fmt.Errorf("must be at least 1, got %d", c.operationLimit))
	}
	for _, op := range c.operations {
		if err := coordinator.ValidateOperation(op); err != nil {
			if ir := (*coordinator.InvalidRequestError)(nil); errors.As(err, &ir) {
				err = errors.New(ir.Reason)
			}
			bad("WithOperations", err)
		}
	}
	if len(errs) > 0 {
		return config{}, fmt.Errorf("observability: invalid options: %w", errors.Join(errs...))
	}
	return c, nil
}

// Observe records e as metrics and writes it as a log line. The coordinator
// calls it on the caller's goroutine; recording the metrics does not allocate
// once an operation's series exist, and a log line is only built when its
// level is enabled.
func (o *Observer) Observe(ctx context.Context, e idemevent.Event) {
	if o == nil {
		return
	}
	if o.metrics != nil {
		o.metrics.observe(e)
	}
	if o.log != nil {
		o.log.logEvent(e)
	}
}

// Multi returns an Observer that passes every event to each of observers in
// turn. Nil observers and idemevent.NopObserver values are dropped; with
// none left it returns idemevent.NopObserver{}, with one that one.
func Multi(observers ...idemevent.Observer) idemevent.Observer {
	var list multi
	for _, o := range observers {
		switch o := o.(type) {
		case nil, idemevent.NopObserver, *idemevent.NopObserver:
			continue
		case multi:
			list = append(list, o...)
		default:
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return idemevent.NopObserver{}
	case 1:
		return list[0]
	}
	return list
}

type multi []idemevent.Observer

func (m multi) Observe(ctx context.Context, e idemevent.Event) {
	for _, o := range m {
		o.Observe(ctx, e)
	}
}
