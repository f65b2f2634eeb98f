package idemgrpc

import (
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idempotency/internal/protorpc"
)

// live is what the handler returned to this call, as it returned it: a
// live call returns it unchanged, its error value included.
type live struct {
	resp any
	err  error
}

// reply returns a stored outcome as the interceptor returns it.
func reply(o *protorpc.Outcome) (any, error) {
	if o.Status != nil {
		return nil, status.FromProto(o.Status.(*spb.Status)).Err()
	}
	return o.Response, nil
}

// statusOf returns the status of a handler's error: its own status when it
// has one, a context error's (Canceled, DeadlineExceeded), else Unknown with
// the error's text, as the gRPC server sends it.
func statusOf(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// newStatus returns an empty google.rpc.Status for protorpc.Codec.
func newStatus() protorpc.Status { return new(spb.Status) }
