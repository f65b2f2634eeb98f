package idemwatermill

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idempotency/idemconsume"
)

// Deduplicator is a watermill handler middleware that runs a handler at
// most once per idempotency key, through an idemconsume.Processor, and
// marks a message as done only after its handler succeeded. Create one with
// New and add its Middleware to a router or a handler; it is safe for
// concurrent use.
type Deduplicator struct {
	p   *idemconsume.Processor
	cfg config
}

// New returns a Deduplicator that processes messages through p, which says
// how a message's key is derived (idemconsume.WithKey: by default its
// "idempotency-key" metadata field, else its UUID), how many deliveries it
// gets and how long its record is kept.
//
// New returns an error, and no Deduplicator, when p is nil or an option's
// value is refused (each as a *coordinator.OptionError).
func New(p *idemconsume.Processor, opts ...Option) (*Deduplicator, error) {
	if p == nil {
		return nil, errors.New("idemwatermill: processor is nil")
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idemwatermill: invalid options: %w", err)
	}
	return &Deduplicator{p: p, cfg: cfg}, nil
}

// Middleware wraps h, as a message.HandlerMiddleware, so that it runs at
// most once per idempotency key; pass it to Router.AddMiddleware or
// Handler.AddMiddleware. For each delivery it calls
// idemconsume.Processor.Process and returns what the router acts on:
//
//   - Ack (h ran and returned nil, or the key was done before: a
//     redelivery, or a producer's copy with the same key): a nil error, so
//     the router acknowledges the message. The messages h produced are
//     returned on the delivery that ran it; a replay returns none and does
//     not run h (see the package documentation).
//   - Retry (h returned an error or panicked, another consumer holds the
//     key, the store is down in mode "raise", the router stops): a
//     *DecisionError, so the router nacks the message and the broker
//     delivers it again. The key is not marked: the next delivery runs h.
//   - DeadLetter (an error matching idemconsume.ErrPermanent, the last
//     allowed delivery failed, no key, a reused key): a *DecisionError that
//     matches ErrDeadLetter, for middleware.PoisonQueueWithFilter and
//     IsDeadLetter.
//
// While h runs, msg.Context() is the coordinator's context of the run: it
// carries the reservation (coordinator.ReservationFromContext) and is
// canceled with cause coordinator.ErrLeaseLost when the reservation is
// lost. The message's own context is put back when h returns.
//
// Middleware panics when h is nil.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	if h == nil {
		panic("idemwatermill: Middleware: handler is nil")
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		orig := msg.Context()
		var produced []*message.Message
		dec := d.p.Process(orig, d.message(msg), func(ctx context.Context, _ idemconsume.Message) error {
			msg.SetContext(ctx)
			defer msg.SetContext(orig)
			out, err := h(msg)
			if err != nil {
				return err
			}
			produced = out
			return nil
		})
		for _, f := range d.cfg.onDecision {
			f(msg, dec)
		}
		if dec.Action == idemconsume.Ack {
			return produced, nil
		}
		return nil, &DecisionError{Decision: dec}
	}
}

// message is msg as idemconsume sees it: its UUID, its metadata as the
// fields the key function reads, its payload and its delivery count.
func (d *Deduplicator) message(msg *message.Message) idemconsume.Message {
	m := idemconsume.Message{ID: msg.UUID, Fields: msg.Metadata, Body: msg.Payload}
	if d.cfg.deliveries != nil {
		m.Deliveries = d.cfg.deliveries(msg)
	}
	return m
}
