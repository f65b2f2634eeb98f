package idemconnect

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemkit/idempotency/internal/protorpc"
)

// statusProto is the google.rpc.Status in which an error is stored, as
// idemgrpc stores a gRPC status: the records of the two adapters are
// alike.
type statusProto = spb.Status

// newStatus returns an empty google.rpc.Status for protorpc.Codec.
func newStatus() protorpc.Status { return new(statusProto) }

// typeURLPrefix is the prefix of the type URL of an error detail's Any.
const typeURLPrefix = "type.googleapis.com/"

// statusOf returns a handler's error as Connect sends it, as a
// google.rpc.Status, and its code: a *connect.Error's code, message and
// details; a context error's Canceled or DeadlineExceeded; else Unknown with
// the error's text.
func statusOf(err error) (*statusProto, connect.Code) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce == nil {
		code := connect.CodeUnknown
		switch {
		case errors.Is(err, context.Canceled):
			code = connect.CodeCanceled
		case errors.Is(err, context.DeadlineExceeded):
			code = connect.CodeDeadlineExceeded
		}
		return &statusProto{Code: int32(code), Message: err.Error()}, code
	}
	st := &statusProto{Code: int32(ce.Code()), Message: ce.Message()}
	for _, d := range ce.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: typeURLPrefix + d.Type(), Value: d.Bytes()})
	}
	return st, ce.Code()
}

// replay returns a stored outcome as the interceptor returns it, marked
// with the ReplayedHeader.
func replay(ctx context.Context, o *protorpc.Outcome) (connect.AnyResponse, error) {
	if o.Status == nil {
		r := &replayed{AnyResponse: connect.NewResponse(new(struct{})), msg: o.Response}
		r.Header().Set(ReplayedHeader, "true")
		return r, nil
	}
	st := o.Status.(*statusProto)
	var msg error
	if st.GetMessage() != "" {
		msg = errors.New(st.GetMessage())
	}
	e := connect.NewError(connect.Code(st.GetCode()), msg)
	for _, d := range st.GetDetails() {
		detail, err := connect.NewErrorDetail(d) // an Any is used as it is: no error
		if err == nil {
			e.AddDetail(detail)
		}
	}
	// A response header, as on a replayed response; the error's own
	// metadata would be a trailer over gRPC. Without a handler context (a
	// direct call of the interceptor) it goes with the error.
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		info.ResponseHeader().Set(ReplayedHeader, "true")
	} else {
		e.Meta().Set(ReplayedHeader, "true")
	}
	return nil, e
}

// replayed is the response of a replay. Connect's handlers send the message
// that Any returns, whatever the response's type, so a replay needs no
// *connect.Response of the generated type, which an interceptor cannot
// make: Any is the stored message, of the procedure's response type.
type replayed struct {
	connect.AnyResponse // header and trailer, and Connect's unexported method
	msg                 any
}

// Any returns the replayed message.
func (r *replayed) Any() any { return r.msg }

// addDetail adds m to e's details.
func addDetail(e *connect.Error, m proto.Message) {
	if d, err := connect.NewErrorDetail(m); err == nil { // cannot fail: the details are well-known messages
		e.AddDetail(d)
	}
}

// failedConn is a client stream that fails with err: the client
// interceptor's answer to a streaming call it refuses, sent nowhere.
type failedConn struct {
	spec            connect.Spec
	err             error
	requestHeader   http.Header
	responseHeader  http.Header
	responseTrailer http.Header
}

func (c *failedConn) Spec() connect.Spec { return c.spec }
func (c *failedConn) Peer() connect.Peer { return connect.Peer{} }
func (c *failedConn) Send(any) error     { return c.err }
func (c *failedConn) RequestHeader() http.Header {
	if c.requestHeader == nil {
		c.requestHeader = http.Header{}
	}
	return c.requestHeader
}
func (c *failedConn) CloseRequest() error { return nil }
func (c *failedConn) Receive(any) error   { return c.err }
func (c *failedConn) ResponseHeader() http.Header {
	if c.responseHeader == nil {
		c.responseHeader = http.Header{}
	}
	return c.responseHeader
}
func (c *failedConn) ResponseTrailer() http.Header {
	if c.responseTrailer == nil {
		c.responseTrailer = http.Header{}
	}
	return c.responseTrailer
}
func (c *failedConn) CloseResponse() error { return nil }

var _ connect.StreamingClientConn = (*failedConn)(nil)
