package protorpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idempotency/internal/unprotected"

	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemkey"
)

// A Refusal is what an adapter answers instead of running the handler: a
// status code and message, and, for a refusal of the contract, the
// google.rpc.ErrorInfo reason (of ErrorDomain) and the RetryInfo delay.
type Refusal struct {
	Code Code
	// Reason is the ErrorInfo reason; empty for a status without details
	// (a call that ended, a misconfiguration).
	Reason string
	// RetryDelay, when positive, is the delay of a google.rpc.RetryInfo
	// detail and of the PushbackTrailer.
	RetryDelay time.Duration
	Message    string
	// Cause is the context error of a Canceled or DeadlineExceeded refusal.
	Cause error
}

// Calls is how an adapter reads a call: the header (metadata key) of the
// key, whether a key is required, and how the operation is named.
type Calls struct {
	// Adapter prefixes the messages of misconfigurations ("idemgrpc").
	Adapter string
	// Header is the name of the key's header or metadata entry, as messages
	// quote it.
	Header string
	// Noun and Nouns name the header's kind in messages: "metadata entry"
	// and "metadata entries", or "header" and "headers".
	Noun, Nouns string
	// Required refuses a call without a key instead of passing it through.
	Required bool
	// Operation names the operation of a procedure ("/pkg.Service/Method").
	Operation func(procedure string) string
	// TTL is coordinator.Call.TTL.
	TTL time.Duration
}

// Prepare reads a call of procedure whose key header has values and whose
// request message is msg, and returns the coordinator's call for it. It
// returns protect false and no refusal for a call without a key that may
// pass through, which it reports to c as unprotected; and a refusal for a
// call that must not reach the handler. scope, when not nil, returns the
// caller's scope.
func (cs *Calls) Prepare(ctx context.Context, c *coordinator.Coordinator, procedure string, values []string, msg any, scope func() (string, error)) (call coordinator.Call, protect bool, r *Refusal) {
	switch {
	case len(values) == 0 && cs.Required:
		return call, false, &Refusal{Code: InvalidArgument, Reason: ReasonKeyMissing,
			Message: fmt.Sprintf("%s requires an idempotency key in the %q %s", procedure, cs.Header, cs.Noun)}
	case len(values) == 0:
		unprotected.Report(c, ctx, cs.Operation(procedure)) // counted as unprotected{method="none"}
		return call, false, nil
	case len(values) > 1:
		return call, false, &Refusal{Code: InvalidArgument, Reason: ReasonKeyInvalid,
			Message: fmt.Sprintf("the call has %d %q %s; send one", len(values), cs.Header, cs.Nouns)}
	}
	key := values[0]
	if err := coordinator.ValidateKey(key); err != nil {
		return call, false, &Refusal{Code: InvalidArgument, Reason: ReasonKeyInvalid,
			Message: fmt.Sprintf("the %q %s must be 1 to %d visible ASCII characters (0x21-0x7E); %s",
				cs.Header, cs.Noun, coordinator.MaxKeyLen, keyProblem(key, err))}
	}
	if scope != nil {
		s, err := scope()
		if err != nil {
			return call, false, &Refusal{Code: Unauthenticated, Reason: ReasonCallerUnknown,
				Message: "the caller could not be identified, so the idempotency key cannot be scoped to it"}
		}
		key = idemkey.Scoped(s, key)
	}
	op := cs.Operation(procedure)
	if err := coordinator.ValidateOperation(op); err != nil {
		return call, false, &Refusal{Code: Internal,
			Message: fmt.Sprintf("%s: the operation name of %s is invalid: %v", cs.Adapter, procedure, err)}
	}
	m, ok := msg.(proto.Message)
	if !ok {
		return call, false, &Refusal{Code: Internal,
			Message: fmt.Sprintf("%s: the request of %s (%T) is not a protobuf message", cs.Adapter, procedure, msg)}
	}
	fp, err := Fingerprint(procedure, m)
	if err != nil {
		return call, false, &Refusal{Code: Internal,
			Message: fmt.Sprintf("%s: fingerprint the request of %s: %v", cs.Adapter, procedure, err)}
	}
	return coordinator.Call{Operation: op, Key: key, Fingerprint: fp, TTL: cs.TTL}, true, nil
}

// keyProblem says how key, which coordinator.ValidateKey refused with err,
// breaks the rule that the refusal's message states.
func keyProblem(key string, err error) string {
	switch {
	case key == "":
		return "it is empty"
	case len(key) > coordinator.MaxKeyLen:
		return fmt.Sprintf("it is %d bytes long", len(key))
	}
	for i := range len(key) {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Sprintf("it has byte 0x%02x at offset %d", c, i)
		}
	}
	return invalidReason(err)
}

// Refuse maps an error of the coordinator, returned before the handler
// ran, to a refusal. retryAfter is the longest delay it advises; an
// in-progress refusal advises the holder's remaining lease when that is
// shorter. adapter prefixes the messages of misconfigurations.
func Refuse(adapter string, err error, retryAfter time.Duration) Refusal {
	var inProgress *coordinator.InProgressError
	switch {
	case errors.As(err, &inProgress):
		delay := retryAfter
		if inProgress.RetryAfter > 0 {
			delay = min(delay, inProgress.RetryAfter)
		}
		return Refusal{Code: Aborted, Reason: ReasonInProgress, RetryDelay: delay,
			Message: "a call with this idempotency key is still being processed; retry it later with the same key"}
	case errors.Is(err, coordinator.ErrKeyReuse):
		return Refusal{Code: FailedPrecondition, Reason: ReasonKeyReuse,
			Message: "this idempotency key was used for a different request (method or message); use a new key for a new request"}
	case errors.Is(err, coordinator.ErrNotReplayable):
		// No RetryInfo: a retry gets the same answer.
		return Refusal{Code: AlreadyExists, Reason: ReasonNotReplayable,
			Message: "a call with this idempotency key was already processed, but its outcome could not be stored, so it cannot be returned again; do not retry with this key"}
	case errors.Is(err, coordinator.ErrStorage):
		return Refusal{Code: Unavailable, Reason: ReasonStoreUnavailable, RetryDelay: retryAfter,
			Message: "the idempotency store is unavailable, so the call was not processed; retry it later with the same key"}
	case errors.Is(err, context.DeadlineExceeded):
		return Refusal{Code: DeadlineExceeded, Message: err.Error(), Cause: err}
	case errors.Is(err, context.Canceled):
		return Refusal{Code: Canceled, Message: err.Error(), Cause: err}
	case errors.Is(err, coordinator.ErrInvalidRequest):
		// The key was checked before, so this is the server's configuration
		// (a TTL outside the coordinator's bounds), not the client's fault.
		// Nothing else reports it, so the message says what it is.
		return Refusal{Code: Internal, Message: fmt.Sprintf("%s: the idempotency layer is misconfigured: %s", adapter, invalidReason(err))}
	default:
		return Refusal{Code: Internal, Message: adapter + ": the idempotency layer failed"}
	}
}

// invalidReason returns what an error matching coordinator.ErrInvalidRequest
// says is invalid.
func invalidReason(err error) string {
	var ir *coordinator.InvalidRequestError
	if errors.As(err, &ir) {
		return ir.Reason
	}
	return err.Error()
}

// ValidProcedure reports whether s is a full procedure (method) name,
// "/service/method", as an option that lists procedures accepts.
func ValidProcedure(s string) bool {
	svc, meth, ok := strings.Cut(strings.TrimPrefix(s, "/"), "/")
	return strings.HasPrefix(s, "/") && ok && svc != "" && meth != "" && !strings.Contains(meth, "/")
}
