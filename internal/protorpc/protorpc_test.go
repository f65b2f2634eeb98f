package protorpc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/internal/protorpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDefaultStorePolicy(t *testing.T) {
	stored := map[protorpc.Code]bool{
		protorpc.OK: true, protorpc.InvalidArgument: true, protorpc.NotFound: true, protorpc.AlreadyExists: true,
		protorpc.PermissionDenied: true, protorpc.FailedPrecondition: true, protorpc.OutOfRange: true,
	}
	for c := protorpc.OK; c <= protorpc.MaxCode; c++ {
		if got := protorpc.DefaultStorePolicy(c); got != stored[c] {
			t.Errorf("DefaultStorePolicy(%d) = %v, want %v", c, got, stored[c])
		}
	}
}

func TestRefuse(t *testing.T) {
	for _, tt := range []struct {
		err    error
		code   protorpc.Code
		reason string
		retry  time.Duration
	}{
		{&coordinator.InProgressError{RetryAfter: 300 * time.Millisecond}, protorpc.Aborted, protorpc.ReasonInProgress, 300 * time.Millisecond},
		{&coordinator.InProgressError{RetryAfter: time.Minute}, protorpc.Aborted, protorpc.ReasonInProgress, time.Second},
		{fmt.Errorf("x: %w", coordinator.ErrKeyReuse), protorpc.FailedPrecondition, protorpc.ReasonKeyReuse, 0},
		{coordinator.ErrNotReplayable, protorpc.AlreadyExists, protorpc.ReasonNotReplayable, 0},
		{&coordinator.StorageError{Err: errors.New("dial tcp: refused")}, protorpc.Unavailable, protorpc.ReasonStoreUnavailable, time.Second},
		{context.DeadlineExceeded, protorpc.DeadlineExceeded, "", 0},
		{errors.Join(context.Canceled, errors.New("client gone")), protorpc.Canceled, "", 0},
		{&coordinator.InvalidRequestError{Reason: "TTL 1y is outside"}, protorpc.Internal, "", 0},
		{errors.New("surprise"), protorpc.Internal, "", 0},
	} {
		r := protorpc.Refuse("adapter", tt.err, time.Second)
		if r.Code != tt.code || r.Reason != tt.reason || r.RetryDelay != tt.retry {
			t.Errorf("Refuse(%v) = %d %q %v, want %d %q %v", tt.err, r.Code, r.Reason, r.RetryDelay, tt.code, tt.reason, tt.retry)
		}
		if strings.Contains(r.Message, "refused") {
			t.Errorf("Refuse(%v) leaks the store's error: %q", tt.err, r.Message)
		}
	}
	if r := protorpc.Refuse("adapter", &coordinator.InvalidRequestError{Reason: "TTL 1y is outside"}, time.Second); r.Message != "adapter: the idempotency layer is misconfigured: TTL 1y is outside" {
		t.Errorf("misconfiguration message %q", r.Message)
	}
}

func TestPrepare(t *testing.T) {
	c, err := coordinator.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cs := protorpc.Calls{Adapter: "adapter", Header: "Idempotency-Key", Noun: "header", Nouns: "headers",
		Operation: func(string) string { return "payments.charge" }}
	const proc = "/payments.v1.Payments/Charge"
	req := wrapperspb.String("charge")
	refused := func(values []string, msg any, scope func() (string, error)) string {
		t.Helper()
		_, _, r := cs.Prepare(t.Context(), c, proc, values, msg, scope)
		if r == nil {
			return ""
		}
		return fmt.Sprintf("%d %s %s", r.Code, r.Reason, r.Message)
	}
	for _, tt := range []struct {
		values []string
		msg    any
		scope  func() (string, error)
		want   string
	}{
		{nil, req, nil, ""},
		{[]string{"a", "b"}, req, nil, `3 IDEMPOTENCY_KEY_INVALID the call has 2 "Idempotency-Key" headers; send one`},
		{[]string{""}, req, nil, `3 IDEMPOTENCY_KEY_INVALID the "Idempotency-Key" header must be 1 to 255 visible ASCII characters (0x21-0x7E); it is empty`},
		{[]string{"k"}, req, func() (string, error) { return "", errors.New("who") }, "16 IDEMPOTENCY_CALLER_UNKNOWN the caller could not be identified, so the idempotency key cannot be scoped to it"},
		{[]string{"k"}, "not protobuf", nil, "13  adapter: the request of /payments.v1.Payments/Charge (string) is not a protobuf message"},
	} {
		if got := refused(tt.values, tt.msg, tt.scope); got != tt.want {
			t.Errorf("Prepare(%q, %T) refused %q, want %q", tt.values, tt.msg, got, tt.want)
		}
	}
	call, protect, r := cs.Prepare(t.Context(), c, proc, []string{"k"}, req, func() (string, error) { return "tenant:1", nil })
	if !protect || r != nil || call.Operation != "payments.charge" || call.Key == "k" || !strings.HasSuffix(call.Key, ":k") || len(call.Fingerprint) != 64 {
		t.Errorf("Prepare = %+v %v %v, want a protected call with a scoped key", call, protect, r)
	}
	cs.Required = true
	if got := refused(nil, req, nil); got != `3 IDEMPOTENCY_KEY_MISSING /payments.v1.Payments/Charge requires an idempotency key in the "Idempotency-Key" header` {
		t.Errorf("required: %q", got)
	}
}

func TestCodecResponses(t *testing.T) {
	codec := protorpc.Codec{Adapter: "adapter", Want: "google.protobuf.Struct"}
	msg, err := structpb.NewStruct(map[string]any{"id": "ch_1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := codec.Encode(&protorpc.Outcome{Response: msg})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"v":1,"code":0,"type":"google.protobuf.Struct"}`+"\n") {
		t.Fatalf("record %q", b)
	}
	o, err := codec.Decode(b)
	if err != nil || o.Response.(*structpb.Struct).GetFields()["id"].GetStringValue() != "ch_1" {
		t.Fatalf("Decode = %v, %v", o, err)
	}
	other, err := codec.Encode(&protorpc.Outcome{Response: wrapperspb.String("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := codec.Decode(other); err == nil || !strings.Contains(err.Error(), "the method returns google.protobuf.Struct") {
		t.Fatalf("a record of another type: %v", err)
	}
	if _, err := codec.Encode(&protorpc.Outcome{Response: "not a message"}); err == nil {
		t.Fatal("a response that is not protobuf was encoded")
	}
}

func TestValidProcedure(t *testing.T) {
	for p, want := range map[string]bool{
		"/payments.v1.Payments/Charge": true, "/S/M": true,
		"payments.v1.Payments/Charge": false, "/S/": false, "//M": false, "/S/M/x": false, "/S": false, "": false,
	} {
		if got := protorpc.ValidProcedure(p); got != want {
			t.Errorf("ValidProcedure(%q) = %v, want %v", p, got, want)
		}
	}
}
