package idemgrpc

import (
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/wire"
)

// outcome is what a handler returned: recorded live, or decoded from the
// store.
type outcome struct {
	// resp is the response message; nil when st is set.
	resp any
	// st is the error status; nil for a response.
	st *status.Status
	// err is the handler's own error, as it returned it (live outcomes
	// only): a live call returns it unchanged.
	err error
}

// reply returns the outcome as an interceptor returns it.
func (o *outcome) reply() (any, error) {
	if o.st != nil {
		return nil, o.st.Err()
	}
	return o.resp, nil
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

// envelopeVersion is the stored format's version. Readers ignore fields they
// do not know; a record of another version is refused, and the coordinator
// then runs the handler again and replaces it.
const envelopeVersion = 1

// envelope is the first line of a stored outcome (wire.Frame); the protobuf
// encoding follows the newline: of the response message when Code is 0 (OK),
// of the google.rpc.Status otherwise.
type envelope struct {
	V int `json:"v"`
	// Code is the status code: 0 for a response.
	Code uint32 `json:"code"`
	// Type is the full name of the response message
	// ("payments.v1.Charge"), by which a replay finds its type in
	// protoregistry.GlobalTypes.
	Type string `json:"type,omitempty"`
}

// codec stores outcomes. Its Encode refuses what cannot be replayed (a nil
// or non-protobuf response, a type missing from the registry), so that the
// coordinator reports it (record_validation_error), keeps the key as not
// replayable, so the handler never runs again for it, and still returns the
// live outcome; its Decode refuses what it cannot read, so that the
// coordinator heals the record.
type codec struct {
	// want is the full name of the method's response message, when the
	// method is in protoregistry.GlobalFiles: Decode refuses a response of
	// another type, which gRPC would send as it is and the client would
	// decode, field numbers and all, as a message of the type it expects.
	want protoreflect.FullName
}

var _ coordinator.Codec[*outcome] = codec{}

var marshal = proto.MarshalOptions{Deterministic: true}

func (codec) Encode(o *outcome) ([]byte, error) {
	var (
		e    = envelope{V: envelopeVersion}
		body []byte
		err  error
	)
	if o.st != nil {
		if o.st.Code() == codes.OK {
			// An error whose GRPCStatus says OK: a record of it would read
			// as a response without a type.
			return nil, fmt.Errorf("idemgrpc: the handler's error %q has status code OK and cannot be stored", o.err)
		}
		e.Code = uint32(o.st.Code())
		body, err = marshal.Marshal(o.st.Proto())
	} else {
		m, ok := o.resp.(proto.Message)
		if !ok || m == nil || !m.ProtoReflect().IsValid() {
			return nil, fmt.Errorf("idemgrpc: the response (%T) is not a protobuf message and cannot be stored", o.resp)
		}
		name := m.ProtoReflect().Descriptor().FullName()
		if _, err := protoregistry.GlobalTypes.FindMessageByName(name); err != nil {
			return nil, fmt.Errorf("idemgrpc: the response type %s is not in protoregistry.GlobalTypes, so it could not be replayed: %w", name, err)
		}
		e.Type = string(name)
		body, err = marshal.Marshal(m)
	}
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encode outcome: %w", err)
	}
	b, err := wire.Frame(e, body)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encode outcome: %w", err)
	}
	return b, nil
}

func (c codec) Decode(b []byte) (*outcome, error) {
	var e envelope
	body, err := wire.Unframe(b, &e)
	switch {
	case errors.Is(err, wire.ErrNoEnvelope):
		return nil, errors.New("idemgrpc: stored outcome has no envelope")
	case err != nil:
		return nil, fmt.Errorf("idemgrpc: stored outcome envelope: %w", err)
	}
	if e.V != envelopeVersion {
		return nil, fmt.Errorf("idemgrpc: stored outcome has envelope version %d, want %d", e.V, envelopeVersion)
	}
	if e.Code != 0 {
		p := new(spb.Status)
		if err := proto.Unmarshal(body, p); err != nil {
			return nil, fmt.Errorf("idemgrpc: stored status: %w", err)
		}
		if codes.Code(e.Code) > codes.Unauthenticated {
			return nil, fmt.Errorf("idemgrpc: stored status has code %d, which gRPC does not define", e.Code)
		}
		if p.GetCode() != int32(e.Code) {
			return nil, fmt.Errorf("idemgrpc: stored status has code %d, envelope %d", p.GetCode(), e.Code)
		}
		return &outcome{st: status.FromProto(p)}, nil
	}
	if c.want != "" && protoreflect.FullName(e.Type) != c.want {
		return nil, fmt.Errorf("idemgrpc: stored response has type %q, but the method returns %s", e.Type, c.want)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(e.Type))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: stored response type %q: %w", e.Type, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("idemgrpc: stored response of type %s: %w", e.Type, err)
	}
	return &outcome{resp: m}, nil
}
