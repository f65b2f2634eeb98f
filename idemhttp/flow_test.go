package idemhttp_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
)

// blocking is a handler whose first run waits until release is closed;
// started is closed when that run has begun.
type blocking struct {
	payments
	once             sync.Once
	started, release chan struct{}
}

func newBlocking() *blocking {
	return &blocking{started: make(chan struct{}), release: make(chan struct{})}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	first := false
	b.once.Do(func() { first = true })
	if first {
		close(b.started)
		<-b.release
	}
	b.payments.ServeHTTP(w, r)
}

// inFlight starts a first request that holds the key until the returned
// function is called, which waits for it and returns its response.
func inFlight(t *testing.T, h http.Handler, b *blocking, key string) func() *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- send(h, "POST", "/payments", key, `{}`) }()
	<-b.started
	return func() *httptest.ResponseRecorder {
		close(b.release)
		return <-done
	}
}

func TestInProgressIs409(t *testing.T) {
	t.Run("raise", func(t *testing.T) {
		c, _ := newCoordinator(t, coordinator.WithInFlight(coordinator.InFlightRaise))
		b := newBlocking()
		mux := route("POST /payments", b, idemhttp.Middleware(c))
		finish := inFlight(t, mux, b, "k")
		w := send(mux, "POST", "/payments", "k", `{}`)
		problemOf(t, w, http.StatusConflict, idemhttp.ProblemInProgress)
		// DefaultRetryAfter, not the holder's remaining lease (30s): most
		// actions take milliseconds.
		if ra := w.Header().Get("Retry-After"); ra != "1" {
			t.Errorf("Retry-After = %s, want 1", ra)
		}
		first := finish()
		if retry := send(mux, "POST", "/payments", "k", `{}`); !isReplay(retry) || retry.Body.String() != first.Body.String() {
			t.Fatalf("retry after completion = %d %s replayed %v; want the first response", retry.Code, retry.Body, isReplay(retry))
		}
		if b.n() != 1 {
			t.Fatalf("handler ran %d times, want 1", b.n())
		}
	})
	t.Run("wait past the bound", func(t *testing.T) {
		c, _ := newCoordinator(t, coordinator.WithWaitTimeout(50*time.Millisecond))
		b := newBlocking()
		mux := route("POST /payments", b, idemhttp.Middleware(c))
		finish := inFlight(t, mux, b, "k")
		start := time.Now()
		w := send(mux, "POST", "/payments", "k", `{}`)
		problemOf(t, w, http.StatusConflict, idemhttp.ProblemInProgress)
		retryAfterAtLeast1(t, w)
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Errorf("409 after %v; want it after the 50ms wait", d)
		}
		finish()
	})
	t.Run("wait within the bound replays", func(t *testing.T) {
		c, _ := newCoordinator(t)
		b := newBlocking()
		mux := route("POST /payments", b, idemhttp.Middleware(c))
		finish := inFlight(t, mux, b, "k")
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- send(mux, "POST", "/payments", "k", `{}`) }()
		time.Sleep(20 * time.Millisecond) // let it start waiting
		first := finish()
		if w := <-done; !isReplay(w) || w.Code != 201 || w.Body.String() != first.Body.String() {
			t.Fatalf("waiter = %d %s replayed %v; want the first response", w.Code, w.Body, isReplay(w))
		}
	})
	t.Run("a waiter runs when the first response is not stored", func(t *testing.T) {
		c, _ := newCoordinator(t)
		b := newBlocking()
		fails := true
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if fails {
				fails = false
				b.ServeHTTP(failing{w}, r)
				return
			}
			b.ServeHTTP(w, r)
		})
		mux := route("POST /payments", h, idemhttp.Middleware(c))
		finish := inFlight(t, mux, b, "k")
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- send(mux, "POST", "/payments", "k", `{}`) }()
		time.Sleep(20 * time.Millisecond) // let it start waiting
		if first := finish(); first.Code != http.StatusBadGateway {
			t.Fatalf("first = %d, want 502", first.Code)
		}
		if w := <-done; w.Code != http.StatusCreated || isReplay(w) || b.n() != 2 {
			t.Fatalf("waiter = %d replayed %v after %d runs; want its own 201", w.Code, isReplay(w), b.n())
		}
	})
	t.Run("reuse while in flight is 422", func(t *testing.T) {
		c, _ := newCoordinator(t, coordinator.WithInFlight(coordinator.InFlightRaise))
		b := newBlocking()
		mux := route("POST /payments", b, idemhttp.Middleware(c))
		finish := inFlight(t, mux, b, "k")
		problemOf(t, send(mux, "POST", "/payments", "k", `{"other":1}`), http.StatusUnprocessableEntity, idemhttp.ProblemKeyReuse)
		finish()
	})
}

func TestStoreDown(t *testing.T) {
	t.Run("raise: 503", func(t *testing.T) {
		fs := faultstore.Wrap(memstore.New())
		fs.Fail(idemevent.MethodReserve, errors.New("redis: connection refused"))
		c, _ := newCoordinatorOn(t, fs, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		var p payments
		mux := route("POST /payments", &p, idemhttp.Middleware(c))
		w := send(mux, "POST", "/payments", "k", `{}`)
		prob := problemOf(t, w, http.StatusServiceUnavailable, idemhttp.ProblemStoreUnavailable)
		retryAfterAtLeast1(t, w)
		if strings.Contains(w.Body.String(), "connection refused") {
			t.Fatalf("problem %+v leaks the store's error", prob)
		}
		if p.n() != 0 {
			t.Fatalf("handler ran %d times, want 0", p.n())
		}
		// Once the store is back, the request goes through.
		fs.Reset()
		if w := send(mux, "POST", "/payments", "k", `{}`); w.Code != 201 || isReplay(w) {
			t.Fatalf("after recovery: %d replayed %v, want a fresh 201", w.Code, isReplay(w))
		}
	})
	t.Run("run: unprotected", func(t *testing.T) {
		fs := faultstore.Wrap(memstore.New())
		fs.Fail(idemevent.MethodReserve, nil)
		c, _ := newCoordinatorOn(t, fs)
		var p payments
		mux := route("POST /payments", &p, idemhttp.Middleware(c))
		for range 2 {
			if w := send(mux, "POST", "/payments", "k", `{}`); w.Code != 201 || isReplay(w) {
				t.Fatalf("%d replayed %v, want a fresh 201", w.Code, isReplay(w))
			}
		}
		if p.n() != 2 {
			t.Fatalf("handler ran %d times, want 2 (unprotected)", p.n())
		}
	})
	t.Run("failed save still serves the response", func(t *testing.T) {
		fs := faultstore.Wrap(memstore.New())
		fs.FailOnce(idemevent.MethodComplete, nil) // then stored by the coordinator's retry
		c, _ := newCoordinatorOn(t, fs, coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise))
		var p payments
		mux := route("POST /payments", &p, idemhttp.Middleware(c))
		if w := send(mux, "POST", "/payments", "k", `{}`); w.Code != 201 {
			t.Fatalf("status %d, want 201: once the handler ran, nothing raises", w.Code)
		}
	})
}

func TestScopes(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	scope := func(r *http.Request) (string, error) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "" {
			return "", errors.New("no tenant")
		}
		return tenant, nil
	}
	mux := route("POST /payments", &p, idemhttp.Middleware(c, idemhttp.WithKeyScope(scope)))

	alice := send(mux, "POST", "/payments", "shared-key", `{}`, "X-Tenant", "alice")
	bob := send(mux, "POST", "/payments", "shared-key", `{}`, "X-Tenant", "bob")
	if isReplay(bob) || bob.Body.String() == alice.Body.String() {
		t.Fatalf("bob got %s (replayed %v) with alice's key; want his own response", bob.Body, isReplay(bob))
	}
	aliceAgain := send(mux, "POST", "/payments", "shared-key", `{}`, "X-Tenant", "alice")
	bobAgain := send(mux, "POST", "/payments", "shared-key", `{}`, "X-Tenant", "bob")
	if !isReplay(aliceAgain) || aliceAgain.Body.String() != alice.Body.String() ||
		!isReplay(bobAgain) || bobAgain.Body.String() != bob.Body.String() {
		t.Fatalf("retries: alice %s, bob %s; want each their own first response", aliceAgain.Body, bobAgain.Body)
	}
	// A reused key is judged within the scope only.
	if w := send(mux, "POST", "/payments", "shared-key", `{"x":1}`, "X-Tenant", "carol"); w.Code != 201 {
		t.Fatalf("carol: %d, want 201", w.Code)
	}
	if p.n() != 3 {
		t.Fatalf("handler ran %d times, want 3", p.n())
	}
	// The longest key still fits once scoped.
	long := strings.Repeat("k", coordinator.MaxKeyLen)
	send(mux, "POST", "/payments", long, `{}`, "X-Tenant", "alice")
	if w := send(mux, "POST", "/payments", long, `{}`, "X-Tenant", "alice"); !isReplay(w) {
		t.Fatalf("long key retry = %d %s, want a replay", w.Code, w.Body)
	}
	if w := send(mux, "POST", "/payments", long, `{}`, "X-Tenant", "bob"); isReplay(w) {
		t.Fatal("bob replayed alice's long key")
	}
	problemOf(t, send(mux, "POST", "/payments", "k", `{}`), http.StatusUnauthorized, idemhttp.ProblemCallerUnknown)
}

func TestProblemWriter(t *testing.T) {
	c, _ := newCoordinator(t)
	var got idemhttp.Problem
	write := func(w http.ResponseWriter, r *http.Request, p idemhttp.Problem) {
		got = p
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(p.Status)
		fmt.Fprintf(w, `{"error":{"code":%q}}`, p.Type)
	}
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c,
		idemhttp.WithProblemWriter(write),
		idemhttp.WithKeyScope(func(*http.Request) (string, error) { return "", errors.New("no session") })))
	w := send(mux, "POST", "/payments", "k", `{}`)
	if w.Code != 401 || got.Type != idemhttp.ProblemCallerUnknown || got.Err == nil || got.Err.Error() != "no session" {
		t.Fatalf("status %d, problem %+v; want 401 with the hook's error", w.Code, got)
	}
	if strings.Contains(w.Body.String(), "no session") {
		t.Fatal("the hook's error reached the client")
	}
}

// A failing scope hook gives 401, with the WWW-Authenticate challenge of
// WithAuthChallenge (RFC 9110 requires one on a 401), set before the problem
// writer runs; the handler does not run.
func TestAuthChallenge(t *testing.T) {
	c, _ := newCoordinator(t)
	noScope := idemhttp.WithKeyScope(func(*http.Request) (string, error) { return "", errors.New("no session") })
	var p payments
	t.Run("none by default", func(t *testing.T) {
		w := send(route("POST /payments", &p, idemhttp.Middleware(c, noScope)), "POST", "/payments", "k", `{}`)
		problemOf(t, w, http.StatusUnauthorized, idemhttp.ProblemCallerUnknown)
		if v, ok := w.Header()["Www-Authenticate"]; ok {
			t.Fatalf("WWW-Authenticate = %q without WithAuthChallenge", v)
		}
	})
	t.Run("WithAuthChallenge", func(t *testing.T) {
		var seen string
		mux := route("POST /payments", &p, idemhttp.Middleware(c, noScope,
			idemhttp.WithAuthChallenge(`Bearer realm="api"`),
			idemhttp.WithProblemWriter(func(w http.ResponseWriter, r *http.Request, p idemhttp.Problem) {
				seen = w.Header().Get("WWW-Authenticate")
				idemhttp.WriteProblem(w, p)
			})))
		w := send(mux, "POST", "/payments", "k", `{}`)
		problemOf(t, w, http.StatusUnauthorized, idemhttp.ProblemCallerUnknown)
		if got := w.Header().Values("WWW-Authenticate"); len(got) != 1 || got[0] != `Bearer realm="api"` || seen != got[0] {
			t.Fatalf("WWW-Authenticate = %q (problem writer saw %q), want Bearer realm=\"api\"", got, seen)
		}
		// Other refusals carry no challenge.
		w = send(mux, "POST", "/payments", "a b", `{}`)
		problemOf(t, w, http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
		if v := w.Header().Get("WWW-Authenticate"); v != "" {
			t.Fatalf("400 carries WWW-Authenticate %q", v)
		}
	})
	if p.n() != 0 {
		t.Fatalf("handler ran %d times, want 0", p.n())
	}
}

func TestPanicReleasesTheKey(t *testing.T) {
	c, _ := newCoordinator(t)
	panics := true
	var p payments
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Partial", "1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "half a response")
		if panics {
			panic("boom")
		}
		p.ServeHTTP(w, r)
	})
	mux := route("POST /payments", h, idemhttp.Middleware(c))

	w := httptest.NewRecorder()
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{}`))
		r.Header.Set(idemhttp.KeyHeader, "k")
		mux.ServeHTTP(w, r)
	}()
	if w.Body.Len() != 0 || len(w.Header()) != 0 || w.Flushed {
		t.Fatalf("the panicking handler sent %q with headers %v; want nothing", w.Body, w.Header())
	}

	panics = false
	if w := send(mux, "POST", "/payments", "k", `{}`); w.Code != 201 || isReplay(w) || p.n() != 1 {
		t.Fatalf("retry = %d replayed %v after %d runs; want the handler to run again", w.Code, isReplay(w), p.n())
	}
}

// Through a real server: net/http recovers the panic and drops the
// connection; the retry runs.
func TestPanicThroughServer(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	panics := true
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if panics {
			panics = false
			panic(http.ErrAbortHandler)
		}
		// The recorder exposes the connection's controls.
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("SetWriteDeadline: %v", err)
		}
		p.ServeHTTP(w, r)
	})
	srv := httptest.NewUnstartedServer(route("POST /payments", h, idemhttp.Middleware(c)))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	defer srv.Close()
	post := func() (*http.Response, error) {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(`{}`))
		req.Header.Set(idemhttp.KeyHeader, "k")
		return srv.Client().Do(req)
	}
	if resp, err := post(); err == nil {
		resp.Body.Close()
		t.Fatalf("first request got %d; want the connection dropped", resp.StatusCode)
	}
	resp, err := post()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || p.n() != 1 {
		t.Fatalf("retry = %d after %d runs; want 201 from a second run", resp.StatusCode, p.n())
	}
}

// failing turns the status its handler writes into 502.
type failing struct{ http.ResponseWriter }

func (f failing) WriteHeader(int) { f.ResponseWriter.WriteHeader(http.StatusBadGateway) }

func TestRetryAfterIsConfigurable(t *testing.T) {
	c, _ := newCoordinator(t, coordinator.WithInFlight(coordinator.InFlightRaise))
	b := newBlocking()
	mux := route("POST /payments", b, idemhttp.Middleware(c, idemhttp.WithRetryAfter(2500*time.Millisecond)))
	finish := inFlight(t, mux, b, "k")
	w := send(mux, "POST", "/payments", "k", `{}`)
	problemOf(t, w, http.StatusConflict, idemhttp.ProblemInProgress)
	if ra := w.Header().Get("Retry-After"); ra != "3" {
		t.Errorf("Retry-After = %s, want 3 (2.5s rounded up)", ra)
	}
	finish()
	defer func() {
		if recover() == nil {
			t.Error("WithRetryAfter(0) did not panic")
		}
	}()
	idemhttp.Middleware(c, idemhttp.WithRetryAfter(0))
}

// A request without a key passes through when the key is optional, and is
// counted as unprotected (method "none"), so that a client that forgot the
// header shows in the metrics.
func TestRequestWithoutAKeyIsCountedAsUnprotected(t *testing.T) {
	c, ev := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c, idemhttp.WithOperation("payment.create")))
	if w := send(mux, "POST", "/payments", "", `{}`); w.Code != 201 || p.n() != 1 {
		t.Fatalf("status %d after %d runs, want a 201 from the handler", w.Code, p.n())
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.all) != 1 || ev.all[0].Kind != idemevent.Unprotected || ev.all[0].Method != idemevent.MethodNone ||
		ev.all[0].Key.Operation != "payment.create" {
		t.Fatalf("events = %+v, want one unprotected{none} of payment.create", ev.all)
	}
}
