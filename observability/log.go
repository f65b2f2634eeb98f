package observability

import (
	"errors"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idemkit/idempotency/internal/breaker"
	"github.com/idemkit/idempotency/internal/redisreply"
	"github.com/idemkit/idempotency/internal/telemetry"
)

// The messages of the log lines; docs/observability.md lists them with their
// levels and fields.
const (
	msgHit         = "replayed stored result"
	msgMiss        = "running action"
	msgInFlight    = "key in flight"
	msgWaited      = "stopped waiting for in-flight key"
	msgStored      = "stored result"
	msgUnprotected = "running action unprotected: store failed"
	msgNoKey       = "running action unprotected: no idempotency key"
	msgStorageCall = "storage call"
	msgNotReplay   = "key completed, result not replayable: action not run again"

	msgStorageError     = "storage call failed"
	msgDecodeError      = "cannot decode stored record"
	msgValidationError  = "cannot store result"
	msgKeyReuse         = "key reused for a different request"
	msgLeaseLost        = "lease lost"
	msgUnknownErrorType = "idempotency error"
)

// eventLogger writes events as log lines.
type eventLogger struct {
	log  *zap.Logger
	keys LogKeysMode
}

// logEvent writes e, if its level is enabled.
func (l *eventLogger) logEvent(e idemevent.Event) {
	level, msg := lineOf(e)
	ce := l.log.Check(level, msg)
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 7)
	fields = append(fields, zap.String("operation", e.Key.Operation))
	var hidden string // what stands for the key in error messages; "" for LogKeysPlain
	switch {
	case e.Key.Key == "":
		// No key (a request that had none): nothing to show or hide.
	case l.keys == LogKeysPlain:
		fields = append(fields, zap.String("key", e.Key.Key))
	case l.keys == LogKeysOmitted:
		hidden = telemetry.OmittedKey
	default:
		h := telemetry.KeyHash(e.Key.Key)
		fields = append(fields, zap.String("key_hash", h))
		hidden = "<key " + h + ">"
	}
	switch e.Kind {
	case idemevent.InFlight:
		fields = append(fields, zap.String("in_flight_mode", e.Mode))
	case idemevent.Waited:
		fields = append(fields, zap.String("wait_outcome", string(e.Outcome)), zap.Duration("duration", e.Duration))
	case idemevent.Error:
		fields = append(fields, zap.String("error_type", string(e.ErrorType)))
	case idemevent.StorageCall:
		fields = append(fields, zap.Duration("duration", e.Duration))
	case idemevent.BulkHit, idemevent.BulkMiss:
		fields = append(fields, zap.Int("count", e.Count))
	}
	if e.Method != "" {
		fields = append(fields, zap.String("method", string(e.Method)))
	}
	if e.Err != nil {
		if hidden == "" {
			fields = append(fields, zap.Error(e.Err))
		} else {
			fields = append(fields, zap.String("error", telemetry.Redact(e.Err.Error(), e.Key, hidden)))
		}
	}
	ce.Write(fields...)
}

// lineOf returns the level and message of e's log line.
func lineOf(e idemevent.Event) (zapcore.Level, string) {
	switch e.Kind {
	case idemevent.Hit:
		return zap.DebugLevel, msgHit
	case idemevent.Miss:
		return zap.DebugLevel, msgMiss
	case idemevent.InFlight:
		return zap.DebugLevel, msgInFlight
	case idemevent.Waited:
		if e.Outcome == idemevent.WaitTimeout {
			return zap.WarnLevel, msgWaited
		}
		return zap.DebugLevel, msgWaited
	case idemevent.Stored:
		return zap.DebugLevel, msgStored
	case idemevent.Unprotected:
		if e.Method == idemevent.MethodNone {
			return zap.DebugLevel, msgNoKey // routine where a key is optional
		}
		return zap.WarnLevel, msgUnprotected
	case idemevent.StorageCall:
		return zap.DebugLevel, msgStorageCall
	case idemevent.NotReplayable:
		// Handled (the action did not run twice), but the caller got an
		// error instead of its result; the cause was logged at Error when
		// the record was written (record_validation_error).
		return zap.WarnLevel, msgNotReplay
	case idemevent.Error:
		switch e.ErrorType {
		case idemevent.ErrorStorageGet, idemevent.ErrorStorageReserve,
			idemevent.ErrorStorageSave, idemevent.ErrorStorageRelease:
			return zap.ErrorLevel, storageErrorLine(e.Err)
		case idemevent.ErrorStorageRenew:
			return zap.WarnLevel, storageErrorLine(e.Err)
		case idemevent.ErrorDecode:
			return zap.ErrorLevel, msgDecodeError
		case idemevent.ErrorRecordValidation:
			return zap.ErrorLevel, msgValidationError
		case idemevent.ErrorKeyReuse:
			return zap.WarnLevel, msgKeyReuse
		case idemevent.ErrorLeaseLost:
			return zap.ErrorLevel, msgLeaseLost
		}
		return zap.ErrorLevel, msgUnknownErrorType
	}
	return zap.DebugLevel, "event " + e.Kind.String()
}

// storageErrorLine returns the message of a failed storage call's line:
// msgStorageError, or, when the store answered but refused us (a refusalOf
// other than the breaker's), a message that says so, since that is a
// misconfiguration, not an outage. A call the open breaker refused keeps
// msgStorageError: the breaker logged the outage once when it opened, and
// the line's error says "breaker: circuit open".
func storageErrorLine(err error) string {
	switch refusalOf(err) {
	case refusalCredentials:
		return msgStorageError + ": redis refused the credentials"
	case refusalPermission:
		return msgStorageError + ": redis denied the permission"
	case refusalDatabase:
		return msgStorageError + ": redis has no such database"
	}
	return msgStorageError
}

// The reason label values of storage_refusals_total: why a store call was
// refused rather than failed.
const (
	refusalCredentials = redisreply.Credentials // WRONGPASS, NOAUTH
	refusalPermission  = redisreply.Permission  // NOPERM
	refusalDatabase    = redisreply.Database    // an unknown database
	refusalBreakerOpen = "breaker_open"         // the module's circuit breaker is open
)

// refusalReasons are the reason label values, in the order the metric
// documents them.
var refusalReasons = [...]string{refusalCredentials, refusalPermission, refusalDatabase, refusalBreakerOpen}

// refusalOf returns why err, a failed store call's error, is a refusal, or
// "" when it is not one. A refusal is a store that answered but refused us
// (an error reply of Redis, told by its code: WRONGPASS or NOAUTH, NOPERM,
// or an unknown database), or the module's circuit breaker refusing the call
// while Redis is down (an error wrapping breaker.ErrOpen, which
// idempotency.ErrBreakerOpen is). Both the log line (storageErrorLine) and
// storage_refusals_total classify with it.
func refusalOf(err error) string {
	if err == nil {
		return ""
	}
	if r := redisreply.Refusal(err); r != "" {
		return r
	}
	if errors.Is(err, breaker.ErrOpen) {
		return refusalBreakerOpen
	}
	return ""
}
