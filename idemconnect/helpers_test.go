package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconnect"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestMain checks that no test leaves a goroutine behind (HTTP servers and
// connections, the coordinator's background work, the Redis store's
// subscription), and stops the redis-server that the tests start.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// The procedures of the tests' payments service. Its messages are
// google.protobuf.Struct values, so that the tests need no generated code.
const (
	chargeProcedure = "/payments.v1.Payments/Charge"
	getProcedure    = "/payments.v1.Payments/GetCharge"
	watchProcedure  = "/payments.v1.Payments/Watch" // server streaming
)

// schemas returns the method descriptors of the payments service, as
// generated code would pass them to connect.WithSchema; they are not
// registered anywhere.
var schemas = func() func(t *testing.T) protoreflect.ServiceDescriptor {
	var (
		once sync.Once
		sd   protoreflect.ServiceDescriptor
		err  error
	)
	return func(t *testing.T) protoreflect.ServiceDescriptor {
		t.Helper()
		once.Do(func() {
			method := func(name string, streaming bool) *descriptorpb.MethodDescriptorProto {
				return &descriptorpb.MethodDescriptorProto{
					Name:            proto.String(name),
					InputType:       proto.String(".google.protobuf.Struct"),
					OutputType:      proto.String(".google.protobuf.Struct"),
					ServerStreaming: proto.Bool(streaming),
				}
			}
			var fd protoreflect.FileDescriptor
			fd, err = protodesc.NewFile(&descriptorpb.FileDescriptorProto{
				Name:       proto.String("idemconnect_test/payments.proto"),
				Package:    proto.String("payments.v1"),
				Syntax:     proto.String("proto3"),
				Dependency: []string{"google/protobuf/struct.proto"},
				Service: []*descriptorpb.ServiceDescriptorProto{{
					Name:   proto.String("Payments"),
					Method: []*descriptorpb.MethodDescriptorProto{method("Charge", false), method("GetCharge", false), method("Watch", true)},
				}},
			}, protoregistry.GlobalFiles)
			if err == nil {
				sd = fd.Services().Get(0)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return sd
	}
}()

// schema returns the method descriptor of procedure.
func schema(t *testing.T, procedure string) connect.Option {
	t.Helper()
	name := procedure[len("/payments.v1.Payments/"):]
	return connect.WithSchema(schemas(t).Methods().ByName(protoreflect.Name(name)))
}

// events is an Observer that keeps the coordinator's events.
type events struct {
	mu  sync.Mutex
	all []idemevent.Event
}

func (e *events) Observe(_ context.Context, ev idemevent.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
}

// count returns how many events of kind k were seen, and the operations
// they named.
func (e *events) count(k idemevent.Kind) (int, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, ops := 0, []string(nil)
	for _, ev := range e.all {
		if ev.Kind == k {
			n++
			ops = append(ops, ev.Key.Operation)
		}
	}
	return n, ops
}

// redisStore returns the Redis store of the test: on the redis-server that
// redistest starts, under a key prefix of the test's own.
func redisStore(t *testing.T) *redisrepo.Store {
	t.Helper()
	return redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(redistest.Prefix(t)))
}

// newCoordinator returns a coordinator over store (the test's Redis store
// when nil) with an event recorder, closed when the test ends.
func newCoordinator(t *testing.T, store idemstore.Store, opts ...coordinator.Option) (*coordinator.Coordinator, *events) {
	t.Helper()
	if store == nil {
		store = redisStore(t)
	}
	ev := &events{}
	c, err := coordinator.New(store, append([]coordinator.Option{coordinator.WithObserver(ev)}, opts...)...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() }) // waits for the coordinator's background work
	return c, ev
}

// payments is the payments service of the tests: Charge counts its runs
// (the effect) and answers with a charge named after the run, or with what
// fail returns.
type payments struct {
	runs atomic.Int64
	// fail, when set, is asked before each charge with the run's number;
	// a non-nil error is returned instead of the charge.
	fail func(ctx context.Context, n int64) error
}

func (p *payments) charge(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	n := p.runs.Add(1)
	if p.fail != nil {
		if err := p.fail(ctx, n); err != nil {
			return nil, err
		}
	}
	f := req.Msg.GetFields()
	return connect.NewResponse(mustStruct(map[string]any{
		"id":           fmt.Sprintf("ch_%d", n),
		"account":      f["account"].GetStringValue(),
		"amount_cents": f["amount_cents"].GetNumberValue(),
	})), nil
}

func (p *payments) get(_ context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	return connect.NewResponse(mustStruct(map[string]any{"id": req.Msg.GetFields()["id"].GetStringValue()})), nil
}

func (p *payments) watch(_ context.Context, _ *connect.Request[structpb.Struct], stream *connect.ServerStream[structpb.Struct]) error {
	p.runs.Add(1)
	return stream.Send(mustStruct(map[string]any{"id": "ch_1"}))
}

func (p *payments) n() int { return int(p.runs.Load()) }

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

func chargeReq(amount float64) *structpb.Struct {
	return mustStruct(map[string]any{"account": "acct_1", "amount_cents": amount, "currency": "EUR"})
}

// serve serves svc on a real HTTP server (HTTP/1.1 and HTTP/2 without TLS,
// so that gRPC works) with the handler interceptor over c built from opts,
// after the outer interceptors.
func serve(t *testing.T, c *coordinator.Coordinator, svc *payments, opts []idemconnect.Option, outer ...connect.Interceptor) *httptest.Server {
	t.Helper()
	idem, err := idemconnect.NewInterceptor(c, opts...)
	if err != nil {
		t.Fatalf("NewInterceptor: %v", err)
	}
	return serveWith(t, svc, append(outer, idem)...)
}

// serveWith serves svc with interceptors.
func serveWith(t *testing.T, svc *payments, interceptors ...connect.Interceptor) *httptest.Server {
	t.Helper()
	with := connect.WithInterceptors(interceptors...)
	mux := http.NewServeMux()
	mux.Handle(chargeProcedure, connect.NewUnaryHandler(chargeProcedure, svc.charge, with, schema(t, chargeProcedure)))
	mux.Handle(getProcedure, connect.NewUnaryHandler(getProcedure, svc.get, with, schema(t, getProcedure)))
	mux.Handle(watchProcedure, connect.NewServerStreamHandler(watchProcedure, svc.watch, with, schema(t, watchProcedure)))
	return startServer(t, mux)
}

// startServer starts h on a real HTTP server speaking HTTP/1.1 and HTTP/2
// without TLS (h2c), closed when the test ends.
func startServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// protocol is one of the three protocols of a Connect client.
type protocol struct {
	name string
	opts []connect.ClientOption
}

// protocols are Connect's three protocols.
var protocols = []protocol{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

// clients are the clients of the payments service over one protocol.
type clients struct {
	charge *connect.Client[structpb.Struct, structpb.Struct]
	get    *connect.Client[structpb.Struct, structpb.Struct]
	watch  *connect.Client[structpb.Struct, structpb.Struct]
}

// dial returns clients of srv over p, over HTTP/2 without TLS, with opts.
func dial(t *testing.T, srv *httptest.Server, p protocol, opts ...connect.ClientOption) clients {
	t.Helper()
	hp := new(http.Protocols)
	hp.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: hp}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	opts = append(append([]connect.ClientOption{}, p.opts...), opts...)
	return clients{
		charge: connect.NewClient[structpb.Struct, structpb.Struct](hc, srv.URL+chargeProcedure, append(opts, schema(t, chargeProcedure))...),
		get:    connect.NewClient[structpb.Struct, structpb.Struct](hc, srv.URL+getProcedure, append(opts, schema(t, getProcedure))...),
		watch:  connect.NewClient[structpb.Struct, structpb.Struct](hc, srv.URL+watchProcedure, append(opts, schema(t, watchProcedure))...),
	}
}

// withKey returns the test's context carrying key as the idempotency key,
// which a client interceptor sends.
func withKey(t *testing.T, key string) context.Context {
	t.Helper()
	return idemconnect.ContextWithKey(t.Context(), key)
}

// reply is what a test looks at in the outcome of one call.
type reply struct {
	id       string
	msg      *structpb.Struct
	err      error
	header   http.Header // the response header, or the error's metadata
	replayed bool
}

// call makes a Charge call with ctx and req; key, when not empty, is sent
// in the key header (for clients without the client interceptor).
func call(ctx context.Context, cl clients, req *structpb.Struct, key ...string) reply {
	r := connect.NewRequest(req)
	for _, k := range key {
		r.Header().Add(idemconnect.DefaultKeyHeader, k)
	}
	return replyOf(cl.charge.CallUnary(ctx, r))
}

func replyOf(resp *connect.Response[structpb.Struct], err error) reply {
	var r reply
	r.err = err
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			r.header = ce.Meta()
		}
	} else {
		r.msg, r.header = resp.Msg, resp.Header()
		r.id = resp.Msg.GetFields()["id"].GetStringValue()
	}
	r.replayed = r.header.Get(idemconnect.ReplayedHeader) == "true"
	return r
}

// wantOK checks that r is a charge with id, replayed or not.
func wantOK(t *testing.T, r reply, id string, replayed bool) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("Charge: %v, want charge %s", r.err, id)
	}
	if r.id != id || r.replayed != replayed {
		t.Fatalf("Charge = %s (replayed %v), want id %s (replayed %v)", r.id, r.replayed, id, replayed)
	}
}

// details returns the error details of err.
func details(t *testing.T, err error) []proto.Message {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *connect.Error", err)
	}
	var out []proto.Message
	for _, d := range ce.Details() {
		m, err := d.Value()
		if err != nil {
			t.Fatalf("detail %s: %v", d.Type(), err)
		}
		out = append(out, m)
	}
	return out
}

// wantRefusal checks that err is a *connect.Error with code and an
// ErrorInfo of idemconnect's domain with reason, and returns its details.
func wantRefusal(t *testing.T, err error, code connect.Code, reason string) []proto.Message {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("error = %v, want code %v", err, code)
	}
	ds := details(t, err)
	for _, d := range ds {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if info.GetDomain() != idemconnect.ErrorDomain || info.GetReason() != reason {
				t.Fatalf("ErrorInfo = %v, want domain %s, reason %s", info, idemconnect.ErrorDomain, reason)
			}
			return ds
		}
	}
	t.Fatalf("error %v has no ErrorInfo (details %v)", err, ds)
	return nil
}

// retryDelay returns the delay of the RetryInfo among ds, and whether
// there is one.
func retryDelay(ds []proto.Message) (time.Duration, bool) {
	for _, d := range ds {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// clientInterceptor returns a client interceptor with opts.
func clientInterceptor(t *testing.T, opts ...idemconnect.Option) connect.ClientOption {
	t.Helper()
	ci, err := idemconnect.NewClientInterceptor(opts...)
	if err != nil {
		t.Fatalf("NewClientInterceptor: %v", err)
	}
	return connect.WithInterceptors(ci)
}
