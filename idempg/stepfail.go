package idempg

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/idemconsume"
)

// fail keeps a step's failure for good, with the outside answers not kept
// yet, and returns the step that committed: this one, or the one a
// concurrent run committed first.
func (r *Run) fail(name, kind string, cause error) (step, bool, error) {
	msg := reasonOf(cause)
	ctx := r.ctx
	var (
		inserted bool
		st       step
	)
	err := r.s.send(ctx, func(b *pgx.Batch) {
		inserted = false
		b.Queue(insertStep, r.key.Operation, r.key.Key, name, kind, stepFailed, r.fp, []byte(msg), r.ttl.Milliseconds()).
			QueryRow(func(row pgx.Row) error {
				err := row.Scan(&inserted)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				return err
			})
		r.queueKept(b)
	})
	if err != nil {
		return step{}, false, r.storageError(idemevent.MethodComplete, "keep the failure of step "+name, err)
	}
	r.kept = r.kept[:0]
	if !inserted {
		if st, err = r.read(ctx, r.s.db, name); err != nil {
			return step{}, false, r.storageError(idemevent.MethodGet, "read step "+name, err)
		}
		return st, false, nil
	}
	return step{kind: kind, failed: true, fp: r.fp, result: []byte(msg)}, false, &StepFailedError{
		Operation: r.key.Operation, Key: r.key.Key, Step: name, Reason: msg, err: cause}
}

// reasonOf is err's message as a kept failure's reason: valid UTF-8 (so
// that Inspect can read it as text), cut to at most maxReasonLen bytes at
// a character's start.
func reasonOf(err error) string {
	msg := strings.ToValidUTF8(err.Error(), "\uFFFD")
	if len(msg) <= maxReasonLen {
		return msg
	}
	cut := maxReasonLen
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut]
}

// StepFailedError is the error of a step (Phase, Outside) whose failure was
// kept: its function returned an error that matches idemconsume.ErrPermanent
// (idemconsume.Permanent marks one: the library's one mark of an error that
// no retry cures), on this run or an earlier one. Every later run of the key gets it at that step, and
// the steps before it keep what they committed. It matches ErrStepFailed,
// and, on the run that failed, unwraps to the function's error.
type StepFailedError struct {
	// Operation and Key are the call's.
	Operation, Key string
	// Step is the step's name.
	Step string
	// Reason is the failure's message, at most 256 bytes.
	Reason string

	err error
}

// Error implements error.
func (e *StepFailedError) Error() string {
	return fmt.Sprintf("idempg: step %q of %s:%s failed for good: %s", e.Step, e.Operation, e.Key, e.Reason)
}

// Is reports whether target is ErrStepFailed or idemconsume.ErrPermanent:
// a consumer's handler that returns it dead-letters its message rather
// than wait for a redelivery that would get the same failure.
func (e *StepFailedError) Is(target error) bool {
	return target == ErrStepFailed || target == idemconsume.ErrPermanent
}

// Unwrap returns the function's error on the run that failed, nil on a
// later one.
func (e *StepFailedError) Unwrap() error { return e.err }

// permanent reports whether err is a failure for good: it matches
// idemconsume.ErrPermanent (idemconsume.Permanent marks one).
func permanent(err error) bool { return errors.Is(err, idemconsume.ErrPermanent) }
