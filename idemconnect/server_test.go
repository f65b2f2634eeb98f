package idemconnect_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/idemconnect"
)

// TestReplayOverEveryProtocol sends the same call twice over each of
// Connect's protocols: the handler runs once, and the second answer is the
// first, flagged as a replay.
func TestReplayOverEveryProtocol(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c, ev := newCoordinator(t, nil)
			svc := &payments{}
			cl := dial(t, serve(t, c, svc, nil), p, clientInterceptor(t))

			ctx := withKey(t, "order-42")
			first := call(ctx, cl, chargeReq(1999))
			wantOK(t, first, "ch_1", false)
			retry := call(ctx, cl, chargeReq(1999))
			wantOK(t, retry, "ch_1", true)
			if !proto.Equal(first.msg, retry.msg) {
				t.Fatalf("replay %v differs from the first response %v", retry.msg, first.msg)
			}
			if svc.n() != 1 {
				t.Fatalf("handler ran %d times, want 1", svc.n())
			}
			if _, ops := ev.count(idemevent.Miss); len(ops) != 1 || ops[0] != "payments.v1.Payments.Charge" {
				t.Fatalf("operations = %q, want [payments.v1.Payments.Charge]", ops)
			}
			// Another key is another call.
			wantOK(t, call(withKey(t, "order-43"), cl, chargeReq(1999)), "ch_2", false)
		})
	}
}

// TestStoredErrorIsReplayedWithDetails: an error the store policy keeps is
// replayed over each protocol with its code, message and details.
func TestStoredErrorIsReplayedWithDetails(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{fail: func(context.Context, int64) error {
				e := connect.NewError(connect.CodeFailedPrecondition, errors.New("card declined"))
				d, _ := connect.NewErrorDetail(&errdetails.PreconditionFailure{
					Violations: []*errdetails.PreconditionFailure_Violation{{Type: "CARD", Subject: "acct_1", Description: "insufficient funds"}},
				})
				e.AddDetail(d)
				return e
			}}
			cl := dial(t, serve(t, c, svc, nil), p)
			first := call(t.Context(), cl, chargeReq(1), "k")
			retry := call(t.Context(), cl, chargeReq(1), "k")
			if svc.n() != 1 {
				t.Fatalf("handler ran %d times, want 1", svc.n())
			}
			if first.replayed || !retry.replayed {
				t.Fatalf("replayed: first %v, retry %v; want false, true", first.replayed, retry.replayed)
			}
			var ce *connect.Error
			if !errors.As(retry.err, &ce) || ce.Code() != connect.CodeFailedPrecondition || ce.Message() != "card declined" {
				t.Fatalf("replayed error = %v, want failed_precondition: card declined", retry.err)
			}
			d1, d2 := details(t, first.err), details(t, retry.err)
			if len(d2) != 1 || !proto.Equal(d1[0], d2[0]) {
				t.Fatalf("replayed details %v, want %v", d2, d1)
			}
			if pf, ok := d2[0].(*errdetails.PreconditionFailure); !ok || pf.GetViolations()[0].GetDescription() != "insufficient funds" {
				t.Fatalf("replayed details = %v", d2)
			}
		})
	}
}

// keyRecorder is an interceptor, outside the idempotency one, that records
// the key of every attempt that reaches the server.
type keyRecorder struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			k.mu.Lock()
			k.keys = append(k.keys, req.Header().Values(idemconnect.DefaultKeyHeader)...)
			k.mu.Unlock()
			return next(ctx, req)
		}
	})
}

func (k *keyRecorder) seen() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}

// TestRetryAfterTimeoutKeepsTheKey: a call times out on the client while
// the handler still runs (its effect happens); the client's retry, with the
// context that ContextWithKey gave the call's key, carries the same key,
// waits for the first run and gets its charge back. Over each protocol.
func TestRetryAfterTimeoutKeepsTheKey(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c, ev := newCoordinator(t, nil)
			release := make(chan struct{})
			svc := &payments{fail: func(_ context.Context, n int64) error {
				if n == 1 {
					<-release // a slow payment provider, which finishes whatever the client does
				}
				return nil
			}}
			rec := &keyRecorder{}
			cl := dial(t, serve(t, c, svc, nil, rec.interceptor()), p, clientInterceptor(t))

			ctx := idemconnect.ContextWithKey(t.Context(), idemconnect.NewKey()) // once per logical request
			attempt, cancel := context.WithTimeout(ctx, time.Second)
			r := call(attempt, cl, chargeReq(1999))
			cancel()
			if connect.CodeOf(r.err) != connect.CodeDeadlineExceeded || svc.n() != 1 {
				t.Fatalf("first attempt: %v after %d runs, want deadline_exceeded while the handler runs", r.err, svc.n())
			}
			retried := make(chan reply)
			go func() { retried <- call(ctx, cl, chargeReq(1999)) }()
			waitFor(t, func() bool { n, _ := ev.count(idemevent.InFlight); return n >= 1 }) // the retry waits
			close(release)
			wantOK(t, <-retried, "ch_1", true)
			if svc.n() != 1 {
				t.Fatalf("the charge was made %d times, want 1", svc.n())
			}
			if keys := rec.seen(); len(keys) != 2 || keys[0] != keys[1] || !uuidV4.MatchString(keys[0]) {
				t.Fatalf("keys of the attempts = %q, want one key twice", keys)
			}
		})
	}
}

// TestConcurrentDuplicatesRunTheHandlerOnce: 50 calls with one key, spread
// over the three protocols, run the handler once; the others wait for it
// and get its charge, as a replay.
func TestConcurrentDuplicatesRunTheHandlerOnce(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	release := make(chan struct{})
	svc := &payments{fail: func(context.Context, int64) error {
		<-release
		return nil
	}}
	srv := serve(t, c, svc, nil)
	var cls []clients
	for _, p := range protocols {
		cls = append(cls, dial(t, srv, p))
	}
	const n = 50
	replies := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replies[i] = call(t.Context(), cls[i%len(cls)], chargeReq(1999), "order-42") })
	}
	// Every call but one waits for the first, then let it finish.
	waitFor(t, func() bool { k, _ := ev.count(idemevent.InFlight); return k >= n-1 })
	close(release)
	wg.Wait()

	replayed := 0
	for _, r := range replies {
		if r.err != nil || r.id != "ch_1" {
			t.Fatalf("a caller got %s, %v; want ch_1", r.id, r.err)
		}
		if r.replayed {
			replayed++
		}
	}
	if svc.n() != 1 || replayed != n-1 {
		t.Fatalf("handler ran %d times, %d replays; want 1 and %d", svc.n(), replayed, n-1)
	}
}

// refusalCase provokes one refusal of the handler interceptor over a
// protocol, and returns the handler's runs that the refusal should not have
// caused and the call's error.
type refusalCase struct {
	code   connect.Code
	reason string
	retry  bool // a RetryInfo
	run    func(t *testing.T, p protocol) (runs int, err error)
}

// refusals are the refusals of the handler interceptor, by reason.
var refusals = map[string]refusalCase{
	idemconnect.ReasonKeyMissing: {connect.CodeInvalidArgument, idemconnect.ReasonKeyMissing, false, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, []idemconnect.Option{idemconnect.WithKeyRequired(true)}), p)
		return svc.n(), call(t.Context(), cl, chargeReq(1)).err
	}},
	idemconnect.ReasonKeyInvalid: {connect.CodeInvalidArgument, idemconnect.ReasonKeyInvalid, false, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, nil), p)
		return svc.n(), call(t.Context(), cl, chargeReq(1), "a\tb").err
	}},
	idemconnect.ReasonCallerUnknown: {connect.CodeUnauthenticated, idemconnect.ReasonCallerUnknown, false, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		scope := idemconnect.WithKeyScope(func(context.Context, connect.AnyRequest) (string, error) { return "", errors.New("who?") })
		cl := dial(t, serve(t, c, svc, []idemconnect.Option{scope}), p)
		return svc.n(), call(t.Context(), cl, chargeReq(1), "k").err
	}},
	idemconnect.ReasonInProgress: {connect.CodeAborted, idemconnect.ReasonInProgress, true, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil, coordinator.WithInFlight(coordinator.InFlightRaise))
		started, release := make(chan struct{}), make(chan struct{})
		svc := &payments{fail: func(context.Context, int64) error {
			close(started)
			<-release
			return nil
		}}
		cl := dial(t, serve(t, c, svc, nil), p)
		done := make(chan reply)
		go func() { done <- call(t.Context(), cl, chargeReq(1), "k") }()
		<-started
		r := call(t.Context(), cl, chargeReq(1), "k")
		close(release)
		wantOK(t, <-done, "ch_1", false)
		if p.name == "grpc" {
			if pb := r.header.Get("Grpc-Retry-Pushback-Ms"); pb != "1000" {
				t.Errorf("grpc-retry-pushback-ms = %q, want 1000", pb)
			}
		}
		if r.replayed {
			t.Error("a refusal is marked as a replay")
		}
		return svc.n() - 1, r.err // the first call's run
	}},
	idemconnect.ReasonKeyReuse: {connect.CodeFailedPrecondition, idemconnect.ReasonKeyReuse, false, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, nil), p)
		wantOK(t, call(t.Context(), cl, chargeReq(1999), "k"), "ch_1", false)
		return svc.n() - 1, call(t.Context(), cl, chargeReq(5000), "k").err
	}},
	idemconnect.ReasonNotReplayable: {connect.CodeAlreadyExists, idemconnect.ReasonNotReplayable, false, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil, coordinator.WithMaxResultBytes(16))
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, nil), p)
		wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", false)
		return svc.n() - 1, call(t.Context(), cl, chargeReq(1), "k").err
	}},
	idemconnect.ReasonStoreUnavailable: {connect.CodeUnavailable, idemconnect.ReasonStoreUnavailable, true, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, storeDown(t), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, nil), p)
		r := call(t.Context(), cl, chargeReq(1), "k")
		if ce := new(connect.Error); errors.As(r.err, &ce) && strings.Contains(ce.Message(), faultstore.ErrInjected.Error()) {
			t.Errorf("the message %q leaks the store's error", ce.Message())
		}
		return svc.n(), r.err
	}},
	idemconnect.ReasonStreamingUnsupported: {connect.CodeUnimplemented, idemconnect.ReasonStreamingUnsupported, false, func(t *testing.T, p protocol) (int, error) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, nil), p)
		req := connect.NewRequest(chargeReq(1))
		req.Header().Set(idemconnect.DefaultKeyHeader, "k")
		stream, err := cl.watch.CallServerStream(t.Context(), req)
		if err != nil {
			return svc.n(), err
		}
		defer stream.Close()
		for stream.Receive() {
		}
		return svc.n(), stream.Err()
	}},
}

// storeDown returns the test's Redis store, wrapped so that reserving and
// reading fail, as they do when Redis is unreachable.
func storeDown(t *testing.T) *faultstore.Store {
	t.Helper()
	fs := faultstore.Wrap(redisStore(t))
	fs.Fail(idemevent.MethodReserve, nil)
	fs.Fail(idemevent.MethodGet, nil)
	return fs
}

// TestRefusals provokes every refusal over each protocol and checks its
// code, its ErrorInfo, its RetryInfo, and that the handler did not run.
func TestRefusals(t *testing.T) {
	for reason, rc := range refusals {
		for _, p := range protocols {
			t.Run(reason+"/"+p.name, func(t *testing.T) {
				runs, err := rc.run(t, p)
				ds := wantRefusal(t, err, rc.code, rc.reason)
				d, ok := retryDelay(ds)
				switch {
				case rc.retry && (!ok || d != idemconnect.DefaultRetryAfter):
					t.Errorf("RetryInfo delay %v (present %v), want %v", d, ok, idemconnect.DefaultRetryAfter)
				case !rc.retry && ok:
					t.Errorf("a RetryInfo of %v: a retry gets the same answer", d)
				}
				if runs != 0 {
					t.Errorf("the handler ran %d times", runs)
				}
			})
		}
	}
}

func TestStoreDownRunsUnprotectedByDefault(t *testing.T) {
	c, _ := newCoordinator(t, storeDown(t))
	svc := &payments{}
	cl := dial(t, serve(t, c, svc, nil), protocols[0])
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", false)
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_2", false)
}

func TestRetryAfterOption(t *testing.T) {
	c, _ := newCoordinator(t, storeDown(t), coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
	cl := dial(t, serve(t, c, &payments{}, []idemconnect.Option{idemconnect.WithRetryAfter(250 * time.Millisecond)}), protocols[1])
	r := call(t.Context(), cl, chargeReq(1), "k")
	ds := wantRefusal(t, r.err, connect.CodeUnavailable, idemconnect.ReasonStoreUnavailable)
	if d, _ := retryDelay(ds); d != 250*time.Millisecond {
		t.Fatalf("RetryInfo delay = %v, want 250ms", d)
	}
	if pb := r.header.Get("Grpc-Retry-Pushback-Ms"); pb != "250" {
		t.Fatalf("grpc-retry-pushback-ms = %q, want 250", pb)
	}
}

func TestStorePolicy(t *testing.T) {
	tests := []struct {
		name   string
		code   connect.Code
		policy func(connect.Code) bool
		stored bool
	}{
		{"InvalidArgument stored", connect.CodeInvalidArgument, nil, true},
		{"NotFound stored", connect.CodeNotFound, nil, true},
		{"Unavailable not stored", connect.CodeUnavailable, nil, false},
		{"Internal not stored", connect.CodeInternal, nil, false},
		{"Aborted not stored", connect.CodeAborted, nil, false},
		{"Unauthenticated not stored", connect.CodeUnauthenticated, nil, false},
		{"Unavailable stored by a policy", connect.CodeUnavailable, func(c connect.Code) bool {
			return c == connect.CodeUnavailable || idemconnect.DefaultStorePolicy(c)
		}, true},
		{"InvalidArgument not stored by a policy", connect.CodeInvalidArgument, func(c connect.Code) bool { return c == idemconnect.CodeOK }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{fail: func(_ context.Context, n int64) error {
				if n == 1 {
					return connect.NewError(tt.code, errors.New("first attempt"))
				}
				return nil
			}}
			cl := dial(t, serve(t, c, svc, []idemconnect.Option{idemconnect.WithStorePolicy(tt.policy)}), protocols[0])
			first := call(t.Context(), cl, chargeReq(1), "k")
			if connect.CodeOf(first.err) != tt.code || first.replayed {
				t.Fatalf("first call: %v (replayed %v), want %v", first.err, first.replayed, tt.code)
			}
			retry := call(t.Context(), cl, chargeReq(1), "k")
			if tt.stored {
				if connect.CodeOf(retry.err) != tt.code || !retry.replayed || svc.n() != 1 {
					t.Fatalf("retry: %v (replayed %v), %d runs; want the stored %v, 1 run", retry.err, retry.replayed, svc.n(), tt.code)
				}
				return
			}
			wantOK(t, retry, "ch_2", false)
		})
	}
}

func TestDefaultStorePolicy(t *testing.T) {
	stored := map[connect.Code]bool{
		idemconnect.CodeOK: true, connect.CodeInvalidArgument: true, connect.CodeNotFound: true, connect.CodeAlreadyExists: true,
		connect.CodePermissionDenied: true, connect.CodeFailedPrecondition: true, connect.CodeOutOfRange: true,
	}
	for code := idemconnect.CodeOK; code <= connect.CodeUnauthenticated; code++ {
		if got := idemconnect.DefaultStorePolicy(code); got != stored[code] {
			t.Errorf("DefaultStorePolicy(%v) = %v, want %v", code, got, stored[code])
		}
	}
}

// TestPlainErrorNotStored: an error that is not a *connect.Error is
// Unknown, which is not stored, and reaches the client as Connect sends it.
func TestPlainErrorNotStored(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{fail: func(_ context.Context, n int64) error {
		if n == 1 {
			return errors.New("provider timeout")
		}
		return nil
	}}
	cl := dial(t, serve(t, c, svc, nil), protocols[0])
	if r := call(t.Context(), cl, chargeReq(1), "k"); connect.CodeOf(r.err) != connect.CodeUnknown {
		t.Fatalf("first call: %v, want unknown", r.err)
	}
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_2", false)
}

// TestFingerprintIsDeterministic: a request with a map (a Struct), which
// the client encodes in a random order, is the same request on every retry,
// in JSON as in binary.
func TestFingerprintIsDeterministic(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	srv := serve(t, c, svc, nil)
	req := chargeReq(1)
	for _, k := range strings.Fields("a b c d e f g h i j k l m n o p") {
		req.Fields[k] = structpb.NewStringValue(k + k)
	}
	bin, json := dial(t, srv, protocols[0]), dial(t, srv, protocols[0], connect.WithProtoJSON())
	wantOK(t, call(t.Context(), bin, req, "k"), "ch_1", false)
	for i := range 10 {
		cl := bin
		if i%2 == 1 {
			cl = json
		}
		wantOK(t, call(t.Context(), cl, req, "k"), "ch_1", true)
	}
}

func TestInvalidKeyMessages(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	cl := dial(t, serve(t, c, svc, nil), protocols[0])
	const rule = `the "Idempotency-Key" header must be 1 to 255 visible ASCII characters (0x21-0x7E); `
	for _, tt := range []struct {
		keys []string
		want string
	}{
		{[]string{""}, rule + "it is empty"},
		{[]string{"order 42"}, rule + "it has byte 0x20 at offset 5"},
		{[]string{strings.Repeat("k", 300)}, rule + "it is 300 bytes long"},
		{[]string{"a", "b"}, `the call has 2 "Idempotency-Key" headers; send one`},
	} {
		r := call(t.Context(), cl, chargeReq(1), tt.keys...)
		wantRefusal(t, r.err, connect.CodeInvalidArgument, idemconnect.ReasonKeyInvalid)
		if ce := new(connect.Error); !errors.As(r.err, &ce) || ce.Message() != tt.want {
			t.Errorf("keys %.10q: message %q, want %q", tt.keys, ce.Message(), tt.want)
		}
	}
	if svc.n() != 0 {
		t.Fatalf("handler ran %d times, want 0", svc.n())
	}
}

func TestMissingKey(t *testing.T) {
	t.Run("passes through, reported unprotected", func(t *testing.T) {
		c, ev := newCoordinator(t, nil)
		cl := dial(t, serve(t, c, &payments{}, nil), protocols[0])
		wantOK(t, call(t.Context(), cl, chargeReq(1)), "ch_1", false)
		wantOK(t, call(t.Context(), cl, chargeReq(1)), "ch_2", false)
		if n, ops := ev.count(idemevent.Unprotected); n != 2 || ops[0] != "payments.v1.Payments.Charge" {
			t.Fatalf("unprotected events: %d %q, want 2 of payments.v1.Payments.Charge", n, ops)
		}
	})
	t.Run("required: only for the procedures named", func(t *testing.T) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, []idemconnect.Option{
			idemconnect.WithKeyRequired(true), idemconnect.WithProcedures(chargeProcedure),
		}), protocols[0])
		wantRefusal(t, call(t.Context(), cl, chargeReq(1)).err, connect.CodeInvalidArgument, idemconnect.ReasonKeyMissing)
		// GetCharge is not among the procedures: it needs no key.
		if _, err := cl.get.CallUnary(t.Context(), connect.NewRequest(mustStruct(map[string]any{"id": "ch_1"}))); err != nil {
			t.Fatalf("GetCharge: %v", err)
		}
	})
}

// tenantOf is a scope hook that reads the caller from an X-Tenant header,
// standing in for what authentication establishes.
func tenantOf(_ context.Context, req connect.AnyRequest) (string, error) {
	if t := req.Header().Get("X-Tenant"); t != "" {
		return "tenant:" + t, nil
	}
	return "", errors.New("no tenant")
}

func TestKeyScopeSeparatesTenants(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	cl := dial(t, serve(t, c, &payments{}, []idemconnect.Option{idemconnect.WithKeyScope(tenantOf)}), protocols[1])
	as := func(tenant string) reply {
		req := connect.NewRequest(chargeReq(1))
		req.Header().Set(idemconnect.DefaultKeyHeader, "order-42")
		if tenant != "" {
			req.Header().Set("X-Tenant", tenant)
		}
		return replyOf(cl.charge.CallUnary(t.Context(), req))
	}
	wantOK(t, as("alice"), "ch_1", false)
	wantOK(t, as("bob"), "ch_2", false) // not alice's charge
	wantOK(t, as("alice"), "ch_1", true)
	wantOK(t, as("bob"), "ch_2", true)
	wantRefusal(t, as("").err, connect.CodeUnauthenticated, idemconnect.ReasonCallerUnknown)
}

func TestKillSwitchStepsAside(t *testing.T) {
	c, _ := newCoordinator(t, nil, coordinator.WithEnabled(false))
	svc := &payments{}
	cl := dial(t, serve(t, c, svc, []idemconnect.Option{idemconnect.WithKeyRequired(true), idemconnect.WithProcedures(chargeProcedure, watchProcedure)}), protocols[0])
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", false)
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_2", false)
	wantOK(t, call(t.Context(), cl, chargeReq(1), "a b"), "ch_3", false) // not even checked
	wantOK(t, call(t.Context(), cl, chargeReq(1)), "ch_4", false)
	stream, err := cl.watch.CallServerStream(t.Context(), connect.NewRequest(chargeReq(1)))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	for stream.Receive() {
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("a stream with the coordinator disabled: %v", err)
	}
}

func TestWithOperation(t *testing.T) {
	c, ev := newCoordinator(t, nil)
	cl := dial(t, serve(t, c, &payments{}, []idemconnect.Option{idemconnect.WithOperation(func(p string) string {
		if p == chargeProcedure {
			return "payment.charge"
		}
		return "bad name!"
	})}), protocols[0])
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", false)
	if _, ops := ev.count(idemevent.Miss); len(ops) != 1 || ops[0] != "payment.charge" {
		t.Fatalf("operations = %q, want [payment.charge]", ops)
	}
	req := connect.NewRequest(mustStruct(map[string]any{"id": "x"}))
	req.Header().Set(idemconnect.DefaultKeyHeader, "k")
	if _, err := cl.get.CallUnary(t.Context(), req); connect.CodeOf(err) != connect.CodeInternal {
		t.Fatalf("GetCharge with an invalid operation name: %v, want internal", err)
	}
}

func TestTTLOutsideBoundsIsInternal(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	cl := dial(t, serve(t, c, svc, []idemconnect.Option{idemconnect.WithTTL(365 * 24 * time.Hour)}), protocols[0])
	r := call(t.Context(), cl, chargeReq(1), "k")
	if connect.CodeOf(r.err) != connect.CodeInternal || svc.n() != 0 {
		t.Fatalf("Charge: %v after %d runs, want internal and no run", r.err, svc.n())
	}
	if ce := new(connect.Error); !errors.As(r.err, &ce) || !strings.Contains(ce.Message(), "TTL 8760h0m0s is outside") {
		t.Fatalf("message %q does not say that the TTL is out of bounds", r.err)
	}
}

// TestTooLargeResponseRunsOnce: a response over the coordinator's result
// limit, sent by ten concurrent calls with one key, runs the handler once;
// the first caller gets it, the others AlreadyExists.
func TestTooLargeResponseRunsOnce(t *testing.T) {
	c, _ := newCoordinator(t, nil, coordinator.WithMaxResultBytes(64))
	svc := &payments{fail: func(context.Context, int64) error {
		time.Sleep(20 * time.Millisecond) // let the duplicates collide
		return nil
	}}
	cl := dial(t, serve(t, c, svc, nil), protocols[1])
	big := mustStruct(map[string]any{"account": strings.Repeat("a", 200), "amount_cents": 1})
	replies := make([]reply, 10)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Go(func() { replies[i] = call(t.Context(), cl, big, "k") })
	}
	wg.Wait()
	ok := 0
	for _, r := range replies {
		if r.err == nil {
			wantOK(t, r, "ch_1", false)
			ok++
			continue
		}
		wantRefusal(t, r.err, connect.CodeAlreadyExists, idemconnect.ReasonNotReplayable)
	}
	if ok != 1 || svc.n() != 1 {
		t.Fatalf("%d calls got the charge, %d runs; want 1 and 1", ok, svc.n())
	}
}

// TestStreamingRefused: a streaming call that asks for protection it
// cannot have is refused, by the client interceptor before it is sent, or
// by the handler interceptor; one that does not ask passes through.
func TestStreamingRefused(t *testing.T) {
	receive := func(t *testing.T, cl clients, ctx context.Context, key string) error {
		t.Helper()
		req := connect.NewRequest(chargeReq(1))
		if key != "" {
			req.Header().Set(idemconnect.DefaultKeyHeader, key)
		}
		stream, err := cl.watch.CallServerStream(ctx, req)
		if err != nil {
			return err
		}
		defer stream.Close()
		for stream.Receive() {
		}
		return stream.Err()
	}
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			c, _ := newCoordinator(t, nil)
			svc := &payments{}
			srv := serve(t, c, svc, nil)
			plain := dial(t, srv, p, clientInterceptor(t))
			if err := receive(t, plain, t.Context(), ""); err != nil || svc.n() != 1 {
				t.Fatalf("a stream without a key: %v after %d runs, want it served", err, svc.n())
			}
			// The client interceptor refuses a stream with a key of the
			// caller's, without sending it.
			wantRefusal(t, receive(t, plain, withKey(t, "k"), ""), connect.CodeUnimplemented, idemconnect.ReasonStreamingUnsupported)
			// The server refuses a stream whose request has a key.
			wantRefusal(t, receive(t, plain, t.Context(), "k"), connect.CodeUnimplemented, idemconnect.ReasonStreamingUnsupported)
			// A client that names the procedure refuses every stream of it.
			named := dial(t, srv, p, clientInterceptor(t, idemconnect.WithProcedures(watchProcedure)))
			wantRefusal(t, receive(t, named, t.Context(), ""), connect.CodeUnimplemented, idemconnect.ReasonStreamingUnsupported)
			if svc.n() != 1 {
				t.Fatalf("the stream handler ran %d times, want 1", svc.n())
			}
		})
	}
	t.Run("procedure named on the server", func(t *testing.T) {
		c, _ := newCoordinator(t, nil)
		svc := &payments{}
		cl := dial(t, serve(t, c, svc, []idemconnect.Option{idemconnect.WithProcedures(chargeProcedure, watchProcedure)}), protocols[0])
		wantRefusal(t, receive(t, cl, t.Context(), ""), connect.CodeUnimplemented, idemconnect.ReasonStreamingUnsupported)
		if svc.n() != 0 {
			t.Fatalf("the stream handler ran %d times, want 0", svc.n())
		}
	})
}

// TestInterceptorsOnTheWrongSide: the handler interceptor on a client, or
// the client interceptor on a handler, fails every call with Internal.
func TestInterceptorsOnTheWrongSide(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	svc := &payments{}
	ci, err := idemconnect.NewClientInterceptor()
	if err != nil {
		t.Fatal(err)
	}
	onHandler := dial(t, serveWith(t, svc, ci), protocols[0])
	if r := call(t.Context(), onHandler, chargeReq(1)); connect.CodeOf(r.err) != connect.CodeInternal || !strings.Contains(r.err.Error(), "NewInterceptor") {
		t.Fatalf("client interceptor on a handler: %v, want internal", r.err)
	}
	idem, err := idemconnect.NewInterceptor(c)
	if err != nil {
		t.Fatal(err)
	}
	onClient := dial(t, serveWith(t, svc), protocols[0], connect.WithInterceptors(idem))
	if r := call(t.Context(), onClient, chargeReq(1)); connect.CodeOf(r.err) != connect.CodeInternal || !strings.Contains(r.err.Error(), "NewClientInterceptor") {
		t.Fatalf("handler interceptor on a client: %v, want internal", r.err)
	}
	if svc.n() != 0 {
		t.Fatalf("handler ran %d times, want 0", svc.n())
	}
}

// typeRecorder is an interceptor outside the idempotency one, as a
// logging interceptor would be, that records the Go type of every response
// message and header it sees.
type typeRecorder struct {
	mu    sync.Mutex
	types []string
}

func (r *typeRecorder) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if err == nil {
				r.mu.Lock()
				r.types = append(r.types, typeName(resp.Any())+" "+resp.Header().Get(idemconnect.ReplayedHeader))
				r.mu.Unlock()
			}
			return resp, err
		}
	})
}

func typeName(v any) string {
	if m, ok := v.(proto.Message); ok {
		return string(m.ProtoReflect().Descriptor().FullName())
	}
	return "not a message"
}

// TestOuterInterceptorSeesTheMessage: an interceptor outside the
// idempotency one gets, from a replayed response, the stored message of the
// procedure's response type and the replay header.
func TestOuterInterceptorSeesTheMessage(t *testing.T) {
	c, _ := newCoordinator(t, nil)
	rec := &typeRecorder{}
	cl := dial(t, serve(t, c, &payments{}, nil, rec.interceptor()), protocols[0])
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", false)
	wantOK(t, call(t.Context(), cl, chargeReq(1), "k"), "ch_1", true)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if want := []string{"google.protobuf.Struct ", "google.protobuf.Struct true"}; strings.Join(rec.types, ",") != strings.Join(want, ",") {
		t.Fatalf("the outer interceptor saw %q, want %q", rec.types, want)
	}
}
