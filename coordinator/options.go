package coordinator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
)

// watchdogMargin is how long before a lease could expire the watchdog
// cancels the action that holds it: a tenth of the lease, for the drift
// between this process's monotonic clock and Redis's, and for the time an
// action takes to notice that its context is cancelled.
func watchdogMargin(lease time.Duration) time.Duration { return lease / 10 }

// maxPoll is the longest interval between a waiter's reads, unless the poll
// interval itself is longer.
const maxPoll = 500 * time.Millisecond

// Defaults of the options.
const (
	DefaultLease          = 30 * time.Second
	DefaultPollInterval   = 10 * time.Millisecond
	DefaultStorageTimeout = time.Second
	DefaultTTL            = time.Hour
	DefaultMinTTL         = time.Second
	DefaultMaxTTL         = 30 * 24 * time.Hour
	DefaultMaxResultBytes = 1 << 20
)

// An Option configures a Coordinator; pass them to New. A nil Option is
// skipped; an invalid value makes New return an error (see OptionError).
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	enabled        bool
	inFlight       InFlightMode
	onStorageError OnStorageErrorMode
	lease          time.Duration
	renewInterval  time.Duration // 0: lease/3
	waitTimeout    time.Duration // 0: lease
	pollInterval   time.Duration
	storageTimeout time.Duration
	defaultTTL     time.Duration
	minTTL, maxTTL time.Duration
	operationTTLs  map[string]time.Duration
	fencedOps      []string        // as WithFencedOperations gave them
	fenced         map[string]bool // checked fencedOps; nil: none is fenced
	maxResultBytes int
	observer       idemevent.Observer
}

func defaultConfig() config {
	return config{
		enabled:        true,
		inFlight:       InFlightWait,
		onStorageError: OnStorageErrorRun,
		lease:          DefaultLease,
		pollInterval:   DefaultPollInterval,
		storageTimeout: DefaultStorageTimeout,
		defaultTTL:     DefaultTTL,
		minTTL:         DefaultMinTTL,
		maxTTL:         DefaultMaxTTL,
		maxResultBytes: DefaultMaxResultBytes,
		observer:       idemevent.NopObserver{},
	}
}

// WithEnabled sets the kill switch: with false every call just runs the
// action, and nothing is read, written or reported. Default true.
func WithEnabled(enabled bool) Option { return optionFunc(func(c *config) { c.enabled = enabled }) }

// WithInFlight sets what a second caller does while the first holds the key.
// Default InFlightWait; "" also means InFlightWait; New refuses any other
// value.
func WithInFlight(m InFlightMode) Option { return optionFunc(func(c *config) { c.inFlight = m }) }

// WithOnStorageError sets what a call does when the store fails before the
// action ran. Default OnStorageErrorRun; "" also means OnStorageErrorRun; New
// refuses any other value.
func WithOnStorageError(m OnStorageErrorMode) Option {
	return optionFunc(func(c *config) { c.onStorageError = m })
}

// WithLease sets the reservation's lease: how long a key stays reserved by a
// caller that stopped renewing it (crashed). Default 30s; at least 1ms;
// rounded down to the millisecond, as are the TTLs.
func WithLease(d time.Duration) Option { return optionFunc(func(c *config) { c.lease = d }) }

// WithRenewInterval sets how often a running action's lease is renewed.
// Default 0, meaning lease/3; must not be negative, and must be shorter than
// the lease (as rounded down to the millisecond).
func WithRenewInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.renewInterval = d })
}

// WithWaitTimeout bounds how long a caller in mode "wait" waits for another
// caller's result before ErrInProgress; it never waits past its context's
// deadline. Default: one lease.
func WithWaitTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.waitTimeout = d })
}

// WithPollInterval sets the first interval between a waiter's reads; it
// doubles after each read, up to 500ms (or the interval itself when larger).
// Default 10ms.
func WithPollInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pollInterval = d })
}

// WithStorageTimeout bounds every store call, so a hung store cannot hang
// requests. Default 1s. A call whose context cannot be cancelled shares the
// deadline of the calls that start in the same tick (a thousandth of d, at
// least 1ms), so it may run up to one tick longer than d.
func WithStorageTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.storageTimeout = d })
}

// WithDefaultTTL sets how long a completed record is kept when neither the
// Call nor WithOperationTTLs gives a TTL. Default 1h; within the TTL bounds
// (WithMinTTL, WithMaxTTL).
func WithDefaultTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.defaultTTL = d }) }

// WithMinTTL sets the shortest accepted record TTL; a Call whose TTL is
// shorter fails with ErrInvalidRequest. Default 1s; at least 1ms; rounded
// down to the millisecond.
func WithMinTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.minTTL = d }) }

// WithMaxTTL sets the longest accepted record TTL; a Call whose TTL is longer
// fails with ErrInvalidRequest. Default 720h (30 days); not shorter than the
// shortest TTL; rounded down to the millisecond.
func WithMaxTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.maxTTL = d }) }

// WithOperationTTLs sets per-operation record TTLs, which win over a Call's
// own TTL, so that an operator can change one written in code. The map is
// copied. Each operation must be valid (ValidateOperation)
// and each TTL within the TTL bounds.
func WithOperationTTLs(ttls map[string]time.Duration) Option {
	cp := make(map[string]time.Duration, len(ttls))
	for k, v := range ttls {
		cp[k] = v
	}
	return optionFunc(func(c *config) { c.operationTTLs = cp })
}

// WithFencedOperations gives every reservation of these operations a fence
// (Reservation.Fence), which a downstream write can check to refuse a
// holder whose lease has passed to another caller. The store must implement
// idemstore.Fencer (New refuses it otherwise), and each operation must be valid
// (ValidateOperation). A fenced reservation still takes one round trip;
// other operations pay nothing. Only a reservation has a fence: in in-flight
// mode "run" and in an unprotected run the action gets none.
func WithFencedOperations(operations ...string) Option {
	ops := slices.Clone(operations)
	return optionFunc(func(c *config) { c.fencedOps = ops })
}

// WithMaxResultBytes sets the largest encoded result that is stored; a larger
// one is returned to its caller, and the key is kept as not replayable
// (reported as record_validation_error; later calls get ErrNotReplayable).
// Default 1 MiB.
func WithMaxResultBytes(n int) Option { return optionFunc(func(c *config) { c.maxResultBytes = n }) }

// WithObserver sets the idemevent.Observer that receives the coordinator's events.
// Default idemevent.NopObserver; nil also means it.
func WithObserver(o idemevent.Observer) Option { return optionFunc(func(c *config) { c.observer = o }) }

// OptionError is an option value that a constructor refuses, in this package
// and in every adapter (docs/user-guide.md, "Options"); all refusals come at
// once, joined with errors.Join. Err names any option it depends on by name
// ("must be shorter than WithLease (30s)"), so that the fx module can name
// the environment variables instead.
type OptionError struct {
	// Option is the name of the option that set the refused value, e.g.
	// "WithLease".
	Option string
	// Err says what is wrong with the value.
	Err error
}

// Error implements error: "WithLease: must be at least 1ms, got 0s".
func (e *OptionError) Error() string { return e.Option + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *OptionError) Unwrap() error { return e.Err }

// ValidateOptions returns the error New would return for opts, without a
// store: nil when New accepts them.
func ValidateOptions(opts ...Option) error {
	_, err := newConfig(opts)
	return err
}

// newConfig applies opts over the defaults, fills in the defaults that depend
// on other values, and checks the result: every rule on an option's value
// lives here.
func newConfig(opts []Option) (config, error) {
	c := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, &OptionError{Option: option, Err: fmt.Errorf(format, args...)})
	}
	var err error
	if c.inFlight, err = c.inFlight.parse(); err != nil {
		errs = append(errs, &OptionError{Option: "WithInFlight", Err: err})
	}
	if c.onStorageError, err = c.onStorageError.parse(); err != nil {
		errs = append(errs, &OptionError{Option: "WithOnStorageError", Err: err})
	}
	if c.observer == nil {
		c.observer = idemevent.NopObserver{}
	}
	// Stores take whole milliseconds (Redis PEXPIRE): every duration that
	// reaches a store is rounded down first, and checked as rounded.
	ms := func(d time.Duration) time.Duration { return d.Truncate(time.Millisecond) }
	rounded := func(given, got time.Duration) string {
		if given == got {
			return given.String()
		}
		return fmt.Sprintf("%v, rounded down from %v", got, given)
	}
	lease := c.lease
	c.lease = ms(lease)
	if c.lease < time.Millisecond {
		bad("WithLease", "must be at least 1ms, got %v", lease)
	}
	switch {
	case c.renewInterval < 0:
		bad("WithRenewInterval", "must not be negative (0s means a third of the lease), got %v", c.renewInterval)
	case c.renewInterval == 0:
		c.renewInterval = c.lease / 3
	case c.renewInterval >= c.lease && c.lease >= time.Millisecond:
		bad("WithRenewInterval", "must be shorter than WithLease (%s), got %v", rounded(lease, c.lease), c.renewInterval)
	}
	switch {
	case c.waitTimeout < 0:
		bad("WithWaitTimeout", "must not be negative (0s means one lease), got %v", c.waitTimeout)
	case c.waitTimeout == 0:
		c.waitTimeout = c.lease
	}
	if c.pollInterval <= 0 {
		bad("WithPollInterval", "must be positive, got %v", c.pollInterval)
	}
	if c.storageTimeout <= 0 {
		bad("WithStorageTimeout", "must be positive, got %v", c.storageTimeout)
	}
	if c.lease >= time.Millisecond && c.renewInterval > 0 && c.renewInterval < c.lease && c.storageTimeout > 0 &&
		c.renewInterval+c.storageTimeout >= c.lease-watchdogMargin(c.lease) {
		// The watchdog cancels an action whose renewal has not been confirmed
		// for the lease minus its margin: one renewal that takes its whole
		// timeout must end before that.
		least := (c.renewInterval + c.storageTimeout) * 10 / 9
		bad("WithLease", "must be longer than WithRenewInterval (%v) plus WithStorageTimeout (%v) plus a tenth of itself "+
			"(the watchdog's margin), so that one slow renewal cannot lose it: more than %v, got %s",
			c.renewInterval, c.storageTimeout, least.Truncate(time.Millisecond), rounded(lease, c.lease))
	}
	minTTL, maxTTL, defaultTTL := c.minTTL, c.maxTTL, c.defaultTTL
	c.minTTL, c.maxTTL, c.defaultTTL = ms(minTTL), ms(maxTTL), ms(defaultTTL)
	bounds := fmt.Sprintf("WithMinTTL and WithMaxTTL [%v, %v]", c.minTTL, c.maxTTL)
	if c.minTTL < time.Millisecond {
		bad("WithMinTTL", "must be at least 1ms, got %v", minTTL)
	}
	if c.maxTTL < c.minTTL {
		bad("WithMaxTTL", "must not be shorter than WithMinTTL (%v), got %v", c.minTTL, maxTTL)
	}
	if c.defaultTTL < c.minTTL || c.defaultTTL > c.maxTTL {
		bad("WithDefaultTTL", "must be within %s, got %v", bounds, defaultTTL)
	}
	// A fresh map: the option's own may be applied by several New calls.
	opTTLs := make(map[string]time.Duration, len(c.operationTTLs))
	for _, op := range slices.Sorted(maps.Keys(c.operationTTLs)) {
		ttl := c.operationTTLs[op]
		if detail := operationProblem(op); detail != "" {
			bad("WithOperationTTLs", "%s", detail)
		}
		if opTTLs[op] = ms(ttl); opTTLs[op] < c.minTTL || opTTLs[op] > c.maxTTL {
			bad("WithOperationTTLs", "operation %q: TTL %v is not within %s", op, ttl, bounds)
		}
	}
	c.operationTTLs = opTTLs
	c.fenced = nil
	for _, op := range c.fencedOps {
		if detail := operationProblem(op); detail != "" {
			bad("WithFencedOperations", "%s", detail)
			continue
		}
		if c.fenced == nil {
			c.fenced = make(map[string]bool, len(c.fencedOps))
		}
		c.fenced[op] = true
	}
	if c.maxResultBytes <= 0 {
		bad("WithMaxResultBytes", "must be positive, got %d", c.maxResultBytes)
	}
	if len(errs) > 0 {
		return config{}, fmt.Errorf("idempotency: invalid coordinator configuration: %w", errors.Join(errs...))
	}
	return c, nil
}

// operationProblem says what is wrong with an operation an option names,
// naming it, or returns "" for a valid one.
func operationProblem(op string) string {
	err := ValidateOperation(op)
	if err == nil {
		return ""
	}
	detail := reason(err)
	if !strings.Contains(detail, strconv.Quote(op)) {
		detail = fmt.Sprintf("operation %q: %s", op, detail)
	}
	return detail
}
