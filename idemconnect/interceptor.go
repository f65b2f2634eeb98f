package idemconnect

import (
	"context"
	"errors"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/protorpc"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail that every
// refusal of the interceptors carries, beside one of the Reason constants.
// A client tells the interceptor's refusals from the handler's own errors
// of the same code by it. It is idemgrpc's.
const ErrorDomain = protorpc.ErrorDomain

// The reasons of the google.rpc.ErrorInfo detail of the interceptors'
// refusals, idemgrpc's and one for streams. The handler did not run for
// any of them.
const (
	// ReasonKeyMissing (InvalidArgument): the procedure requires a key
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
	// different request (another procedure or message).
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
	// ReasonStreamingUnsupported (Unimplemented): a streaming call that
	// carries a key, or of a procedure named by WithProcedures. Only unary
	// calls run once per key.
	ReasonStreamingUnsupported = "IDEMPOTENCY_STREAMING_UNSUPPORTED"
)

// errNotStored is the action's error for an outcome that the store policy
// refuses, or a handler error whose code is 0: the coordinator releases the
// key (a failure is not cached), and the interceptor returns the outcome
// anyway. An outcome the policy allows but that cannot be stored (too
// large, not a registered protobuf message) is not an error of the action:
// the codec refuses to encode it, and the coordinator keeps the key as not
// replayable.
var errNotStored = errors.New("idemconnect: outcome not stored by the store policy")

// Interceptor is the handler (server) interceptor: a connect.Interceptor
// that runs a unary handler at most once per idempotency key, through a
// coordinator, and replays the stored outcome to every retry. Install it
// on handlers with connect.WithInterceptors; make one with NewInterceptor.
type Interceptor struct {
	c     *coordinator.Coordinator
	cfg   config
	calls protorpc.Calls
	// codecs holds each procedure's codec (a protorpc.Codec), made on its
	// first protected call. The procedures are those of the handlers the
	// interceptor was installed on, so it stays small.
	codecs sync.Map
}

var _ connect.Interceptor = (*Interceptor)(nil)

// NewInterceptor returns the handler interceptor over c.
//
// A unary call is protected when it carries the key header
// (DefaultKeyHeader, or WithKeyHeader) and its procedure is one of
// WithProcedures (every procedure by default). A call without the header
// passes through unprotected, reported as unprotected (method none), or is
// refused with InvalidArgument under WithKeyRequired(true). The key is
// scoped to the caller by WithKeyScope and stored under the operation that
// WithOperation names (idemhttp.OperationName of the procedure by default);
// the request is fingerprinted by its procedure and its deterministic
// protobuf encoding, as idemgrpc does.
//
// The handler runs inside the coordinator. Its response, or its error when
// the store policy (WithStorePolicy, DefaultStorePolicy) allows, is stored
// and returned as the handler returned it; later calls with the key get the
// stored response or error (code, message and details) and the response
// header "Idempotent-Replayed: true". Refusals, for which the handler does
// not run, are *connect.Error values with a google.rpc.ErrorInfo detail
// (ErrorDomain and a Reason constant):
//
//	InvalidArgument     the key is missing (WithKeyRequired), malformed, or sent twice
//	Unauthenticated     the scope hook returned an error
//	Aborted             a call with the key still runs; RetryInfo
//	FailedPrecondition  the key was used for a different request
//	AlreadyExists       a call with the key ran, but its outcome could not be stored (too large, not protobuf); no RetryInfo
//	Unavailable         the store failed and c fails closed; RetryInfo
//	Unimplemented       a streaming call with a key, or of a procedure named by WithProcedures
//	Canceled, DeadlineExceeded  the call ended before the handler ran
//	Internal            misconfiguration: a bad operation name or TTL, a request that is not protobuf, the interceptor installed on a client
//
// Streaming calls are never protected: one that carries a key, or whose
// procedure WithProcedures names, is refused with Unimplemented (ErrorInfo
// reason ReasonStreamingUnsupported) rather than run without the
// protection its client asked for; others pass through. When c is disabled
// (coordinator.WithEnabled(false), the kill switch) the interceptor steps
// aside: every call goes to the handler as it came. A handler that panics
// has its key released and the panic goes on (to connect.WithRecover, if
// the handler has it).
//
// NewInterceptor returns an error when c is nil or an option is invalid.
func NewInterceptor(c *coordinator.Coordinator, opts ...Option) (*Interceptor, error) {
	if c == nil {
		return nil, errors.New("idemconnect: NewInterceptor: coordinator is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Interceptor{c: c, cfg: cfg, calls: protorpc.Calls{
		Adapter:   "idemconnect",
		Header:    cfg.header,
		Noun:      "header",
		Nouns:     "headers",
		Required:  cfg.required,
		Operation: cfg.operation,
		TTL:       cfg.ttl,
	}}, nil
}

// codec returns the codec of spec's procedure: one that replays only the
// procedure's response type, when its schema (generated code passes it) or
// protoregistry.GlobalFiles says which it is.
func (i *Interceptor) codec(spec connect.Spec) protorpc.Codec {
	if c, ok := i.codecs.Load(spec.Procedure); ok {
		return c.(protorpc.Codec)
	}
	want := protorpc.OutputOf(spec.Schema)
	if want == "" {
		want = protorpc.ResponseType(spec.Procedure)
	}
	c := protorpc.Codec{Adapter: "idemconnect", Want: want, NewStatus: newStatus}
	i.codecs.Store(spec.Procedure, c)
	return c
}

// WrapUnary implements connect.Interceptor: it protects unary handler
// calls, as NewInterceptor describes.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if spec.IsClient {
			return nil, connect.NewError(connect.CodeInternal, errors.New(
				"idemconnect: the handler interceptor (NewInterceptor) is installed on a client; use NewClientInterceptor"))
		}
		if !i.c.Enabled() || !i.cfg.protects(spec.Procedure) {
			return next(ctx, req)
		}
		var scope func() (string, error)
		if i.cfg.scope != nil {
			scope = func() (string, error) { return i.cfg.scope(ctx, req) }
		}
		call, protect, r := i.calls.Prepare(ctx, i.c, spec.Procedure, req.Header().Values(i.cfg.header), req.Any(), scope)
		switch {
		case r != nil:
			return nil, refusal(req.Peer(), *r)
		case !protect:
			return next(ctx, req)
		}

		var own *live
		res, err := coordinator.DoWithCodec(ctx, i.c, call, i.codec(spec), func(ctx context.Context) (*protorpc.Outcome, error) {
			resp, herr := next(ctx, req)
			own = &live{resp: resp, err: herr}
			var o *protorpc.Outcome
			code := CodeOK
			if herr != nil {
				var st *statusProto
				st, code = statusOf(herr)
				o = &protorpc.Outcome{Status: st}
			} else {
				o = &protorpc.Outcome{Response: anyOf(resp)}
			}
			if !i.cfg.storePolicy(code) || herr != nil && code == CodeOK {
				// An error whose code is 0 is a failure, whatever it
				// claims: not cached.
				return o, errNotStored
			}
			return o, nil
		})
		switch {
		case err == nil && res.Replayed:
			return replay(ctx, res.Value)
		case own != nil && (err == nil || errors.Is(err, errNotStored)):
			// The handler ran here: return what it returned, stored or not.
			// Any other error is a transactional store's failed commit: the
			// handler's writes did not commit, and the caller hears so.
			return own.resp, own.err
		default:
			return nil, refusal(req.Peer(), protorpc.Refuse("idemconnect", err, i.cfg.retryAfter))
		}
	}
}

// WrapStreamingHandler implements connect.Interceptor: a streaming call
// that carries a key, or whose procedure WithProcedures names, is refused
// with Unimplemented; others, and every call while the coordinator is
// disabled, go to the handler as they came.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		procedure := conn.Spec().Procedure
		if !i.c.Enabled() || !i.cfg.protects(procedure) {
			return next(ctx, conn)
		}
		if i.cfg.listed(procedure) || len(conn.RequestHeader().Values(i.cfg.header)) > 0 {
			return streamingRefusal(procedure)
		}
		return next(ctx, conn)
	}
}

// WrapStreamingClient implements connect.Interceptor: the handler
// interceptor does not belong on a client, so every streaming call of a
// client it is installed on fails with Internal.
func (i *Interceptor) WrapStreamingClient(connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(_ context.Context, spec connect.Spec) connect.StreamingClientConn {
		return &failedConn{spec: spec, err: connect.NewError(connect.CodeInternal, errors.New(
			"idemconnect: the handler interceptor (NewInterceptor) is installed on a client; use NewClientInterceptor"))}
	}
}

// live is what the handler returned to this call, as it returned it: a
// live call returns it unchanged, its error value included.
type live struct {
	resp connect.AnyResponse
	err  error
}

// anyOf returns resp's message, or nil.
func anyOf(resp connect.AnyResponse) any {
	if resp == nil {
		return nil
	}
	return resp.Any()
}

// refusal returns the error of r: its code and message, and, for a refusal
// of the contract, an ErrorInfo with its reason and a RetryInfo when it
// advises a delay, which a grpc-retry-pushback-ms trailer repeats to gRPC
// clients (grpc-go's retry policy reads it).
func refusal(peer connect.Peer, r protorpc.Refusal) *connect.Error {
	cause := r.Cause // a context error stays one for errors.Is
	if cause == nil {
		cause = errors.New(r.Message)
	}
	e := connect.NewError(connect.Code(r.Code), cause)
	if r.Reason == "" {
		return e
	}
	addDetail(e, &errdetails.ErrorInfo{Reason: r.Reason, Domain: ErrorDomain})
	if r.RetryDelay > 0 {
		addDetail(e, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryDelay)})
		if peer.Protocol == connect.ProtocolGRPC {
			// The error's metadata is sent as trailers over gRPC.
			e.Meta().Set(protorpc.PushbackTrailer, protorpc.PushbackMillis(r.RetryDelay))
		}
	}
	return e
}

// streamingRefusal returns the refusal of a streaming call of procedure.
func streamingRefusal(procedure string) *connect.Error {
	e := connect.NewError(connect.CodeUnimplemented, errors.New(procedure+
		" is a streaming procedure: idempotency keys protect unary calls only; send the call without a key"))
	addDetail(e, &errdetails.ErrorInfo{Reason: ReasonStreamingUnsupported, Domain: ErrorDomain})
	return e
}
