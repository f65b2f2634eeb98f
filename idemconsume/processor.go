package idemconsume

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/idemkit/idempotency/coordinator"
)

// Processor processes messages at most once per idempotency key through a
// coordinator, and decides what the broker adapter does with each delivery.
// Create one with New; it is safe for concurrent use.
type Processor struct {
	c   *coordinator.Coordinator
	op  string
	cfg config
}

// New returns a Processor that runs handlers through c under operation.
// The operation names what the handler does ("billing.credit"): 1 to 100
// bytes of [A-Za-z0-9._-] (coordinator.ValidateOperation). Give every
// consumer group its own operation: two groups that consume the same stream
// under one operation would share records, and the second would take every
// message for a duplicate of the first's.
//
// New returns an error, and no Processor, when c is nil, the operation is
// invalid or an option's value is refused.
func New(c *coordinator.Coordinator, operation string, opts ...Option) (*Processor, error) {
	if c == nil {
		return nil, errors.New("idemconsume: coordinator is nil")
	}
	if err := coordinator.ValidateOperation(operation); err != nil {
		return nil, fmt.Errorf("idemconsume: operation: %w", err)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idemconsume: invalid options: %w", err)
	}
	return &Processor{c: c, op: operation, cfg: cfg}, nil
}

// Operation returns the operation under which the Processor keeps its
// records.
func (p *Processor) Operation() string { return p.op }

// MaxDeliveries returns how many deliveries a message gets before it is
// dead-lettered (WithMaxDeliveries).
func (p *Processor) MaxDeliveries() int64 { return p.cfg.maxDeliveries }

// Process runs handle for one delivery of msg at most once per idempotency
// key, and returns what to do with the delivery; it never fails otherwise.
// The adapter must act on the decision only after Process has returned: an
// acknowledgement after the effect is what makes a crash in between
// harmless (the redelivery finds the completed record and is acknowledged
// without a second effect).
//
//   - The handler succeeds, or ran before (a redelivery, a producer's copy
//     with the same key; also when the key's record is not replayable,
//     coordinator.ErrNotReplayable): Ack.
//   - Another consumer holds the key (the coordinator's in-flight mode
//     "raise", or the wait bound of mode "wait" passed): Retry, with
//     RetryAfter. The message is not acknowledged; it is not a failure.
//   - The store fails before the handler ran: Retry in on-storage-error mode
//     "raise" (the handler does not run); in mode "run" the handler runs
//     unprotected and its success is an Ack (ReasonUnprotected). A store
//     that answered but refused the call (a conflict, a refusal:
//     coordinator.ErrConflict, ErrMisconfigured) is not down: Retry in both
//     modes, without running the handler.
//   - The handler succeeds but a transactional store (idempg) fails to
//     commit its writes with the key's record: Retry (ReasonStorage); the
//     next delivery replays if the commit happened.
//   - The handler fails: the coordinator releases the key and the decision
//     is Retry, except for an error matching ErrPermanent, or a failure on
//     the MaxDeliveries'th delivery, which are DeadLetter. A handler that
//     panics is recovered and counts as failed (*PanicError).
//   - The context ends (the consumer stops): Retry.
//   - The message is delivered more than MaxDeliveries times: DeadLetter
//     without running the handler, unless it was completed (Ack), is in
//     progress (Retry), or the store cannot say, as when it is down in
//     on-storage-error mode "run" (Retry, ReasonStorage).
//   - No key can be derived, or the key was used for a message with another
//     fingerprint: DeadLetter.
//
// When the coordinator is disabled (its kill switch), handle just runs: no
// key is derived and nothing is stored.
//
// Process panics when handle is nil.
func (p *Processor) Process(ctx context.Context, msg Message, handle Handler) Decision {
	if handle == nil {
		panic("idemconsume: Process: handler is nil")
	}
	if !p.c.Enabled() {
		return p.unprotected(ctx, msg, handle)
	}
	call, d, ok := p.prepare(msg)
	if !ok {
		return d
	}
	var st delivery
	st.init(p, msg)
	_, err := coordinator.DoResult(ctx, p.c, call, func(actx context.Context) (struct{}, error) {
		return struct{}{}, st.act(actx, msg, handle)
	})
	return p.decide(ctx, msg, call.Key, err, &st)
}

// ProcessBatch is Process for a batch of deliveries, through
// coordinator.DoBatch: their keys are reserved or read at once, the
// handlers of the new ones run one after another in the order of msgs, and
// their records are completed together (see DoBatch for when each is
// stored), so that a batch of n new messages costs a few store round trips
// rather than 2n. It returns one Decision per delivery, in the order of
// msgs, each as Process would decide it; two deliveries with one key run
// the handler once, and the second is a ReasonDuplicate. The adapter must
// act on the decisions only after ProcessBatch has returned.
//
// ProcessBatch panics when handle is nil.
func (p *Processor) ProcessBatch(ctx context.Context, msgs []Message, handle Handler) []Decision {
	if handle == nil {
		panic("idemconsume: ProcessBatch: handler is nil")
	}
	return p.ProcessBatchIndexed(ctx, msgs, func(ctx context.Context, _ int, msg Message) error {
		return handle(ctx, msg)
	})
}

// IndexedHandler is a Handler that is also told which of a batch's
// deliveries it runs for: i is msg's position in the slice given to
// ProcessBatchIndexed.
type IndexedHandler func(ctx context.Context, i int, msg Message) error

// ProcessBatchIndexed is ProcessBatch with a handler that is given each
// delivery's position in msgs, for an adapter that keeps state per
// delivery beside the Message (its broker's own message, say) and cannot
// tell deliveries apart by their contents: IDs and keys may repeat in a
// batch. The handler is not called for the deliveries it does not run for
// (a replay, a bad key, one over the delivery limit).
//
// ProcessBatchIndexed panics when handle is nil.
func (p *Processor) ProcessBatchIndexed(ctx context.Context, msgs []Message, handle IndexedHandler) []Decision {
	if handle == nil {
		panic("idemconsume: ProcessBatchIndexed: handler is nil")
	}
	one := func(i int) Handler {
		return func(ctx context.Context, msg Message) error { return handle(ctx, i, msg) }
	}
	ds := make([]Decision, len(msgs))
	if !p.c.Enabled() {
		for i, msg := range msgs {
			ds[i] = p.unprotected(ctx, msg, one(i))
		}
		return ds
	}
	calls := make([]coordinator.Call, 0, len(msgs))
	at := make([]int, 0, len(msgs)) // at[j] is the delivery of calls[j]
	sts := make([]delivery, len(msgs))
	for i, msg := range msgs {
		call, d, ok := p.prepare(msg)
		if !ok {
			ds[i] = d
			continue
		}
		sts[i].init(p, msg)
		calls = append(calls, call)
		at = append(at, i)
	}
	_, errs := coordinator.DoBatch(ctx, p.c, calls, func(actx context.Context, j int) (struct{}, error) {
		i := at[j]
		return struct{}{}, sts[i].act(actx, msgs[i], one(i))
	})
	for j, i := range at {
		ds[i] = p.decide(ctx, msgs[i], calls[j].Key, errs[j], &sts[i])
	}
	return ds
}

// unprotected processes msg while the coordinator is disabled (its kill
// switch): handle just runs.
func (p *Processor) unprotected(ctx context.Context, msg Message, handle Handler) Decision {
	if msg.Deliveries > p.cfg.maxDeliveries {
		return Decision{Action: DeadLetter, Reason: ReasonMaxDeliveries, Err: p.overLimit(msg)}
	}
	if err := run(ctx, msg, handle); err != nil {
		return p.failed(ctx, msg, "", err, false)
	}
	return Decision{Action: Ack, Reason: ReasonUnprotected}
}

// prepare derives msg's call; it reports false, with the decision, for a
// message whose key or fingerprint cannot be derived.
func (p *Processor) prepare(msg Message) (coordinator.Call, Decision, bool) {
	key, err := guard(p.cfg.key, msg)
	if err == nil {
		err = coordinator.ValidateKey(key)
	}
	if err != nil {
		return coordinator.Call{}, Decision{Action: DeadLetter, Reason: ReasonBadMessage, Err: fmt.Errorf("idemconsume: key of message %q: %w", msg.ID, err)}, false
	}
	call := coordinator.Call{Operation: p.op, Key: key, TTL: p.cfg.ttl}
	if p.cfg.fingerprint != nil {
		fp, err := guard(p.cfg.fingerprint, msg)
		if err == nil {
			err = coordinator.ValidateFingerprint(fp)
		}
		if err != nil {
			return coordinator.Call{}, Decision{Action: DeadLetter, Reason: ReasonBadMessage, Key: key,
				Err: fmt.Errorf("idemconsume: fingerprint of message %q: %w", msg.ID, err)}, false
		}
		call.Fingerprint = fp
	}
	return call, Decision{}, true
}

// delivery is what the action of one delivery saw, read once the
// coordinator has returned (the action has returned by then).
type delivery struct {
	over                 bool  // delivered more than MaxDeliveries times
	limit                error // the error of over
	ran, protected, lost bool
	handled              bool // the handler ran and returned nil
}

func (st *delivery) init(p *Processor, msg Message) {
	st.over = msg.Deliveries > p.cfg.maxDeliveries
	if st.over {
		st.limit = p.overLimit(msg)
	}
}

// act is the coordinator's action for the delivery of msg.
func (st *delivery) act(actx context.Context, msg Message, handle Handler) error {
	_, st.protected = coordinator.ReservationFromContext(actx)
	if st.over {
		// The message may crash its consumer every time: do not run it.
		// Reaching here under a reservation means no completed record
		// and no other holder: dead-letter it, and let the coordinator
		// release the key. Without one (the store failed, mode "run")
		// nobody knows; see decide.
		return st.limit
	}
	st.ran = true
	herr := run(actx, msg, handle)
	st.handled = herr == nil
	st.lost = herr != nil && errors.Is(context.Cause(actx), coordinator.ErrLeaseLost)
	return herr
}

// decide turns the coordinator's answer for the delivery of msg into a
// Decision.
func (p *Processor) decide(ctx context.Context, msg Message, key string, err error, st *delivery) Decision {
	var inProgress *coordinator.InProgressError
	switch {
	case err == nil && st.ran && !st.protected:
		return Decision{Action: Ack, Reason: ReasonUnprotected, Key: key}
	case err == nil && st.ran:
		return Decision{Action: Ack, Reason: ReasonProcessed, Key: key}
	case err == nil:
		return Decision{Action: Ack, Reason: ReasonDuplicate, Key: key}
	case st.ran && st.handled:
		// The handler returned nil and the call failed after it: over a
		// transactional store (idempg) the commit of the handler's writes
		// and the key's record failed, rolled back or with its outcome
		// unknown. That is the store's failure, not the handler's, as the
		// HTTP adapters' 503 says: the message is delivered again, and the
		// next delivery replays if the commit happened and runs once if
		// not. A message whose commit keeps failing is still bounded:
		// past MaxDeliveries it is dead-lettered before its handler runs.
		return Decision{Action: Retry, Reason: ReasonStorage, Key: key, Err: err}
	case st.ran:
		return p.failed(ctx, msg, key, err, st.lost)
	case st.over && err == st.limit && !st.protected:
		// The store could not tell whether the message was processed, or is
		// being processed by another consumer now: dead-lettering it could
		// hand the dead-letter queue a message whose effect happened or is
		// happening. It waits for the store, without running the handler.
		return Decision{Action: Retry, Reason: ReasonStorage, Key: key,
			Err: fmt.Errorf("%w; the store cannot say whether it was processed, so it is left for a later delivery", st.limit)}
	case st.over && err == st.limit:
		return Decision{Action: DeadLetter, Reason: ReasonMaxDeliveries, Key: key, Err: st.limit}
	case errors.Is(err, coordinator.ErrNotReplayable):
		// The key's action completed, but its result was not kept (another
		// caller of the operation returned one too large, or the
		// coordinator's result limit is tiny): the effect happened, and a
		// consumer needs no result. Retrying or dead-lettering it would
		// hand on a message whose effect is done.
		return Decision{Action: Ack, Reason: ReasonDuplicate, Key: key}
	case errors.As(err, &inProgress):
		return Decision{Action: Retry, Reason: ReasonInProgress, Key: key, Err: err, RetryAfter: inProgress.RetryAfter}
	case errors.Is(err, coordinator.ErrInProgress):
		return Decision{Action: Retry, Reason: ReasonInProgress, Key: key, Err: err}
	case errors.Is(err, coordinator.ErrKeyReuse):
		return Decision{Action: DeadLetter, Reason: ReasonKeyReuse, Key: key, Err: err}
	case errors.Is(err, coordinator.ErrStorage):
		return Decision{Action: Retry, Reason: ReasonStorage, Key: key, Err: err}
	case errors.Is(err, coordinator.ErrInvalidRequest):
		return Decision{Action: Retry, Reason: ReasonInvalidRequest, Key: key, Err: err}
	case ctx.Err() != nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Decision{Action: Retry, Reason: ReasonCanceled, Key: key, Err: err}
	}
	// Do returns no other error; were a store to pass one through, the
	// message waits rather than being lost.
	return Decision{Action: Retry, Reason: ReasonStorage, Key: key, Err: err}
}

// failed decides for a delivery whose handler ran and returned err.
func (p *Processor) failed(ctx context.Context, msg Message, key string, err error, lost bool) Decision {
	d := Decision{Action: Retry, Key: key, Err: err}
	switch {
	case lost:
		// Another consumer may hold the key and run the message now: this
		// run's error, permanent or not, is not the message's last word,
		// and dead-lettering it would hand the dead-letter queue a message
		// that is being processed.
		d.Reason = ReasonLeaseLost
	case errors.Is(err, ErrPermanent):
		d.Action, d.Reason = DeadLetter, ReasonPermanent
	case ctx.Err() != nil:
		// The consumer stops: the handler was interrupted, not wrong.
		d.Reason = ReasonCanceled
	case msg.Deliveries >= p.cfg.maxDeliveries:
		d.Action, d.Reason = DeadLetter, ReasonMaxDeliveries
	default:
		d.Reason = ReasonHandlerError
	}
	return d
}

// overLimit returns the error of a message delivered more than
// MaxDeliveries times.
func (p *Processor) overLimit(msg Message) error {
	return fmt.Errorf("%w: message %q delivered %d times, at most %d allowed", ErrMaxDeliveries, msg.ID, msg.Deliveries, p.cfg.maxDeliveries)
}

// guard calls f, the key or the fingerprint function, turning a panic into
// a *PanicError: a message that makes it panic would otherwise crash every
// consumer it is delivered to, before the delivery limit could stop it.
func guard(f func(Message) (string, error), msg Message) (s string, err error) {
	defer func() {
		if v := recover(); v != nil {
			s, err = "", &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return f(msg)
}

// run calls handle, turning a panic into a *PanicError.
func run(ctx context.Context, msg Message, handle Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return handle(ctx, msg)
}
