package idemgrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idempotency/coordinator"
)

// UnaryClientInterceptor returns a unary client interceptor that gives each
// call one idempotency key and keeps it across the call's retries. A call
// whose outgoing context already carries the key metadata entry
// (DefaultKeyHeader, or WithKeyHeader; set with ContextWithKey or
// metadata.AppendToOutgoingContext) keeps it; so does a call with a key
// from ContextWithKey under another WithKeyHeader, which the interceptor
// sends under its own header too. Any other call of a protected method
// (WithMethods; every method by default) gets the downstream key of the
// coordinator action whose context it carries (coordinator.DownstreamKey,
// the same on every run of the action), or else a fresh NewKey. It reads those
// two options and ignores the others. It panics when an option is invalid,
// as UnaryServerInterceptor does.
//
// The interceptor runs once per logical call, around all of its attempts:
// grpc-go's retry policy (a service config "retryPolicy") and its
// transparent retries re-send the first attempt's metadata, key included,
// so every attempt carries the same key and the server runs the handler
// once. A retry loop of your own, or a retrying interceptor that comes
// before this one in the chain, calls it again and so gets a new key each
// time: put this interceptor first in grpc.WithChainUnaryInterceptor, and
// give a call that your own code retries its key once, before the loop,
// with ContextWithKey(ctx, NewKey()).
func UnaryClientInterceptor(opts ...Option) grpc.UnaryClientInterceptor {
	cfg, err := newConfig(opts)
	if err != nil {
		panic(err)
	}
	header := cfg.header
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if cfg.protects(method) {
			if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(header)) == 0 {
				ctx = metadata.AppendToOutgoingContext(ctx, header, callerKey(ctx, md, header))
			}
		}
		return invoker(ctx, method, req, reply, cc, callOpts...)
	}
}

// callerKey returns the key that ContextWithKey put into ctx when it is
// still the outgoing metadata's DefaultKeyHeader entry and header is
// another, else the downstream key of the coordinator action running with
// ctx, else a fresh NewKey.
func callerKey(ctx context.Context, md metadata.MD, header string) string {
	if header != DefaultKeyHeader {
		k, ok := ctx.Value(contextKey{}).(string)
		if vs := md.Get(DefaultKeyHeader); ok && len(vs) == 1 && vs[0] == k {
			return k
		}
	}
	if key, ok := coordinator.DownstreamKey(ctx); ok {
		return key
	}
	return NewKey()
}

// contextKey is the context key under which ContextWithKey records the key.
type contextKey struct{}

// ContextWithKey returns a copy of ctx whose outgoing metadata carries key as
// the idempotency key, under DefaultKeyHeader, replacing any key there. Use
// it for a key of your own (an order ID, a message ID, a key your caller
// sent you) and for retries that your own code makes: create the key once
// per logical request and pass the same context to every attempt. It does
// not need the client interceptor, which keeps the key it finds, and which,
// under another WithKeyHeader, sends the key under that header too. A
// server with another WithKeyHeader and a client without the interceptor
// need metadata.AppendToOutgoingContext with that name instead.
func ContextWithKey(ctx context.Context, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(DefaultKeyHeader, key)
	return metadata.NewOutgoingContext(context.WithValue(ctx, contextKey{}, key), md)
}
