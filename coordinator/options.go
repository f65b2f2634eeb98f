package coordinator

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of the options.
const (
	DefaultLease          = 30 * time.Second
	DefaultPollInterval   = 10 * time.Millisecond
	DefaultMaxPoll        = 500 * time.Millisecond
	DefaultStorageTimeout = time.Second
	DefaultTTL            = time.Hour
	DefaultMinTTL         = time.Second
	DefaultMaxTTL         = 30 * 24 * time.Hour
	DefaultMaxResultBytes = 1 << 20
)

// An Option configures a Coordinator; pass them to New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	enabled        bool
	inFlight       InFlightMode
	onStorageError StorageErrorMode
	lease          time.Duration
	renewInterval  time.Duration // 0: lease/3
	waitTimeout    time.Duration // 0: lease
	pollInterval   time.Duration
	storageTimeout time.Duration
	defaultTTL     time.Duration
	minTTL, maxTTL time.Duration
	operationTTLs  map[string]time.Duration
	maxResultBytes int
	observer       Observer
}

func defaultConfig() config {
	return config{
		enabled:        true,
		inFlight:       InFlightWait,
		onStorageError: StorageErrorRun,
		lease:          DefaultLease,
		pollInterval:   DefaultPollInterval,
		storageTimeout: DefaultStorageTimeout,
		defaultTTL:     DefaultTTL,
		minTTL:         DefaultMinTTL,
		maxTTL:         DefaultMaxTTL,
		maxResultBytes: DefaultMaxResultBytes,
		observer:       NopObserver{},
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
// action ran. Default StorageErrorRun; "" also means StorageErrorRun; New
// refuses any other value.
func WithOnStorageError(m StorageErrorMode) Option {
	return optionFunc(func(c *config) { c.onStorageError = m })
}

// WithLease sets the reservation's lease: how long a key stays reserved by a
// caller that stopped renewing it (crashed). Default 30s; at least 1ms;
// rounded down to the millisecond, as are the TTLs.
func WithLease(d time.Duration) Option { return optionFunc(func(c *config) { c.lease = d }) }

// WithRenewInterval sets how often a running action's lease is renewed.
// Default lease/3; must be shorter than the lease.
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
// requests. Default 1s.
func WithStorageTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.storageTimeout = d })
}

// WithDefaultTTL sets how long a completed record is kept when neither the
// Call nor WithOperationTTLs gives a TTL. Default 1h.
func WithDefaultTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.defaultTTL = d }) }

// WithTTLBounds sets the shortest and longest accepted record TTL; a Call
// whose TTL is outside them fails with ErrInvalidRequest. Defaults 1s and 720h
// (30 days).
func WithTTLBounds(min, max time.Duration) Option {
	return optionFunc(func(c *config) { c.minTTL, c.maxTTL = min, max })
}

// WithOperationTTLs sets per-operation record TTLs, used when the Call gives
// none. The map is copied.
func WithOperationTTLs(ttls map[string]time.Duration) Option {
	cp := make(map[string]time.Duration, len(ttls))
	for k, v := range ttls {
		cp[k] = v
	}
	return optionFunc(func(c *config) { c.operationTTLs = cp })
}

// WithMaxResultBytes sets the largest encoded result that is stored; a larger
// one is returned to its caller but not stored (reported as
// record_validation_error). Default 1 MiB.
func WithMaxResultBytes(n int) Option { return optionFunc(func(c *config) { c.maxResultBytes = n }) }

// WithObserver sets the Observer that receives the coordinator's events.
// Default NopObserver; nil also means NopObserver.
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.observer = o }) }

func (c *config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	var err error
	if c.inFlight, err = ParseInFlightMode(string(c.inFlight)); err != nil {
		errs = append(errs, err)
	}
	if c.onStorageError, err = ParseStorageErrorMode(string(c.onStorageError)); err != nil {
		errs = append(errs, err)
	}
	if c.observer == nil {
		c.observer = NopObserver{}
	}
	// Stores take whole milliseconds (Redis PEXPIRE).
	c.lease = c.lease.Truncate(time.Millisecond)
	c.defaultTTL = c.defaultTTL.Truncate(time.Millisecond)
	c.minTTL = c.minTTL.Truncate(time.Millisecond)
	c.maxTTL = c.maxTTL.Truncate(time.Millisecond)
	for op, ttl := range c.operationTTLs {
		c.operationTTLs[op] = ttl.Truncate(time.Millisecond)
	}
	if c.lease < time.Millisecond {
		bad("lease %v: must be at least 1ms", c.lease)
	}
	if c.renewInterval == 0 {
		c.renewInterval = c.lease / 3
	}
	if c.renewInterval <= 0 || c.renewInterval >= c.lease {
		bad("renew interval %v: must be positive and shorter than the lease %v", c.renewInterval, c.lease)
	}
	if c.waitTimeout == 0 {
		c.waitTimeout = c.lease
	}
	if c.waitTimeout < 0 {
		bad("wait timeout %v: must not be negative", c.waitTimeout)
	}
	if c.pollInterval <= 0 {
		bad("poll interval %v: must be positive", c.pollInterval)
	}
	if c.storageTimeout <= 0 {
		bad("storage timeout %v: must be positive", c.storageTimeout)
	}
	if c.minTTL < time.Millisecond {
		bad("min TTL %v: must be at least 1ms", c.minTTL)
	}
	if c.maxTTL < c.minTTL {
		bad("max TTL %v: must not be shorter than min TTL %v", c.maxTTL, c.minTTL)
	}
	if c.defaultTTL < c.minTTL || c.defaultTTL > c.maxTTL {
		bad("default TTL %v: must be within [%v, %v]", c.defaultTTL, c.minTTL, c.maxTTL)
	}
	for op, ttl := range c.operationTTLs {
		if err := ValidateOperation(op); err != nil {
			bad("operation TTL for %q: %v", op, err)
		}
		if ttl < c.minTTL || ttl > c.maxTTL {
			bad("operation TTL for %q: %v must be within [%v, %v]", op, ttl, c.minTTL, c.maxTTL)
		}
	}
	if c.maxResultBytes <= 0 {
		bad("max result bytes %d: must be positive", c.maxResultBytes)
	}
	if len(errs) > 0 {
		return fmt.Errorf("idempotency: invalid coordinator configuration: %w", errors.Join(errs...))
	}
	return nil
}
