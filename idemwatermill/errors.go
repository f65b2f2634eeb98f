package idemwatermill

import (
	"errors"

	"github.com/idemkit/idempotency/idemconsume"
)

// ErrDeadLetter matches (errors.Is) the error that the middleware returns
// for a message that idemconsume dead-letters: a permanent handler error, a
// message over its delivery limit, a message without a key, a reused key.
// Route such messages to a poison queue with
// middleware.PoisonQueueWithFilter(pub, topic, IsDeadLetter); without one,
// the router nacks them like any error.
var ErrDeadLetter = errors.New("idemwatermill: dead letter")

// DecisionError is the error that the middleware returns for a delivery it
// does not acknowledge: its Decision is a Retry (the router nacks the
// message, and the broker redelivers it) or a DeadLetter (it also matches
// ErrDeadLetter). It unwraps to the Decision's Err, so that errors.Is and
// errors.As see the handler's error, idemconsume.ErrPermanent or a
// coordinator error through it.
type DecisionError struct {
	// Decision is idemconsume's decision for the delivery.
	Decision idemconsume.Decision
}

// Error implements error: "idemwatermill: retry (handler_error): " and the
// Decision's Err.
func (e *DecisionError) Error() string {
	s := "idemwatermill: " + e.Decision.String()
	if e.Decision.Err != nil {
		s += ": " + e.Decision.Err.Error()
	}
	return s
}

// Unwrap returns the Decision's Err.
func (e *DecisionError) Unwrap() error { return e.Decision.Err }

// Is reports whether target is ErrDeadLetter and the Decision is a
// DeadLetter.
func (e *DecisionError) Is(target error) bool {
	return target == ErrDeadLetter && e.Decision.Action == idemconsume.DeadLetter
}

// IsDeadLetter reports whether err matches ErrDeadLetter: the filter of
// middleware.PoisonQueueWithFilter that sends only the messages idemconsume
// dead-letters to the poison queue, and leaves every other error to be
// nacked and redelivered.
func IsDeadLetter(err error) bool { return errors.Is(err, ErrDeadLetter) }
