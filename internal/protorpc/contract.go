package protorpc

import (
	"strconv"
	"time"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail of every
// refusal.
const ErrorDomain = "github.com/idemkit/idempotency"

// The reasons of the google.rpc.ErrorInfo detail of the refusals. The
// adapters export them under the same names.
const (
	// ReasonKeyMissing (InvalidArgument): the procedure requires a key and
	// the call has none.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid (InvalidArgument): the key is not 1 to 255 visible
	// ASCII characters, or the call has more than one.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonCallerUnknown (Unauthenticated): the scope hook could not tell
	// whose call it is.
	ReasonCallerUnknown = "IDEMPOTENCY_CALLER_UNKNOWN"
	// ReasonInProgress (Aborted, with RetryInfo): the first call with the
	// key still runs.
	ReasonInProgress = "IDEMPOTENCY_IN_PROGRESS"
	// ReasonKeyReuse (FailedPrecondition): the key was used before for a
	// different request.
	ReasonKeyReuse = "IDEMPOTENCY_KEY_REUSE"
	// ReasonStoreUnavailable (Unavailable, with RetryInfo): the store failed
	// and the coordinator fails closed.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonNotReplayable (AlreadyExists, without RetryInfo): a call with
	// the key ran, but its outcome could not be stored.
	ReasonNotReplayable = "IDEMPOTENCY_NOT_REPLAYABLE"
)

// A Code is a status code, numbered as gRPC numbers them; Connect's codes
// have the same numbers, and no name for 0 (OK).
type Code uint32

// The codes, by their gRPC names.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

// MaxCode is the highest code that gRPC and Connect define.
const MaxCode = Unauthenticated

// DefaultStorePolicy reports whether an outcome with code is stored by
// default: a response (OK) and the codes that describe the request itself,
// which a retry of the same request would meet again (InvalidArgument,
// NotFound, AlreadyExists, PermissionDenied, FailedPrecondition,
// OutOfRange); not those that say "try again" or describe the server or the
// call, nor Unauthenticated, which is about the caller's credentials.
func DefaultStorePolicy(code Code) bool {
	switch code {
	case OK, InvalidArgument, NotFound, AlreadyExists, PermissionDenied, FailedPrecondition, OutOfRange:
		return true
	}
	return false
}

// DefaultRetryAfter is the longest retry delay that an Aborted (in
// progress) or Unavailable (store down) refusal advises by default.
const DefaultRetryAfter = time.Second

// PushbackTrailer is the trailer by which a server tells grpc-go's retry
// policy how long to wait before the next attempt (gRFC A6).
const PushbackTrailer = "grpc-retry-pushback-ms"

// PushbackMillis returns d as the value of PushbackTrailer: whole
// milliseconds, at least 1.
func PushbackMillis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}
