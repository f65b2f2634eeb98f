package idemconnect_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// record returns a stored outcome in the envelope that idemgrpc and
// idemconnect share: meta, a newline, the encoding of body.
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

// TestReplayOfIdemgrpcRecords: records as idemgrpc writes them, a response
// and an error status with details, replay over Connect's protocols, so a
// service that moves from grpc-go to connect-go keeps its keys.
func TestReplayOfIdemgrpcRecords(t *testing.T) {
	info, err := anypb.New(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example"})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newCoordinator(t, nil)
	store(t, c, "ok", record(t, `{"v":1,"code":0,"type":"google.protobuf.Struct"}`, mustStruct(map[string]any{"id": "ch_grpc"})))
	store(t, c, "declined", record(t, `{"v":1,"code":9}`, &spb.Status{Code: 9, Message: "card declined", Details: []*anypb.Any{info}}))
	svc := &payments{}
	srv := serve(t, c, svc, nil)
	for _, p := range protocols {
		cl := dial(t, srv, p)
		wantOK(t, call(t.Context(), cl, chargeReq(1), "ok"), "ch_grpc", true)
		r := call(t.Context(), cl, chargeReq(1), "declined")
		ce := new(connect.Error)
		if !r.replayed || !errors.As(r.err, &ce) || ce.Code() != connect.CodeFailedPrecondition || ce.Message() != "card declined" {
			t.Fatalf("%s: %v (replayed %v), want the stored failed_precondition", p.name, r.err, r.replayed)
		}
		if ds := details(t, r.err); len(ds) != 1 || ds[0].(*errdetails.ErrorInfo).GetReason() != "CARD_DECLINED" {
			t.Fatalf("%s: details %v, want the stored ErrorInfo", p.name, ds)
		}
	}
	if svc.n() != 0 {
		t.Fatalf("handler ran %d times, want 0", svc.n())
	}
}

// TestFingerprintEncoding pins the fingerprint, idemgrpc's: a change would
// make every retry across an upgrade, or across the two adapters, a key
// reuse.
func TestFingerprintEncoding(t *testing.T) {
	prefix := redistest.Prefix(t)
	rc := redistest.Server(t)
	c, _ := newCoordinator(t, redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix)))
	cl := dial(t, serve(t, c, &payments{}, nil), protocols[0], connect.WithProtoJSON())
	if r := call(t.Context(), cl, chargeReq(1), "k"); r.err != nil {
		t.Fatal(r.err)
	}
	rec, err := redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix)).Get(t.Context(), idemstore.Key{Operation: "payments.v1.Payments.Charge", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	req, err := proto.MarshalOptions{Deterministic: true}.Marshal(chargeReq(1))
	if err != nil {
		t.Fatal(err)
	}
	var enc []byte
	field := func(b []byte) { enc = binary.BigEndian.AppendUint64(enc, uint64(len(b))); enc = append(enc, b...) }
	field([]byte("idemgrpc/1"))
	field([]byte(chargeProcedure))
	field(req)
	if want := sha256.Sum256(enc); rec.Fingerprint != hex.EncodeToString(want[:]) {
		t.Errorf("fingerprint %s, want %x", rec.Fingerprint, want)
	}
	if !strings.HasPrefix(string(rec.Result), `{"v":1,"code":0,"type":"google.protobuf.Struct"}`+"\n") {
		t.Errorf("record %q, want idemgrpc's envelope", rec.Result)
	}
}

// TestUnreadableRecordsHeal: a record that cannot be read, or that holds
// another type than the procedure's response (known from its schema), is
// never replayed: the handler runs again and its outcome replaces it.
func TestUnreadableRecordsHeal(t *testing.T) {
	for name, rec := range map[string]string{
		"garbage":       "not an envelope",
		"version":       `{"v":99,"code":0,"type":"google.protobuf.Struct"}` + "\n",
		"unknown type":  `{"v":1,"code":0,"type":"no.such.Message"}` + "\n",
		"other type":    record(t, `{"v":1,"code":0,"type":"google.protobuf.StringValue"}`, wrapperspb.String("ch_evil")),
		"bad status":    `{"v":1,"code":5}` + "\n\xff\xff",
		"invalid code":  record(t, `{"v":1,"code":99}`, &spb.Status{Code: 99, Message: "garbage"}),
		"code mismatch": record(t, `{"v":1,"code":5}`, &spb.Status{Code: 3, Message: "x"}),
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			store(t, c, "k", rec)
			svc := &payments{}
			cl := dial(t, serve(t, c, svc, nil), protocols[0])
			wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", false)
			wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", true)
		})
	}
}

// TestReplayAcrossInstances: a second server, with its own coordinator and
// Redis client on the same Redis, as another process or a restarted one
// would have, replays what the first stored.
func TestReplayAcrossInstances(t *testing.T) {
	t.Logf("Redis: %s", redistest.ServerKind(t))
	prefix := redistest.Prefix(t)
	c1, _ := newCoordinator(t, redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(prefix)))
	c2, _ := newCoordinator(t, redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(prefix)))
	svc1, svc2 := &payments{}, &payments{}
	first := dial(t, serve(t, c1, svc1, nil), protocols[1], clientInterceptor(t))
	second := dial(t, serve(t, c2, svc2, nil), protocols[2], clientInterceptor(t))
	ctx := withKey(t, "order-42")
	before := call(ctx, first, chargeReq(1999))
	wantOK(t, before, "ch_1", false)
	after := call(ctx, second, chargeReq(1999))
	wantOK(t, after, "ch_1", true)
	if !proto.Equal(before.msg, after.msg) || svc1.n() != 1 || svc2.n() != 0 {
		t.Fatalf("replay %v after runs %d, %d; want %v after 1, 0", after.msg, svc1.n(), svc2.n(), before.msg)
	}
}
