package idemhttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/internal/redistest"
)

// TestMain checks that no test leaves a goroutine behind, and stops the
// redis-server that the Redis tests start.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

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

// errors returns how many EventError of type t were seen.
func (e *events) errors(t idemevent.ErrorType) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == idemevent.Error && ev.ErrorType == t {
			n++
		}
	}
	return n
}

// operations returns the operations of the misses seen, in order.
func (e *events) operations() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ops []string
	for _, ev := range e.all {
		if ev.Kind == idemevent.Miss {
			ops = append(ops, ev.Key.Operation)
		}
	}
	return ops
}

// newCoordinator returns a coordinator over a fresh memstore, with an event
// recorder.
func newCoordinator(t *testing.T, opts ...coordinator.Option) (*coordinator.Coordinator, *events) {
	t.Helper()
	return newCoordinatorOn(t, memstore.New(), opts...)
}

func newCoordinatorOn(t *testing.T, s idemstore.Store, opts ...coordinator.Option) (*coordinator.Coordinator, *events) {
	t.Helper()
	ev := &events{}
	c, err := coordinator.New(s, append([]coordinator.Option{coordinator.WithObserver(ev)}, opts...)...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() }) // waits for the coordinator's background work
	return c, ev
}

// payments is a handler that counts its runs and answers 201 with a body
// naming the run, a few headers that are replayed and a few that must not
// be.
type payments struct {
	runs atomic.Int64
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", fmt.Sprintf("/payments/pay_%d", n))
	h.Set("ETag", fmt.Sprintf(`"v%d"`, n))
	h.Set("Set-Cookie", fmt.Sprintf("session=s%d; HttpOnly", n))
	h.Set("Authorization", "Bearer secret")
	h.Set("X-Request-Id", fmt.Sprintf("req-%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d","request":%q}`, n, body)
}

func (p *payments) n() int { return int(p.runs.Load()) }

// route returns a mux with h behind the middleware at pattern.
func route(pattern string, h http.Handler, idem func(http.Handler) http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(pattern, idem(h))
	return mux
}

// send serves one request; headers are name, value pairs. A key of ""
// sends no Idempotency-Key header.
func send(h http.Handler, method, target, key, body string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idemhttp.KeyHeader, key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// problemOf checks that w is a problem+json response with status and type,
// and returns it.
func problemOf(t *testing.T, w *httptest.ResponseRecorder, status int, typ string) idemhttp.Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem = %+v, want type %s, status %d, a title and a detail", p, typ, status)
	}
	return p
}

// retryAfterAtLeast1 checks that w has a Retry-After of at least one second.
func retryAfterAtLeast1(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	ra := w.Header().Get("Retry-After")
	var n int
	if _, err := fmt.Sscanf(ra, "%d", &n); err != nil || n < 1 || fmt.Sprint(n) != ra {
		t.Fatalf("Retry-After = %q, want whole seconds >= 1", ra)
	}
}

// post sends one POST /payments with key through a real server and returns
// the response with its body read. The client asks for no transparent gzip.
func post(t *testing.T, srv *httptest.Server, key string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{}`))
	req.Header.Set(idemhttp.KeyHeader, key)
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// direct serves h at POST /payments without the middleware, for comparison.
func direct(h http.Handler) *httptest.Server {
	return httptest.NewServer(route("POST /payments", h, func(h http.Handler) http.Handler { return h }))
}

func isReplay(w *httptest.ResponseRecorder) bool {
	return w.Header().Get(idemhttp.ReplayedHeader) == "true"
}
