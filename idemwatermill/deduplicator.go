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
		r := d.run(msg, h)
		dec := d.p.Process(msg.Context(), d.message(msg), r.handle)
		return r.decided(dec)
	}
}

// HandleBatch is Middleware for a batch of deliveries that the caller
// collected (from a subscriber's channel, a broker's batch read): it
// processes them together (idemconsume.Processor.ProcessBatch, their keys
// reserved or read in one store round trip, their records completed
// together), running h for the new ones one after another in order. It
// returns, for each of msgs, what Middleware's handler would: the messages h
// produced and nil, so that the caller acknowledges the delivery and
// publishes them; or a *DecisionError, so that it nacks it (or, matching
// ErrDeadLetter, dead-letters it). The caller acts on them only after
// HandleBatch has returned. h runs on each delivery's own message, also when
// deliveries share a UUID. While h runs, msg.Context() is the
// coordinator's context of the run, as in Middleware; the messages'
// contexts are not canceled by one another, and ProcessBatch's own context
// is that of msgs[0].
//
// HandleBatch panics when h is nil.
func (d *Deduplicator) HandleBatch(msgs []*message.Message, h message.HandlerFunc) (produced [][]*message.Message, errs []error) {
	if h == nil {
		panic("idemwatermill: HandleBatch: handler is nil")
	}
	produced, errs = make([][]*message.Message, len(msgs)), make([]error, len(msgs))
	if len(msgs) == 0 {
		return produced, errs
	}
	runs := make([]*run, len(msgs))
	in := make([]idemconsume.Message, len(msgs))
	for i, msg := range msgs {
		runs[i] = d.run(msg, h)
		in[i] = d.message(msg)
	}
	// The handler finds its delivery by position: not by UUID, which
	// repeats (Watermill's NATS unmarshalers leave it empty for messages
	// from other publishers), nor by counting calls, as the deliveries it
	// does not run for (a replay, a bad key, one over the delivery limit)
	// get none.
	decs := d.p.ProcessBatchIndexed(msgs[0].Context(), in, func(ctx context.Context, i int, m idemconsume.Message) error {
		return runs[i].handle(ctx, m)
	})
	for i, dec := range decs {
		produced[i], errs[i] = runs[i].decided(dec)
	}
	return produced, errs
}

// run is one delivery of msg to h: what h produced, and the hooks.
type run struct {
	d        *Deduplicator
	msg      *message.Message
	h        message.HandlerFunc
	produced []*message.Message
}

func (d *Deduplicator) run(msg *message.Message, h message.HandlerFunc) *run {
	return &run{d: d, msg: msg, h: h}
}

// handle is the idemconsume handler of the delivery: h, with msg's context
// the run's while it runs.
func (r *run) handle(ctx context.Context, _ idemconsume.Message) error {
	orig := r.msg.Context()
	r.msg.SetContext(ctx)
	defer r.msg.SetContext(orig)
	out, err := r.h(r.msg)
	if err != nil {
		return err
	}
	r.produced = out
	return nil
}

// decided reports dec to the hooks and returns what the router acts on.
func (r *run) decided(dec idemconsume.Decision) ([]*message.Message, error) {
	for _, f := range r.d.cfg.onDecision {
		f(r.msg, dec)
	}
	if dec.Action == idemconsume.Ack {
		return r.produced, nil
	}
	return nil, &DecisionError{Decision: dec}
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
