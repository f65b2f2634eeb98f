package idemconsume

import (
	"fmt"
	"time"
)

// Action is what the broker adapter does with a message once it has been
// processed.
type Action uint8

// The actions. The zero Action is invalid: Process never returns it.
const (
	// Ack acknowledges (deletes) the message: its effect has happened, on
	// this delivery or an earlier one.
	Ack Action = iota + 1
	// Retry leaves the message to be delivered again later: it is not
	// acknowledged. Nothing is wrong with it (another consumer holds it, the
	// store is down, the consumer stops) or its handler failed and may
	// succeed on a later delivery.
	Retry
	// DeadLetter stops retrying the message: the adapter hands it to the
	// dead-letter destination, then acknowledges it.
	DeadLetter
)

// String returns "ack", "retry" or "dead_letter".
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead_letter"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Reason says why Process decided what it did: a small fixed set, fit for a
// metric label.
type Reason string

// The reasons, with the Action each goes with.
const (
	// ReasonProcessed (Ack): the handler ran under the key's reservation and
	// succeeded.
	ReasonProcessed Reason = "processed"
	// ReasonUnprotected (Ack): the handler ran and succeeded without a
	// reservation: the store failed and the coordinator's on-storage-error
	// mode is "run", or its kill switch is off. A concurrent or earlier
	// delivery may have run it too.
	ReasonUnprotected Reason = "unprotected"
	// ReasonDuplicate (Ack): the message was processed before (a redelivery,
	// or another copy with the same key); the handler did not run. That
	// includes a key whose record is not replayable
	// (coordinator.ErrNotReplayable): the effect happened, and a consumer
	// needs no result.
	ReasonDuplicate Reason = "duplicate"
	// ReasonInProgress (Retry): another consumer holds the key and runs the
	// handler now. Decision.RetryAfter says when its lease would end.
	ReasonInProgress Reason = "in_progress"
	// ReasonLeaseLost (Retry): the handler ran and failed, and its
	// reservation was lost (another consumer may have taken the key over):
	// its error is not trusted, even one that matches ErrPermanent, and the
	// message is never dead-lettered for it.
	ReasonLeaseLost Reason = "lease_lost"
	// ReasonStorage (Retry): the store failed before the handler ran and the
	// coordinator's on-storage-error mode is "raise", or the store answered
	// but refused the call (a conflict, a refusal: coordinator.ErrConflict,
	// ErrMisconfigured), in either mode; or the message was
	// delivered more than MaxDeliveries times and the store could not say
	// whether it was completed or is held by another consumer (the store
	// failed in mode "run", or the coordinator's in-flight mode is "run").
	// The handler did not run. Or the handler ran and succeeded, and a
	// transactional store (idempg) failed to commit its writes with the
	// key's record: the next delivery replays if the commit happened, and
	// runs the handler once if not.
	ReasonStorage Reason = "storage_error"
	// ReasonCanceled (Retry): the context ended (the consumer stops) before
	// or while the handler ran.
	ReasonCanceled Reason = "canceled"
	// ReasonHandlerError (Retry): the handler returned an error (or
	// panicked) on a delivery before the MaxDeliveries'th; the key was
	// released, so the next delivery runs it again.
	ReasonHandlerError Reason = "handler_error"
	// ReasonInvalidRequest (Retry): the coordinator refused the call for a
	// reason that is not the message's (a record TTL outside the
	// coordinator's bounds): the configuration needs fixing, and the message
	// waits for it.
	ReasonInvalidRequest Reason = "invalid_request"
	// ReasonPermanent (DeadLetter): the handler returned an error that
	// matches ErrPermanent.
	ReasonPermanent Reason = "permanent_error"
	// ReasonMaxDeliveries (DeadLetter): the handler failed on the
	// MaxDeliveries'th delivery, or the message was delivered more than
	// MaxDeliveries times, and the store says it is neither completed nor
	// held by another consumer (a handler that crashes its process every
	// time); in the second case the handler did not run.
	ReasonMaxDeliveries Reason = "max_deliveries"
	// ReasonBadMessage (DeadLetter): the key function or the fingerprint
	// function failed or panicked, or returned a key or fingerprint the
	// coordinator refuses.
	ReasonBadMessage Reason = "bad_message"
	// ReasonKeyReuse (DeadLetter): the key was used before for a message with
	// another fingerprint (see WithFingerprint).
	ReasonKeyReuse Reason = "key_reuse"
)

// Decision is what Process decided for one delivery.
type Decision struct {
	// Action is what the adapter does with the message.
	Action Action
	// Reason says why.
	Reason Reason
	// Key is the message's idempotency key; "" when it could not be
	// derived, or the coordinator is disabled.
	Key string
	// Err is the error behind a Retry or a DeadLetter: the handler's, the
	// coordinator's (a *coordinator.InProgressError, a
	// *coordinator.StorageError, ...) or the key function's. Nil for an Ack.
	Err error
	// RetryAfter is, for ReasonInProgress, when the holder's lease would run
	// out (coordinator.InProgressError.RetryAfter: an upper bound while the
	// holder lives). 0 otherwise: redeliver when the broker would.
	RetryAfter time.Duration
}

// String returns the action and the reason, e.g. "retry (in_progress)".
func (d Decision) String() string { return d.Action.String() + " (" + string(d.Reason) + ")" }

// Reasons returns every Reason that Process decides with, for metric labels.
func Reasons() []Reason {
	return []Reason{
		ReasonProcessed, ReasonUnprotected, ReasonDuplicate,
		ReasonInProgress, ReasonLeaseLost, ReasonStorage, ReasonCanceled, ReasonHandlerError, ReasonInvalidRequest,
		ReasonPermanent, ReasonMaxDeliveries, ReasonBadMessage, ReasonKeyReuse,
	}
}

// Action returns the Action that r goes with, as the constants' comments
// say; 0 for a Reason that is not one of Reasons.
func (r Reason) Action() Action {
	switch r {
	case ReasonProcessed, ReasonUnprotected, ReasonDuplicate:
		return Ack
	case ReasonInProgress, ReasonLeaseLost, ReasonStorage, ReasonCanceled, ReasonHandlerError, ReasonInvalidRequest:
		return Retry
	case ReasonPermanent, ReasonMaxDeliveries, ReasonBadMessage, ReasonKeyReuse:
		return DeadLetter
	}
	return 0
}
