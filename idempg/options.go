package idempg

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// An Option configures a Store; pass options to New. A nil Option is
// skipped; an invalid value makes New return an error. Every option is a
// setting of the transactional call (Do, DoResult, DoWithCodec) and means
// what the coordinator option of the same name means; the plain Store
// methods, which a coordinator.Coordinator calls with its own settings, use
// none of them.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	inFlight       coordinator.InFlightMode
	waitTimeout    time.Duration
	pollInterval   time.Duration
	defaultTTL     time.Duration
	minTTL, maxTTL time.Duration
	operationTTLs  map[string]time.Duration
	maxResultBytes int
}

func defaultConfig() config {
	return config{
		inFlight:       coordinator.InFlightWait,
		waitTimeout:    coordinator.DefaultLease,
		pollInterval:   coordinator.DefaultPollInterval,
		defaultTTL:     coordinator.DefaultTTL,
		minTTL:         coordinator.DefaultMinTTL,
		maxTTL:         coordinator.DefaultMaxTTL,
		maxResultBytes: coordinator.DefaultMaxResultBytes,
	}
}

// WithInFlight sets what Do does while another caller holds the key:
// coordinator.InFlightWait (the default; "" also means it) waits for the
// holder's transaction, and coordinator.InFlightRaise returns ErrInProgress
// at once. New refuses coordinator.InFlightRun: the transactional call
// always holds its key, since that is what makes it exactly once.
func WithInFlight(m coordinator.InFlightMode) Option {
	return optionFunc(func(c *config) { c.inFlight = m })
}

// WithWaitTimeout bounds how long Do waits, in mode wait, for another
// caller's transaction or reservation before it returns ErrInProgress; it
// never waits past its context's deadline. Default coordinator.DefaultLease
// (30s), the coordinator's default; at least 1ms.
func WithWaitTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.waitTimeout = d })
}

// WithPollInterval sets the first interval between Do's reads while it
// waits for a reservation that a coordinator.Coordinator holds (a committed
// pending record); it doubles after each read, up to 500ms. A transaction of
// Do is waited for on its row lock, not by polling. Default
// coordinator.DefaultPollInterval (10ms).
func WithPollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pollInterval = d })
}

// WithDefaultTTL sets how long Do keeps a result when neither the Call nor
// WithOperationTTLs gives a TTL. Default coordinator.DefaultTTL (1h); within
// the TTL bounds.
func WithDefaultTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.defaultTTL = d })
}

// WithMinTTL sets the shortest record TTL Do accepts; a Call whose TTL is
// shorter fails with ErrInvalidRequest. Default coordinator.DefaultMinTTL
// (1s); at least 1ms.
func WithMinTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.minTTL = d }) }

// WithMaxTTL sets the longest record TTL Do accepts; a Call whose TTL is
// longer fails with ErrInvalidRequest. Default coordinator.DefaultMaxTTL (30
// days); not shorter than the shortest.
func WithMaxTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.maxTTL = d }) }

// WithOperationTTLs sets per-operation record TTLs for Do, which win over
// the Call's TTL, as the operator's do in the coordinator. The map is copied;
// each operation must be valid and each TTL within the bounds.
func WithOperationTTLs(ttls map[string]time.Duration) Option {
	cp := maps.Clone(ttls)
	return optionFunc(func(c *config) { c.operationTTLs = cp })
}

// WithMaxResultBytes sets the largest encoded result Do stores; a larger
// one is returned to its caller and the key is kept as not replayable, in
// the same transaction as the action's writes. Default
// coordinator.DefaultMaxResultBytes (1 MiB).
func WithMaxResultBytes(n int) Option {
	return optionFunc(func(c *config) { c.maxResultBytes = n })
}

// newConfig applies opts over the defaults and checks the result, naming
// every refused option in a *coordinator.OptionError.
func newConfig(opts []Option) (config, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, &coordinator.OptionError{Option: option, Err: fmt.Errorf(format, args...)})
	}
	switch c.inFlight {
	case "":
		c.inFlight = coordinator.InFlightWait
	case coordinator.InFlightWait, coordinator.InFlightRaise:
	case coordinator.InFlightRun:
		bad("WithInFlight", "mode run is not supported: the transactional call always holds its key (accepted values: wait, raise)")
	default:
		bad("WithInFlight", "unknown in-flight mode %q: accepted values are wait, raise", string(c.inFlight))
	}
	ms := func(d time.Duration) time.Duration { return d.Truncate(time.Millisecond) }
	if c.waitTimeout = ms(c.waitTimeout); c.waitTimeout < time.Millisecond {
		bad("WithWaitTimeout", "must be at least 1ms, got %v", c.waitTimeout)
	}
	if c.pollInterval <= 0 {
		bad("WithPollInterval", "must be positive, got %v", c.pollInterval)
	}
	c.minTTL, c.maxTTL, c.defaultTTL = ms(c.minTTL), ms(c.maxTTL), ms(c.defaultTTL)
	if c.minTTL < time.Millisecond {
		bad("WithMinTTL", "must be at least 1ms, got %v", c.minTTL)
	}
	if c.maxTTL < c.minTTL {
		bad("WithMaxTTL", "must not be shorter than WithMinTTL (%v), got %v", c.minTTL, c.maxTTL)
	}
	bounds := fmt.Sprintf("WithMinTTL and WithMaxTTL [%v, %v]", c.minTTL, c.maxTTL)
	if c.defaultTTL < c.minTTL || c.defaultTTL > c.maxTTL {
		bad("WithDefaultTTL", "must be within %s, got %v", bounds, c.defaultTTL)
	}
	ttls := make(map[string]time.Duration, len(c.operationTTLs))
	for _, op := range slices.Sorted(maps.Keys(c.operationTTLs)) {
		if err := coordinator.ValidateOperation(op); err != nil {
			bad("WithOperationTTLs", "operation %q: %v", op, err)
		}
		if ttls[op] = ms(c.operationTTLs[op]); ttls[op] < c.minTTL || ttls[op] > c.maxTTL {
			bad("WithOperationTTLs", "operation %q: TTL %v is not within %s", op, c.operationTTLs[op], bounds)
		}
	}
	c.operationTTLs = ttls
	if c.maxResultBytes <= 0 {
		bad("WithMaxResultBytes", "must be positive, got %d", c.maxResultBytes)
	}
	if len(errs) > 0 {
		return config{}, fmt.Errorf("idempg: invalid configuration: %w", errors.Join(errs...))
	}
	return c, nil
}
