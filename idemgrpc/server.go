package idemgrpc

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/protorpc"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that every
// refusal of the server interceptor carries, beside one of the Reason
// constants. A client tells the interceptor's refusals from the handler's
// own errors of the same code by it.
const ErrorDomain = protorpc.ErrorDomain

// The reasons of the google.rpc.ErrorInfo detail of the server
// interceptor's refusals. The handler did not run for any of them.
const (
	// ReasonKeyMissing (InvalidArgument): the method requires a key
	// (WithKeyRequired) and the call has none.
	ReasonKeyMissing = protorpc.ReasonKeyMissing
	// ReasonKeyInvalid (InvalidArgument): the key is not 1 to 255 visible
	// ASCII characters, or the call has more than one.
	ReasonKeyInvalid = protorpc.ReasonKeyInvalid
	// ReasonCallerUnknown (Unauthenticated): the scope hook (WithKeyScope)
	// could not tell whose call it is.
	ReasonCallerUnknown = protorpc.ReasonCallerUnknown
	// ReasonInProgress (Aborted, with RetryInfo): the first call with the
	// key still runs. Retry later with the same key and request.
	ReasonInProgress = protorpc.ReasonInProgress
	// ReasonKeyReuse (FailedPrecondition): the key was used before for a
	// different request (another method or message).
	ReasonKeyReuse = protorpc.ReasonKeyReuse
	// ReasonStoreUnavailable (Unavailable, with RetryInfo): the
	// idempotency store failed and the coordinator fails closed
	// (on-storage-error mode "raise"). Retrying with the same key is safe.
	ReasonStoreUnavailable = protorpc.ReasonStoreUnavailable
	// ReasonNotReplayable (AlreadyExists, without RetryInfo): a call with
	// the key ran, but its outcome could not be stored (too large, not a
	// registered protobuf message), so it cannot be returned again; the
	// handler does not run again either. Retrying gets the same refusal.
	ReasonNotReplayable = protorpc.ReasonNotReplayable
)

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
// unprotected, reported as unprotected (method none), or is refused with
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
	s := &server{c: c, cfg: &cfg, calls: protorpc.Calls{
		Adapter:   "idemgrpc",
		Header:    cfg.header,
		Noun:      "metadata entry",
		Nouns:     "metadata entries",
		Required:  cfg.required,
		Operation: cfg.operation,
		TTL:       cfg.ttl,
	}}
	return s.intercept
}

type server struct {
	c     *coordinator.Coordinator
	cfg   *config
	calls protorpc.Calls
	// codecs holds each method's codec (a protorpc.Codec), made on its
	// first protected call. The methods are those the gRPC server
	// registered, so it stays small.
	codecs sync.Map
}

// codec returns the codec of fullMethod: one that replays only the
// method's response type, when the method is in protoregistry.GlobalFiles
// (generated code registers it there).
func (s *server) codec(fullMethod string) protorpc.Codec {
	if c, ok := s.codecs.Load(fullMethod); ok {
		return c.(protorpc.Codec)
	}
	c := protorpc.Codec{Adapter: "idemgrpc", Want: protorpc.ResponseType(fullMethod), NewStatus: newStatus}
	s.codecs.Store(fullMethod, c)
	return c
}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.c.Enabled() || !s.cfg.protects(info.FullMethod) {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var scope func() (string, error)
	if s.cfg.scope != nil {
		scope = func() (string, error) { return s.cfg.scope(ctx) }
	}
	call, protect, r := s.calls.Prepare(ctx, s.c, info.FullMethod, md.Get(s.cfg.header), req, scope)
	switch {
	case r != nil:
		return nil, refusal(ctx, *r)
	case !protect:
		return handler(ctx, req)
	}

	var own *live
	res, err := coordinator.DoWithCodec(ctx, s.c, call, s.codec(info.FullMethod), func(ctx context.Context) (*protorpc.Outcome, error) {
		resp, herr := handler(ctx, req)
		own = &live{resp: resp, err: herr}
		o, code := &protorpc.Outcome{Response: resp}, codes.OK
		if herr != nil {
			st := statusOf(herr)
			o, code = &protorpc.Outcome{Status: st.Proto()}, st.Code()
		}
		if !s.cfg.storePolicy(code) || herr != nil && code == codes.OK {
			// An error whose status says OK is a failure, whatever it
			// claims: not cached.
			return o, errNotStored
		}
		return o, nil
	})
	switch {
	case err == nil && res.Replayed:
		// Best effort: the header cannot be set without a server stream (a
		// direct call of the interceptor), nor after the handler sent its
		// headers, which it did not do on a replay.
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
		return reply(res.Value)
	case own != nil && (err == nil || errors.Is(err, errNotStored)):
		// The handler ran here: return what it returned, stored or not.
		// Any other error is a transactional store's failed commit: the
		// handler's writes did not commit, and the caller hears so.
		return own.resp, own.err
	default:
		return nil, refusal(ctx, protorpc.Refuse("idemgrpc", err, s.cfg.retryAfter))
	}
}

// refusal returns the status error of r: its code and message, and, for a
// refusal of the contract, an ErrorInfo with its reason and a RetryInfo
// when it advises a delay, which the retry pushback trailer repeats.
func refusal(ctx context.Context, r protorpc.Refusal) error {
	st := status.New(codes.Code(r.Code), r.Message)
	if r.Reason == "" {
		return st.Err()
	}
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: r.Reason, Domain: ErrorDomain}}
	if r.RetryDelay > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryDelay)})
		// Best effort: it needs a server stream.
		_ = grpc.SetTrailer(ctx, metadata.Pairs(protorpc.PushbackTrailer, protorpc.PushbackMillis(r.RetryDelay)))
	}
	if withDetails, err := st.WithDetails(details...); err == nil { // cannot fail: the code is not OK
		st = withDetails
	}
	return st.Err()
}
