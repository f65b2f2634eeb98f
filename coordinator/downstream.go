package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// downstreamKey is the context key of a running action's call, from which
// DownstreamKey derives.
type downstreamKey struct{}

// downstreamStepKey is the context key of WithDownstreamStep's name.
type downstreamStepKey struct{}

// withDownstream returns ctx carrying k, for the action of k's call: every
// run of an action, protected or not, sees it.
func withDownstream(ctx context.Context, k idemstore.Key) context.Context {
	return context.WithValue(ctx, downstreamKey{}, k)
}

// DownstreamKey returns the idempotency key that the action running with
// ctx sends to a service it calls (a payment provider that deduplicates by
// key), and false outside an action. The key is the same on every run of
// the call's action, in any process: one lost record, a holder killed -9, a
// rolled-back transaction or a lapsed lease runs the action again, and the
// provider, seeing the same key, charges once. It is 32 lowercase hex
// digits, 128 bits of SHA-256 of the call's operation, its key (which an
// adapter's key scope has already made the tenant's own) and the step
// (WithDownstreamStep; "" until named), so two calls, two tenants or two
// steps never share one, and the caller's key does not leave the service.
//
// idemhttp.Transport and the gRPC and Connect client interceptors send it
// without being asked, unless the request already has a key. An action
// that calls out more than once names each call's step, or every call
// carries the same key (docs/effects.md).
func DownstreamKey(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(downstreamKey{}).(idemstore.Key)
	if !ok {
		return "", false
	}
	step, _ := ctx.Value(downstreamStepKey{}).(string)
	return deriveDownstream(k, step), true
}

// WithDownstreamStep returns a copy of ctx whose DownstreamKey is the
// step's, replacing any step ctx had: name each outside call of an action
// that makes several ("reserve-stock", "charge"), with names that do not
// change from one run to the next. Outside an action it changes nothing
// that DownstreamKey reports.
func WithDownstreamStep(ctx context.Context, step string) context.Context {
	return context.WithValue(ctx, downstreamStepKey{}, step)
}

// WithDownstream returns a copy of ctx whose DownstreamKey is call's (from
// its Operation and Key; step "" until WithDownstreamStep names one), for
// work done on the call's behalf outside an action: idempg.Steps runs its
// phases and outside calls with it. Inside an action, ctx already carries
// its call's.
func WithDownstream(ctx context.Context, call Call) context.Context {
	return withDownstream(ctx, idemstore.Key{Operation: call.Operation, Key: call.Key})
}

// downstreamDomain separates the downstream keys' hash from any other use
// of SHA-256 over the same strings; the version lets a later derivation
// differ.
const downstreamDomain = "idemkit downstream key v1\x00"

// deriveDownstream is DownstreamKey's derivation. An operation and a key
// hold no NUL byte (ValidateOperation, ValidateKey), so NUL separates them,
// and the step, which may hold any byte, comes last: distinct triples hash
// distinct inputs.
func deriveDownstream(k idemstore.Key, step string) string {
	h := sha256.New()
	h.Write([]byte(downstreamDomain))
	h.Write([]byte(k.Operation))
	h.Write([]byte{0})
	h.Write([]byte(k.Key))
	h.Write([]byte{0})
	h.Write([]byte(step))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}
