package coordinator

import "context"

// offRequestPathKey is the key of the context value that marks a store call
// no caller waits for.
type offRequestPathKey struct{}

// offRequestPath marks ctx as the context of store calls made off the
// request path.
func offRequestPath(ctx context.Context) context.Context {
	return context.WithValue(ctx, offRequestPathKey{}, true)
}

// OffRequestPath reports whether ctx is the context of a store call that no
// caller waits for: a completion retried in the background, or a renewal of
// a running action's lease. Such a call may take what is left of the
// reservation rather than one storage timeout, and a result is stored only
// if it goes through, so a store, or a client under it, should not refuse it
// to spare a caller's time: the module's circuit breaker lets it through.
func OffRequestPath(ctx context.Context) bool {
	v, _ := ctx.Value(offRequestPathKey{}).(bool)
	return v
}
