package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgrpc"
	"github.com/idemkit/idempotency/idemgrpc/internal/paymentspb"
)

// record returns a stored outcome in idemgrpc's envelope: meta, a newline,
// the encoding of body.
func record(t *testing.T, meta string, body proto.Message) string {
	t.Helper()
	b, err := proto.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return meta + "\n" + string(b)
}

// store writes rec as the completed record of key under Charge's operation,
// without a fingerprint (so that it is never a reuse), as another writer
// would.
func store(t *testing.T, c *coordinator.Coordinator, key, rec string) {
	t.Helper()
	call := coordinator.Call{Operation: "payments.v1.Payments.Charge", Key: key}
	if _, err := c.Execute(t.Context(), call, func(context.Context) ([]byte, error) { return []byte(rec), nil }); err != nil {
		t.Fatal(err)
	}
}

// TestRecordOfAnotherTypeIsNotReplayed: a record whose message type is not
// the method's response type (a record another writer made, or one a
// version of the service with another response type stored) must not be
// replayed: gRPC would send its bytes, and the client would decode them as
// a Charge — a ChargeRequest's account becomes the charge's ID. It is
// unreadable, so it heals: the handler runs and its charge replaces it.
func TestRecordOfAnotherTypeIsNotReplayed(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	store(t, c, "k", record(t, `{"v":1,"code":0,"type":"payments.v1.ChargeRequest"}`,
		&paymentspb.ChargeRequest{Account: "acct_evil", AmountCents: 1}))
	svc := &payments{}
	client := serve(t, c, svc, nil)
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", false)
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", true)
	wantDecodeError(t, ev, "payments.v1.ChargeRequest")
}

// TestRecordWithAnInvalidCodeIsNotReplayed: a status record with a code
// that gRPC does not define is corrupt, not an outcome to replay.
func TestRecordWithAnInvalidCodeIsNotReplayed(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	store(t, c, "k", record(t, `{"v":1,"code":99}`, &spb.Status{Code: 99, Message: "garbage"}))
	svc := &payments{}
	client := serve(t, c, svc, nil)
	wantOK(t, charge(withKey(t, "k"), client, chargeReq(1)), "ch_1", false)
	wantDecodeError(t, ev, "code 99")
}

// wantDecodeError checks that the coordinator reported one decode_error
// whose message names what is wrong (contains want).
func wantDecodeError(t *testing.T, ev *events, want string) {
	t.Helper()
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var msgs []string
	for _, e := range ev.all {
		if e.Kind == idemevent.Error && e.ErrorType == idemevent.ErrorDecode {
			msgs = append(msgs, e.Err.Error())
		}
	}
	if len(msgs) != 1 || !strings.Contains(msgs[0], want) {
		t.Fatalf("decode errors = %q, want one that says %q", msgs, want)
	}
}

// TestCorruptRecordsNeverCrashNorReplay feeds records of every kind of
// damage to the server interceptor: none may panic, and each is either
// replayed as the exact response type or status it holds, or healed by a
// run of the handler.
func TestCorruptRecordsNeverCrashNorReplay(t *testing.T) {
	good := record(t, `{"v":1,"code":0,"type":"payments.v1.Charge"}`, &paymentspb.Charge{Id: "ch_stored"})
	records := map[string]string{
		"empty":               "",
		"newline only":        "\n",
		"no envelope":         "not an envelope",
		"json not an object":  "[1,2]\n",
		"json null":           "null\n",
		"json string version": `{"v":"1","code":0,"type":"payments.v1.Charge"}` + "\n",
		"negative code":       `{"v":1,"code":-1}` + "\n",
		"newer version":       `{"v":2,"code":0,"type":"payments.v1.Charge","new":true}` + "\n",
		"older version":       `{"v":0,"code":0,"type":"payments.v1.Charge"}` + "\n",
		"no type":             `{"v":1,"code":0}` + "\n",
		"unknown type":        `{"v":1,"code":0,"type":"no.such.Message"}` + "\n",
		"enum type name":      `{"v":1,"code":0,"type":"google.protobuf.NullValue"}` + "\n",
		"invalid type name":   `{"v":1,"code":0,"type":"..."}` + "\n",
		"truncated response":  good[:len(good)-3],
		"bad wire bytes":      `{"v":1,"code":0,"type":"payments.v1.Charge"}` + "\n\xff\xff\xff",
		"status code OK":      record(t, `{"v":1,"code":0}`, &spb.Status{Code: 0}),
		"status mismatch":     record(t, `{"v":1,"code":5}`, &spb.Status{Code: 3, Message: "x"}),
		"status empty body":   `{"v":1,"code":5}` + "\n",
		"status bad bytes":    `{"v":1,"code":5}` + "\n\xff\xff",
		"status huge code":    record(t, `{"v":1,"code":4294967295}`, &spb.Status{Code: -1}),
		"other type":          record(t, `{"v":1,"code":0,"type":"google.rpc.Status"}`, &spb.Status{Code: 5}),
	}
	for name, rec := range records {
		t.Run(name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			store(t, c, "k", rec)
			intercept := idemgrpc.UnaryServerInterceptor(c)
			info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
			ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idemgrpc.DefaultKeyHeader, "k"))
			ran := 0
			handler := func(context.Context, any) (any, error) {
				ran++
				return &paymentspb.Charge{Id: "ch_fresh"}, nil
			}
			resp, err := intercept(ctx, chargeReq(1), info, handler)
			if err != nil {
				t.Fatalf("interceptor: %v; want the handler's charge (the record heals)", err)
			}
			ch, ok := resp.(*paymentspb.Charge)
			if !ok || ch.GetId() != "ch_fresh" || ran != 1 {
				t.Fatalf("interceptor = %T %v after %d runs, want the fresh *paymentspb.Charge after 1", resp, resp, ran)
			}
			// The healed record replays.
			resp, err = intercept(ctx, chargeReq(1), info, handler)
			if ch, ok := resp.(*paymentspb.Charge); err != nil || !ok || ch.GetId() != "ch_fresh" || ran != 1 {
				t.Fatalf("retry = %T %v, %v after %d runs; want the stored charge", resp, resp, err, ran)
			}
		})
	}
}

// okStatusError is an error whose gRPC status has code OK, which no
// outcome can be replayed as.
type okStatusError struct{}

func (okStatusError) Error() string              { return "ok?" }
func (okStatusError) GRPCStatus() *status.Status { return status.New(codes.OK, "") }

// TestErrorWithStatusOKIsNotStored: a handler error whose status says OK
// is not stored (record_validation_error, the key is released), instead of
// being stored as a record that no retry can read.
func TestErrorWithStatusOKIsNotStored(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	intercept := idemgrpc.UnaryServerInterceptor(c)
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idemgrpc.DefaultKeyHeader, "k"))
	ran := 0
	handler := func(context.Context, any) (any, error) {
		ran++
		return nil, okStatusError{}
	}
	for range 2 {
		if _, err := intercept(ctx, chargeReq(1), info, handler); !errors.Is(err, okStatusError{}) {
			t.Fatalf("interceptor: %v, want the handler's own error", err)
		}
	}
	if ran != 2 {
		t.Fatalf("handler ran %d times, want 2", ran)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	for _, e := range ev.all {
		if e.Kind == idemevent.Error && e.ErrorType == idemevent.ErrorDecode {
			t.Fatalf("a retry met an unreadable record: %v", e.Err)
		}
	}
}

// TestReplayKeepsFieldsThisVersionDoesNotKnow: a response that a newer
// version of the service stored, with a field this binary's Charge does not
// have, replays with that field: the client that knows it gets it.
func TestReplayKeepsFieldsThisVersionDoesNotKnow(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	newer := protowire.AppendTag(nil, 99, protowire.BytesType)
	newer = protowire.AppendString(newer, "settled")
	ch := &paymentspb.Charge{Id: "ch_newer"}
	ch.ProtoReflect().SetUnknown(newer)
	store(t, c, "k", record(t, `{"v":1,"code":0,"type":"payments.v1.Charge","added":"later"}`, ch))
	svc := &payments{}
	r := charge(withKey(t, "k"), serve(t, c, svc, nil), chargeReq(1))
	wantOK(t, r, "ch_newer", true)
	if got := r.charge.ProtoReflect().GetUnknown(); string(got) != string(newer) || svc.n() != 0 {
		t.Fatalf("replayed unknown fields %x after %d runs, want %x and no run", got, svc.n(), newer)
	}
}

// TestResponseTypeNotInTheRegistry: a response whose type no generated code
// registered (a dynamicpb message built from a descriptor at run time)
// cannot be replayed, so it is sent but not stored, with a
// record_validation_error that names the type, and the key is not
// replayable; a dynamicpb message of a registered type is stored and
// replays as the generated type.
func TestResponseTypeNotInTheRegistry(t *testing.T) {
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:        proto.String("dyn/thing.proto"),
		Package:     proto.String("dyn.v1"),
		Syntax:      proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("Thing")}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, ev := newCoordinator(t, nil)
	intercept := idemgrpc.UnaryServerInterceptor(c)
	info := &grpc.UnaryServerInfo{FullMethod: chargeMethod}
	// call makes two calls with key and returns what the second got and how
	// often the handler ran.
	call := func(key string, resp proto.Message) (any, int, error) {
		ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idemgrpc.DefaultKeyHeader, key))
		ran := 0
		var got any
		var err error
		for range 2 {
			got, err = intercept(ctx, chargeReq(1), info, func(context.Context, any) (any, error) {
				ran++
				return resp, nil
			})
		}
		return got, ran, err
	}

	thing := dynamicpb.NewMessage(fd.Messages().Get(0))
	got, ran, err := call("unregistered", thing)
	if got != nil || ran != 1 {
		t.Fatalf("unregistered type: retry got %T after %d runs, want no response after 1 run", got, ran)
	}
	wantRefusal(t, err, codes.AlreadyExists, idemgrpc.ReasonNotReplayable)
	if n, _ := ev.count(idemevent.Error); n != 1 {
		t.Fatalf("%d error events, want 1 record_validation_error", n)
	}
	ev.mu.Lock()
	for _, e := range ev.all {
		if e.Kind == idemevent.Error && (e.ErrorType != idemevent.ErrorRecordValidation ||
			!strings.Contains(e.Err.Error(), "dyn.v1.Thing is not in protoregistry.GlobalTypes")) {
			t.Errorf("error event %v %v, want a record_validation_error naming dyn.v1.Thing", e.ErrorType, e.Err)
		}
	}
	ev.mu.Unlock()

	dyn := dynamicpb.NewMessage((&paymentspb.Charge{}).ProtoReflect().Descriptor())
	dyn.Set(dyn.Descriptor().Fields().ByName("id"), protoreflect.ValueOfString("ch_dyn"))
	got, ran, err = call("registered", dyn)
	if ch, ok := got.(*paymentspb.Charge); !ok || err != nil || ch.GetId() != "ch_dyn" || ran != 1 {
		t.Fatalf("registered type: replay %T %v after %d runs, want the *paymentspb.Charge after 1", got, got, ran)
	}
}
