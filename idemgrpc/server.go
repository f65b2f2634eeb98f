package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemkey"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that every
// refusal of the server interceptor carries, beside one of the Reason
// constants. A client tells the interceptor's refusals from the handler's
// own errors of the same code by it.
const ErrorDomain = "github.com/idemkit/idempotency"

// The reasons of the google.rpc.ErrorInfo detail of the server
// interceptor's refusals. The handler did not run for any of them.
const (
	// ReasonKeyMissing (InvalidArgument): the method requires a key
	// (WithKeyRequired) and the call has none.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid (InvalidArgument): the key is not 1 to 255 visible
	// ASCII characters, or the call has more than one.
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonCallerUnknown (Unauthenticated): the scope hook (WithKeyScope)
	// could not tell whose call it is.
	ReasonCallerUnknown = "IDEMPOTENCY_CALLER_UNKNOWN"
	// ReasonInProgress (Aborted, with RetryInfo): the first call with the
	// key still runs. Retry later with the same key and request.
	ReasonInProgress = "IDEMPOTENCY_IN_PROGRESS"
	// ReasonKeyReuse (FailedPrecondition): the key was used before for a
	// different request (another method or message).
	ReasonKeyReuse = "IDEMPOTENCY_KEY_REUSE"
	// ReasonStoreUnavailable (Unavailable, with RetryInfo): the
	// idempotency store failed and the coordinator fails closed
	// (on-storage-error mode "raise"). Retrying with the same key is safe.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonNotReplayable (AlreadyExists, without RetryInfo): a call with
	// the key ran, but its outcome could not be stored (too large, not a
	// registered protobuf message), so it cannot be returned again; the
	// handler does not run again either. Retrying gets the same refusal.
	ReasonNotReplayable = "IDEMPOTENCY_NOT_REPLAYABLE"
)

// pushbackTrailer is the trailer by which a server tells grpc-go's retry
// policy how long to wait before the next attempt (gRFC A6).
const pushbackTrailer = "grpc-retry-pushback-ms"

// errNotStored is the action's error for an outcome that the store policy
// refuses, or a handler error whose status says OK: the coordinator releases
// the key (a failure is not cached), and the interceptor returns the outcome
// anyway. An outcome the policy allows but that cannot be stored (too large,
// not a registered protobuf message) is not an error of the action: the codec
// refuses to encode it, and the coordinator keeps the key as not replayable.
var errNotStored = errors.New("idemgrpc: outcome not stored by the store policy")

// UnaryServerInterceptor returns a unary server interceptor that runs the
// handler at most once per idempotency key, through c, and replays the
// stored outcome to every retry.
//
// A call is protected when it carries the key metadata entry
// (DefaultKeyHeader, or WithKeyHeader) and its method is one of WithMethods
// (every method by default). A call without the entry passes through
// unprotected, reported with c.ReportUnprotected, or is refused with
// InvalidArgument under WithKeyRequired(true). The key is scoped to the
// caller by WithKeyScope and stored under the operation that WithOperation
// names (idemhttp.OperationName of the full method by default); the request is
// fingerprinted by its method and its deterministic protobuf encoding.
//
// The handler runs inside the coordinator. Its response, or its error status
// when the store policy (WithStorePolicy, DefaultStorePolicy) allows, is
// stored and returned as the handler returned it; later calls with the key
// get the stored response or status (details included) and the response
// header "idempotent-replayed: true". Refusals, for which the handler does
// not run, are statuses with a google.rpc.ErrorInfo detail (ErrorDomain and
// a Reason constant):
//
//	InvalidArgument     the key is missing (WithKeyRequired), malformed, or sent twice
//	Unauthenticated     the scope hook returned an error
//	Aborted             a call with the key still runs; RetryInfo
//	FailedPrecondition  the key was used for a different request
//	AlreadyExists       a call with the key ran, but its outcome could not be stored (too large, not protobuf); no RetryInfo
//	Unavailable         the store failed and c fails closed; RetryInfo
//	Canceled, DeadlineExceeded  the call ended before the handler ran
//	Internal            misconfiguration: a bad operation name or TTL, a request that is not protobuf
//
// When c is disabled (coordinator.WithEnabled(false), the kill switch) the
// interceptor steps aside: every call goes to the handler as it came.
// A handler that panics has its key released and the panic goes on.
// UnaryServerInterceptor panics when c is nil or an option is invalid.
func UnaryServerInterceptor(c *coordinator.Coordinator, opts ...Option) grpc.UnaryServerInterceptor {
	if c == nil {
		panic("idemgrpc: UnaryServerInterceptor: coordinator is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		panic(err)
	}
	s := &server{c: c, cfg: &cfg}
	return s.intercept
}

type server struct {
	c   *coordinator.Coordinator
	cfg *config
	// codecs holds each method's codec (a codec), made on its first
	// protected call. The methods are those the gRPC server registered, so
	// it stays small.
	codecs sync.Map
}

// codec returns the codec of fullMethod: one that replays only the
// method's response type, when the method is in protoregistry.GlobalFiles
// (generated code registers it there).
func (s *server) codec(fullMethod string) codec {
	if c, ok := s.codecs.Load(fullMethod); ok {
		return c.(codec)
	}
	c := codec{want: responseType(fullMethod)}
	s.codecs.Store(fullMethod, c)
	return c
}

// responseType returns the full name of the response message of fullMethod
// ("/payments.v1.Payments/Charge" → payments.v1.Charge), or "" when the
// method is not in protoregistry.GlobalFiles.
func responseType(fullMethod string) protoreflect.FullName {
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	name := protoreflect.FullName(svc + "." + method)
	if !ok || !name.IsValid() {
		return ""
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return ""
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return ""
	}
	return md.Output().FullName()
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.c.Enabled() || !s.cfg.protects(info.FullMethod) {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(s.cfg.header)
	switch {
	case len(values) == 0 && s.cfg.required:
		return nil, refusal(codes.InvalidArgument, ReasonKeyMissing, 0,
			fmt.Sprintf("%s requires an idempotency key in the %q metadata entry", info.FullMethod, s.cfg.header))
	case len(values) == 0:
		s.c.ReportUnprotected(ctx, s.cfg.operation(info.FullMethod)) // counted as unprotected{method="none"}
		return handler(ctx, req)
	case len(values) > 1:
		return nil, refusal(codes.InvalidArgument, ReasonKeyInvalid, 0,
			fmt.Sprintf("the call has %d %q metadata entries; send one", len(values), s.cfg.header))
	}
	key := values[0]
	if err := coordinator.ValidateKey(key); err != nil {
		return nil, refusal(codes.InvalidArgument, ReasonKeyInvalid, 0,
			fmt.Sprintf("the %q metadata entry must be 1 to %d visible ASCII characters (0x21-0x7E); %s",
				s.cfg.header, coordinator.MaxKeyLen, keyProblem(key, err)))
	}
	if s.cfg.scope != nil {
		scope, err := s.cfg.scope(ctx)
		if err != nil {
			return nil, refusal(codes.Unauthenticated, ReasonCallerUnknown, 0,
				"the caller could not be identified, so the idempotency key cannot be scoped to it")
		}
		key = idemkey.Scoped(scope, key)
	}
	op := s.cfg.operation(info.FullMethod)
	if err := coordinator.ValidateOperation(op); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the operation name of %s is invalid: %v", info.FullMethod, err)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the request of %s (%T) is not a protobuf message", info.FullMethod, req)
	}
	fp, err := fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: fingerprint the request of %s: %v", info.FullMethod, err)
	}
	call := coordinator.Call{Operation: op, Key: key, Fingerprint: fp, TTL: s.cfg.ttl}

	var own *outcome
	res, err := coordinator.DoWithCodec(ctx, s.c, call, s.codec(info.FullMethod), func(ctx context.Context) (*outcome, error) {
		resp, herr := handler(ctx, req)
		own = &outcome{resp: resp, err: herr}
		code := codes.OK
		if herr != nil {
			own.st = statusOf(herr)
			code = own.st.Code()
		}
		if !s.cfg.storePolicy(code) || herr != nil && code == codes.OK {
			// An error whose status says OK is a failure, whatever it
			// claims: not cached.
			return own, errNotStored
		}
		return own, nil
	})
	switch {
	case err == nil && res.Replayed:
		// Best effort: the header cannot be set without a server stream (a
		// direct call of the interceptor), nor after the handler sent its
		// headers, which it did not do on a replay.
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
		return res.Value.reply()
	case own != nil:
		// The handler ran here: return what it returned, stored or not. (An
		// error after the handler ran can only be errNotStored: once the
		// action has run, the coordinator does not fail the call.)
		return own.resp, own.err
	default:
		return nil, s.refuse(ctx, err)
	}
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

// refuse maps an error of the coordinator, returned before the handler ran,
// to a status, setting the retry pushback trailer where it applies.
func (s *server) refuse(ctx context.Context, err error) error {
	var inProgress *coordinator.InProgressError
	switch {
	case errors.As(err, &inProgress):
		delay := s.cfg.retryAfter
		if inProgress.RetryAfter > 0 {
			delay = min(delay, inProgress.RetryAfter)
		}
		pushback(ctx, delay)
		return refusal(codes.Aborted, ReasonInProgress, delay,
			"a call with this idempotency key is still being processed; retry it later with the same key")
	case errors.Is(err, coordinator.ErrKeyReuse):
		return refusal(codes.FailedPrecondition, ReasonKeyReuse, 0,
			"this idempotency key was used for a different request (method or message); use a new key for a new request")
	case errors.Is(err, coordinator.ErrNotReplayable):
		// No RetryInfo: a retry gets the same answer.
		return refusal(codes.AlreadyExists, ReasonNotReplayable, 0,
			"a call with this idempotency key was already processed, but its outcome could not be stored, so it cannot be returned again; do not retry with this key")
	case errors.Is(err, coordinator.ErrStorage):
		pushback(ctx, s.cfg.retryAfter)
		return refusal(codes.Unavailable, ReasonStoreUnavailable, s.cfg.retryAfter,
			"the idempotency store is unavailable, so the call was not processed; retry it later with the same key")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, coordinator.ErrInvalidRequest):
		// The key was checked above, so this is the server's configuration
		// (a TTL outside the coordinator's bounds), not the client's fault.
		// Nothing else reports it, so the message says what it is.
		return status.Errorf(codes.Internal, "idemgrpc: the idempotency layer is misconfigured: %s", invalidReason(err))
	default:
		return status.Error(codes.Internal, "idemgrpc: the idempotency layer failed")
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

// refusal returns the status error of a refusal: code, msg, an ErrorInfo
// with reason, and a RetryInfo when retry is positive.
func refusal(code codes.Code, reason string, retry time.Duration, msg string) error {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st := status.New(code, msg)
	if withDetails, err := st.WithDetails(details...); err == nil { // cannot fail: the code is not OK
		st = withDetails
	}
	return st.Err()
}

// pushback sets the trailer that has grpc-go's retry policy, when the
// client's policy retries the status's code, wait d (in whole milliseconds,
// at least 1) before its next attempt. Best effort: it needs a server stream.
func pushback(ctx context.Context, d time.Duration) {
	ms := max(d.Milliseconds(), 1)
	_ = grpc.SetTrailer(ctx, metadata.Pairs(pushbackTrailer, strconv.FormatInt(ms, 10)))
}
