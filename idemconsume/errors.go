package idemconsume

import (
	"errors"
	"fmt"
)

// Errors of this package; test them with errors.Is.
var (
	// ErrPermanent marks a handler error that no redelivery can cure (a
	// message that does not parse, a referenced account that does not
	// exist): Process dead-letters the message at once. Wrap an error with
	// Permanent, or give an error type an Is method that matches it.
	ErrPermanent = errors.New("idemconsume: permanent error")

	// ErrNoKey is returned by the key functions (KeyFromID, KeyFromField,
	// KeyFromFieldOrID) for a message that has no key; Process then
	// dead-letters the message.
	ErrNoKey = errors.New("idemconsume: message has no idempotency key")

	// ErrMaxDeliveries is the error of a Decision that dead-letters a message
	// delivered more than MaxDeliveries times without being completed.
	ErrMaxDeliveries = errors.New("idemconsume: message delivered more times than allowed")
)

// Permanent returns err marked as permanent: an error that matches both err
// and ErrPermanent, so that Process dead-letters the message instead of
// waiting for a redelivery. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() error        { return e.err }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// PanicError is the error of a Decision whose handler panicked: Process
// recovers the panic, the coordinator releases the key, and the message is
// treated as one whose handler returned an error (retried, then
// dead-lettered on its MaxDeliveries'th delivery). A key or fingerprint
// function that panics is recovered too, and dead-letters the message
// (ReasonBadMessage).
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the panicking goroutine's stack, as runtime/debug.Stack
	// formats it.
	Stack []byte
}

// Error implements error.
func (e *PanicError) Error() string { return fmt.Sprintf("idemconsume: handler panicked: %v", e.Value) }

// Unwrap returns Value when it is an error, so that errors.Is sees through
// a panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// CommandError is a broker command that failed in an adapter (a Redis
// Streams XACK, say), as the adapter reports it to its error hook; its
// Command is a small fixed set per adapter, fit for a metric label.
type CommandError struct {
	// Command names the command, lower case: "xack", "xreadgroup", ...
	Command string
	// Err is the failure, with the adapter's context.
	Err error
}

// Error implements error.
func (e *CommandError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *CommandError) Unwrap() error { return e.Err }
