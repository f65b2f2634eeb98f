package idemconnect

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// ClientInterceptor is the client interceptor: a connect.Interceptor that
// gives each unary call one idempotency key. Install it on clients with
// connect.WithInterceptors; make one with NewClientInterceptor.
type ClientInterceptor struct {
	cfg config
}

var _ connect.Interceptor = (*ClientInterceptor)(nil)

// NewClientInterceptor returns a client interceptor that gives each unary
// call one idempotency key, in the key header (DefaultKeyHeader, or
// WithKeyHeader). A call whose request already has the header keeps it; a
// call whose context carries a key from ContextWithKey is sent with that
// key, whatever its procedure; any other call of a protected procedure
// (WithProcedures; every procedure by default) gets the downstream key of
// the coordinator action whose context it carries
// (coordinator.DownstreamKey, the same on every run of the action), or
// else a fresh NewKey. It
// reads those two options and ignores the others, and returns an error when
// an option is invalid, as NewInterceptor does.
//
// Connect's clients do not retry: a retry is your code calling again. The
// interceptor cannot tell a retry from a new call, so a call it gives a
// fresh key to cannot be retried safely. Give a call that your code may
// retry its key once, before the first attempt, with ContextWithKey(ctx,
// NewKey()), and pass that context (or one derived from it, with its own
// deadline) to every attempt: each then carries the same key, and the
// server runs the handler once. Retry middleware, if you have some, must
// come after this interceptor, so that it re-sends the request it was
// given, key included.
//
// A streaming call that carries a key from ContextWithKey, or whose
// procedure WithProcedures names, fails with Unimplemented (ErrorInfo reason
// ReasonStreamingUnsupported) without being sent: only unary calls run
// once per key. Installed on a handler instead of a client, the interceptor
// fails every unary call with Internal.
func NewClientInterceptor(opts ...Option) (*ClientInterceptor, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &ClientInterceptor{cfg: cfg}, nil
}

// WrapUnary implements connect.Interceptor: it attaches the call's key, as
// NewClientInterceptor describes.
func (ci *ClientInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if !spec.IsClient {
			return nil, connect.NewError(connect.CodeInternal, errors.New(
				"idemconnect: the client interceptor (NewClientInterceptor) is installed on a handler; use NewInterceptor"))
		}
		if len(req.Header().Values(ci.cfg.header)) == 0 {
			if key, ok := keyFrom(ctx); ok {
				req.Header().Set(ci.cfg.header, key)
			} else if ci.cfg.protects(spec.Procedure) {
				req.Header().Set(ci.cfg.header, downstreamOrNew(ctx))
			}
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor: a streaming call
// that carries a key from ContextWithKey, or whose procedure
// WithProcedures names, fails with Unimplemented without being sent; others
// go out as they came, without a key.
func (ci *ClientInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		if _, ok := keyFrom(ctx); ok || ci.cfg.listed(spec.Procedure) {
			return &failedConn{spec: spec, err: streamingRefusal(spec.Procedure)}
		}
		return next(ctx, spec)
	}
}

// WrapStreamingHandler implements connect.Interceptor: the client
// interceptor does not belong on a handler, but a handler's streams have no
// key to attach, so it passes them through.
func (ci *ClientInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// contextKey is the context key under which ContextWithKey records the key.
type contextKey struct{}

// ContextWithKey returns a copy of ctx that carries key as the idempotency
// key of the calls made with it (and with contexts derived from it), which
// the client interceptor sends in its key header, replacing any key of a
// parent context. Use it for a key of your own (an order ID, a message ID,
// a key your caller sent you) and for retries that your own code makes:
// create the key once per logical request and pass the same context to
// every attempt. It needs the client interceptor; without it, set the
// header on the request yourself: req.Header().Set(DefaultKeyHeader, key).
func ContextWithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, contextKey{}, key)
}

// keyFrom returns the key that ContextWithKey put into ctx.
func keyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(contextKey{}).(string)
	return k, ok
}

// downstreamOrNew returns the downstream key of the coordinator action
// running with ctx, or a fresh NewKey outside one.
func downstreamOrNew(ctx context.Context) string {
	if key, ok := coordinator.DownstreamKey(ctx); ok {
		return key
	}
	return NewKey()
}

// NewKey returns a fresh idempotency key: a random (version 4) UUID from
// crypto/rand, such as "1b4e28ba-2fa1-4d3b-883f-0016d3cca427". The client
// interceptor attaches one to each call that has no key; call NewKey
// yourself, once per logical request, when your own code retries the call
// (see ContextWithKey).
func NewKey() string { return idemhttp.NewKey() }
