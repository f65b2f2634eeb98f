package protorpc

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/wire"
)

// Status is a google.rpc.Status message (genproto's
// googleapis/rpc/status.Status), which an adapter makes for its Codec.
type Status interface {
	proto.Message
	GetCode() int32
}

// An Outcome is what a handler returned, as it is stored: a response or
// an error status.
type Outcome struct {
	// Response is the response message; nil when Status is set. A value
	// that is not a registered protobuf message cannot be stored.
	Response any
	// Status is the error status, code, message and details; nil for a
	// response.
	Status Status
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

// Codec stores outcomes. Its Encode refuses what cannot be replayed (a nil
// or non-protobuf response, a type missing from the registry), so that the
// coordinator reports it (record_validation_error), keeps the key as not
// replayable, so the handler never runs again for it, and still returns the
// live outcome; its Decode refuses what it cannot read, so that the
// coordinator heals the record.
type Codec struct {
	// Adapter prefixes its errors ("idemgrpc").
	Adapter string
	// Want is the full name of the procedure's response message, when it is
	// known: Decode refuses a response of another type, which the protocol
	// would send as it is and the client would decode, field numbers and
	// all, as a message of the type it expects.
	Want protoreflect.FullName
	// NewStatus returns an empty google.rpc.Status, into which Decode reads
	// a stored error status.
	NewStatus func() Status
}

var _ coordinator.Codec[*Outcome] = Codec{}

var marshal = proto.MarshalOptions{Deterministic: true}

// Encode returns the record of o.
func (c Codec) Encode(o *Outcome) ([]byte, error) {
	var (
		e    = envelope{V: envelopeVersion}
		body []byte
		err  error
	)
	if o.Status != nil {
		if o.Status.GetCode() <= 0 {
			// An error whose status says OK: a record of it would read as a
			// response without a type.
			return nil, fmt.Errorf("%s: the handler's error has status code %d and cannot be stored", c.Adapter, o.Status.GetCode())
		}
		e.Code = uint32(o.Status.GetCode())
		body, err = marshal.Marshal(o.Status)
	} else {
		m, ok := o.Response.(proto.Message)
		if !ok || m == nil || !m.ProtoReflect().IsValid() {
			return nil, fmt.Errorf("%s: the response (%T) is not a protobuf message and cannot be stored", c.Adapter, o.Response)
		}
		name := m.ProtoReflect().Descriptor().FullName()
		if _, err := protoregistry.GlobalTypes.FindMessageByName(name); err != nil {
			return nil, fmt.Errorf("%s: the response type %s is not in protoregistry.GlobalTypes, so it could not be replayed: %w", c.Adapter, name, err)
		}
		e.Type = string(name)
		body, err = marshal.Marshal(m)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: encode outcome: %w", c.Adapter, err)
	}
	b, err := wire.Frame(e, body)
	if err != nil {
		return nil, fmt.Errorf("%s: encode outcome: %w", c.Adapter, err)
	}
	return b, nil
}

// Decode returns the outcome that b records: a response of its registered
// type, or an error status.
func (c Codec) Decode(b []byte) (*Outcome, error) {
	var e envelope
	body, err := wire.Unframe(b, &e)
	switch {
	case errors.Is(err, wire.ErrNoEnvelope):
		return nil, fmt.Errorf("%s: stored outcome has no envelope", c.Adapter)
	case err != nil:
		return nil, fmt.Errorf("%s: stored outcome envelope: %w", c.Adapter, err)
	}
	if e.V != envelopeVersion {
		return nil, fmt.Errorf("%s: stored outcome has envelope version %d, want %d", c.Adapter, e.V, envelopeVersion)
	}
	if e.Code != 0 {
		st := c.NewStatus()
		if err := proto.Unmarshal(body, st); err != nil {
			return nil, fmt.Errorf("%s: stored status: %w", c.Adapter, err)
		}
		if Code(e.Code) > MaxCode {
			return nil, fmt.Errorf("%s: stored status has code %d, which gRPC does not define", c.Adapter, e.Code)
		}
		if st.GetCode() != int32(e.Code) {
			return nil, fmt.Errorf("%s: stored status has code %d, envelope %d", c.Adapter, st.GetCode(), e.Code)
		}
		return &Outcome{Status: st}, nil
	}
	if c.Want != "" && protoreflect.FullName(e.Type) != c.Want {
		return nil, fmt.Errorf("%s: stored response has type %q, but the method returns %s", c.Adapter, e.Type, c.Want)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(e.Type))
	if err != nil {
		return nil, fmt.Errorf("%s: stored response type %q: %w", c.Adapter, e.Type, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("%s: stored response of type %s: %w", c.Adapter, e.Type, err)
	}
	return &Outcome{Response: m}, nil
}

// ResponseType returns the full name of the response message of procedure
// ("/payments.v1.Payments/Charge" → payments.v1.Charge), or "" when the
// procedure is not in protoregistry.GlobalFiles (generated code registers
// its services there).
func ResponseType(procedure string) protoreflect.FullName {
	svc, method, ok := strings.Cut(strings.TrimPrefix(procedure, "/"), "/")
	name := protoreflect.FullName(svc + "." + method)
	if !ok || !name.IsValid() {
		return ""
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return ""
	}
	return OutputOf(d)
}

// OutputOf returns the full name of the output message of d when it is a
// method descriptor, else "".
func OutputOf(d any) protoreflect.FullName {
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return ""
	}
	return md.Output().FullName()
}
