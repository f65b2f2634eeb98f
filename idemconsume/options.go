package idemconsume

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// DefaultMaxDeliveries is how many deliveries of a message whose handler
// keeps failing a Processor allows before it dead-letters the message
// (WithMaxDeliveries).
const DefaultMaxDeliveries = 5

// An Option configures a Processor; pass options to New. A nil Option is
// skipped; an invalid value makes New return an error, each refused option
// as a *coordinator.OptionError.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	key           KeyFunc
	fingerprint   func(Message) (string, error)
	maxDeliveries int64
	ttl           time.Duration
}

func defaultConfig() config {
	return config{key: KeyFromFieldOrID(DefaultKeyField), maxDeliveries: DefaultMaxDeliveries}
}

// WithKey sets how a message's idempotency key is derived. Default
// KeyFromFieldOrID(DefaultKeyField): the "idempotency-key" field, else the
// message ID. nil means the default.
func WithKey(f KeyFunc) Option { return optionFunc(func(c *config) { c.key = f }) }

// WithFingerprint sets a function that fingerprints a message's content
// (coordinator.Fingerprint of its fields, say), so that a key reused for a
// message with other content is dead-lettered (ReasonKeyReuse) instead of
// acknowledged as a duplicate of the first. Its error or panic, or a
// fingerprint the coordinator refuses (more than 512 bytes, or not visible
// ASCII: coordinator.ValidateFingerprint), dead-letters the message
// (ReasonBadMessage). Default nil: no fingerprint.
func WithFingerprint(f func(Message) (string, error)) Option {
	return optionFunc(func(c *config) { c.fingerprint = f })
}

// WithMaxDeliveries sets how many deliveries a message gets: a handler
// error on the n-th delivery dead-letters it (ReasonMaxDeliveries), and a
// message delivered more than n times is dead-lettered without running the
// handler, unless it was completed (then it is acknowledged), is in
// progress elsewhere, or the store cannot say (then it waits: Retry).
// Messages whose Deliveries is 0 (unknown) are never dead-lettered for
// their count. Default DefaultMaxDeliveries (5); at least 1.
func WithMaxDeliveries(n int) Option {
	return optionFunc(func(c *config) { c.maxDeliveries = int64(n) })
}

// WithTTL sets how long the record of a processed message is kept
// (coordinator.Call.TTL), unless the operator set a TTL for the operation
// (coordinator.WithOperationTTLs), which wins. A redelivery or a producer's
// copy that arrives after the record expired runs the handler again: make it
// longer than the broker can redeliver (a stream's pending entries stay until
// acknowledged) and than producers can publish the same message twice.
// Default 0: the coordinator's default TTL (1h). Not negative.
func WithTTL(d time.Duration) Option { return optionFunc(func(c *config) { c.ttl = d }) }

func (c *config) validate() error {
	var errs []error
	if c.key == nil {
		c.key = KeyFromFieldOrID(DefaultKeyField)
	}
	if c.maxDeliveries < 1 {
		errs = append(errs, &coordinator.OptionError{Option: "WithMaxDeliveries", Err: fmt.Errorf("must be at least 1, got %d", c.maxDeliveries)})
	}
	if c.ttl < 0 {
		errs = append(errs, &coordinator.OptionError{Option: "WithTTL", Err: fmt.Errorf("must not be negative, got %v", c.ttl)})
	}
	return errors.Join(errs...)
}
