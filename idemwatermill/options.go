package idemwatermill

import (
	"errors"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconsume"
)

// An Option configures a Deduplicator; pass options to New. A nil Option is
// skipped; an invalid value makes New return an error, each refused option
// as a *coordinator.OptionError.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	deliveries func(*message.Message) int64
	// deliveriesField is the metadata field of WithDeliveriesFromMetadata,
	// kept to validate it.
	deliveriesField *string
	onDecision      []func(*message.Message, idemconsume.Decision)
}

// WithDeliveries sets how the middleware reads how many times the broker has
// delivered a message, this delivery included (idemconsume.Message's
// Deliveries): a JetStream message's NumDelivered, an SQS
// ApproximateReceiveCount. Watermill's message carries no such count, so
// each broker's subscriber has its own way to expose it (a metadata field
// set by its unmarshaler, say). f returns 0 when it cannot say. Default nil:
// every delivery counts as 0, unknown, so a message is never dead-lettered
// for its deliveries, only for a permanent error (idemconsume.WithMaxDeliveries
// then has no effect). The last of WithDeliveries and
// WithDeliveriesFromMetadata wins.
func WithDeliveries(f func(*message.Message) int64) Option {
	return optionFunc(func(c *config) { c.deliveries, c.deliveriesField = f, nil })
}

// WithDeliveriesFromMetadata reads a message's delivery count from its
// metadata field name, as a decimal integer; a message without the field, or
// with a value that is not a positive integer, counts as 0 (unknown). The
// name must not be empty. See WithDeliveries.
func WithDeliveriesFromMetadata(name string) Option {
	return optionFunc(func(c *config) {
		c.deliveriesField = &name
		c.deliveries = func(msg *message.Message) int64 {
			n, err := strconv.ParseInt(msg.Metadata.Get(name), 10, 64)
			if err != nil || n < 0 {
				return 0
			}
			return n
		}
	})
}

// WithOnDecision adds a function called with every delivery's decision,
// once the handler (if it ran) has returned and before the middleware
// returns to the router: for logs and metrics. It runs on the handler's
// goroutine; it must not keep msg. Calls add up; a nil f is skipped.
func WithOnDecision(f func(msg *message.Message, d idemconsume.Decision)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onDecision = append(c.onDecision, f)
		}
	})
}

func (c *config) validate() error {
	var errs []error
	if c.deliveriesField != nil && *c.deliveriesField == "" {
		errs = append(errs, &coordinator.OptionError{Option: "WithDeliveriesFromMetadata", Err: errors.New("the metadata field name must not be empty")})
	}
	return errors.Join(errs...)
}
