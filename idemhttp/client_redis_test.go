package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// logicalRequests is how many logical requests the client tests send at
// once.
const logicalRequests = 50

// attemptTimeout is the client's timeout per attempt. The first attempt of
// every logical request outlasts it; the Transport's wait on the 409
// (Retry-After: 1) and the replay usually fit in it, and when a busy
// machine makes them not fit, the retry client tries again with the same
// key, which the tests allow.
const attemptTimeout = 2 * time.Second

// order is what the server saw of one logical request.
type order struct {
	attempts  atomic.Int64 // requests that reached the server
	effects   atomic.Int64 // runs of the handler
	conflicts atomic.Int64 // 409 answers

	mu       sync.Mutex
	keys     map[string]bool // the Idempotency-Key values sent
	blocker  int64           // the attempt whose handler run blocks; 0: none yet
	release  chan struct{}   // closed when another attempt has been answered
	released bool
}

// orderServer serves POST /orders behind the middleware, on a coordinator
// over the real Redis in in-flight mode raise. The first handler run of each
// logical request (named by the X-Order header, which the fingerprint does
// not include) blocks until another attempt of the same logical request has
// been answered: it outlasts the client's timeout, so the client retries
// while it still runs, and that retry gets 409 in-progress. No sleep: the
// run ends when the retry has happened.
type orderServer struct {
	srv    *httptest.Server
	orders []*order
}

type attemptKey struct{}

func newOrderServer(t *testing.T) *orderServer {
	t.Helper()
	rc := redis.NewClient(redistest.ServerOptions(t))
	t.Cleanup(func() { _ = rc.Close() })
	c, _ := newCoordinatorOn(t, redisrepo.New(rc, redisrepo.WithKeyPrefix(redistest.Prefix(t))),
		coordinator.WithInFlight(coordinator.InFlightRaise))
	s := &orderServer{orders: make([]*order, logicalRequests)}
	for i := range s.orders {
		s.orders[i] = &order{keys: map[string]bool{}, release: make(chan struct{})}
	}
	stop := t.Context().Done() // lets a blocked run end when a failing test gives up
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := s.order(r)
		run := o.effects.Add(1)
		o.mu.Lock()
		first := o.blocker == 0
		if first {
			o.blocker = r.Context().Value(attemptKey{}).(int64)
		}
		o.mu.Unlock()
		if first {
			select {
			case <-o.release:
			case <-stop:
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q,"run":%d}`, r.Header.Get("X-Order"), run)
	})
	mux := route("POST /orders", handler, idemhttp.Middleware(c))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := s.order(r)
		n := o.attempts.Add(1)
		o.mu.Lock()
		for _, k := range r.Header.Values(idemhttp.KeyHeader) {
			o.keys[k] = true
		}
		o.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w}
		mux.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), attemptKey{}, n)))
		if sw.status == http.StatusConflict {
			o.conflicts.Add(1)
		}
		o.mu.Lock()
		if o.blocker != 0 && o.blocker != n && !o.released {
			o.released = true
			close(o.release)
		}
		o.mu.Unlock()
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *orderServer) order(r *http.Request) *order {
	i, err := strconv.Atoi(r.Header.Get("X-Order"))
	if err != nil || i < 0 || i >= len(s.orders) {
		panic("bad X-Order " + r.Header.Get("X-Order"))
	}
	return s.orders[i]
}

// statusWriter notes the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// newRequest returns logical request i: a POST /orders with GetBody.
func (s *orderServer) newRequest(t *testing.T, ctx context.Context, i int) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Order", strconv.Itoa(i))
	return req
}

// client returns an http.Client with the per-attempt timeout whose
// transport is tr, or the server's own when tr is nil.
func (s *orderServer) client(tr http.RoundTripper) *http.Client {
	if tr == nil {
		tr = s.srv.Client().Transport
	}
	return &http.Client{Transport: tr, Timeout: attemptTimeout}
}

// transport returns a Transport over the server's own transport, whose idle
// connections the server closes when it closes.
func (s *orderServer) transport(t *testing.T) *idemhttp.Transport {
	t.Helper()
	return newTransport(t, s.srv.Client().Transport)
}

// retryClient returns a go-retryablehttp client over hc, with short waits
// and without its log.
func retryClient(hc *http.Client) *retryablehttp.Client {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = hc
	rc.RetryMax = 10
	rc.RetryWaitMin, rc.RetryWaitMax = 10*time.Millisecond, 50*time.Millisecond
	rc.Logger = nil
	return rc
}

// maxAttempts bounds the plain retry loops, as go-retryablehttp's RetryMax
// bounds its.
const maxAttempts = 10

// retryLoop is a plain retry loop: it sends attempt(n) until one gets a
// response, and returns the last response or error.
func retryLoop(client *http.Client, attempt func(n int) *http.Request) (resp *http.Response, err error) {
	for n := range maxAttempts {
		if resp, err = client.Do(attempt(n)); err == nil {
			return resp, nil
		}
	}
	return nil, err
}

// rewind gives req a fresh body for another send.
func rewind(req *http.Request) *http.Request {
	req.Body, _ = req.GetBody()
	return req
}

// send runs one logical request to its final response.
type sendFunc func(t *testing.T, s *orderServer, i int) (*http.Response, error)

// The ways a client retries, each of which must keep one key per logical
// request.
var retrying = []struct {
	name string
	send sendFunc
}{
	{"go-retryablehttp over the Transport", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
		req, err := retryablehttp.FromRequest(s.newRequest(t, t.Context(), i))
		if err != nil {
			t.Fatal(err)
		}
		return retryClient(s.client(s.transport(t))).Do(req)
	}},
	{"the Transport over go-retryablehttp", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
		inner := &retryablehttp.RoundTripper{Client: retryClient(s.client(nil))}
		return (&http.Client{Transport: newTransport(t, inner)}).Do(s.newRequest(t, t.Context(), i))
	}},
	{"a loop sending the same request", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
		client, req := s.client(s.transport(t)), s.newRequest(t, t.Context(), i)
		return retryLoop(client, func(int) *http.Request { return rewind(req) })
	}},
	{"a loop sending clones, SetKey before it", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
		client, req := s.client(s.transport(t)), s.newRequest(t, t.Context(), i)
		if err := idemhttp.SetKey(req, idemhttp.NewKey()); err != nil {
			t.Fatal(err)
		}
		return retryLoop(client, func(int) *http.Request { return rewind(req.Clone(t.Context())) })
	}},
	{"a loop sending clones, ContextWithKey before it", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
		ctx := idemhttp.ContextWithKey(t.Context(), idemhttp.NewKey())
		client, req := s.client(s.transport(t)), s.newRequest(t, ctx, i)
		return retryLoop(client, func(int) *http.Request { return rewind(req.Clone(ctx)) })
	}},
}

// sendAll sends the logical requests at once and returns their final
// responses' statuses, replay marks and bodies, or fails the test.
func sendAll(t *testing.T, s *orderServer, send sendFunc) (status []int, replayed []bool, body []string) {
	t.Helper()
	status, replayed, body = make([]int, logicalRequests), make([]bool, logicalRequests), make([]string, logicalRequests)
	var wg sync.WaitGroup
	for i := range logicalRequests {
		wg.Go(func() {
			resp, err := send(t, s, i)
			if err != nil {
				t.Errorf("logical request %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			status[i], replayed[i], body[i] = resp.StatusCode, idemhttp.Replayed(resp), string(b)
		})
	}
	wg.Wait()
	return status, replayed, body
}

// Fifty logical requests at once, each retried through a client timeout
// while its first attempt still runs, get 409 in-progress, wait it out and
// get the first attempt's response replayed: one key and one effect per
// logical request, whichever way the client retries.
func TestTransportOneEffectPerLogicalRequest(t *testing.T) {
	for _, tc := range retrying {
		t.Run(tc.name, func(t *testing.T) {
			s := newOrderServer(t)
			status, replayed, body := sendAll(t, s, tc.send)
			for i, o := range s.orders {
				o.mu.Lock()
				keys := len(o.keys)
				o.mu.Unlock()
				want := fmt.Sprintf(`{"order":"%d","run":1}`, i)
				if o.effects.Load() != 1 || keys != 1 || status[i] != http.StatusCreated || !replayed[i] || body[i] != want {
					t.Errorf("logical request %d: %d effects, %d keys over %d attempts; got %d replayed %v %s; want 1 effect, 1 key, the first run's response replayed",
						i, o.effects.Load(), keys, o.attempts.Load(), status[i], replayed[i], body[i])
				}
				if o.conflicts.Load() < 1 || o.attempts.Load() < 3 {
					t.Errorf("logical request %d: %d attempts, %d of them 409; want a timeout, a 409 and the replay at least", i, o.attempts.Load(), o.conflicts.Load())
				}
			}
		})
	}
}

// The control: a client that makes a fresh key per retry, the common
// mistake, runs the effect again, so the test above can tell.
func TestFreshKeyPerRetryRunsTheEffectAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		send sendFunc
	}{
		{"a new key set in the loop", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
			client, req := s.client(nil), s.newRequest(t, t.Context(), i)
			return retryLoop(client, func(int) *http.Request {
				r := rewind(req.Clone(t.Context()))
				r.Header.Set(idemhttp.KeyHeader, idemhttp.NewKey())
				return r
			})
		}},
		{"clones of a request never sent, through the Transport", func(t *testing.T, s *orderServer, i int) (*http.Response, error) {
			client, req := s.client(s.transport(t)), s.newRequest(t, t.Context(), i)
			return retryLoop(client, func(int) *http.Request { return rewind(req.Clone(t.Context())) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newOrderServer(t)
			status, replayed, _ := sendAll(t, s, tc.send)
			for i, o := range s.orders {
				if o.effects.Load() < 2 || status[i] != http.StatusCreated || replayed[i] {
					t.Errorf("logical request %d: %d effects, got %d replayed %v; want the effect run again and a live response",
						i, o.effects.Load(), status[i], replayed[i])
				}
			}
		})
	}
}

// A 422 (the key reused for another request) and a 400 (a malformed key)
// are sent once, through the Transport and go-retryablehttp's default
// policy alike: the same key would get the same answer.
func TestTransportDoesNotRetryRefusals(t *testing.T) {
	rc := redis.NewClient(redistest.ServerOptions(t))
	t.Cleanup(func() { _ = rc.Close() })
	c, _ := newCoordinatorOn(t, redisrepo.New(rc, redisrepo.WithKeyPrefix(redistest.Prefix(t))))
	h := &payments{}
	var attempts atomic.Int64
	mux := route("POST /payments", h, idemhttp.Middleware(c))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		mux.ServeHTTP(w, r)
	}))
	defer srv.Close()
	tr := newTransport(t, srv.Client().Transport)
	post := func(key, body string) (int, string) {
		t.Helper()
		req, err := retryablehttp.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.KeyHeader, key)
		attempts.Store(0)
		resp, err := retryClient(&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	key := idemhttp.NewKey()
	if code, _ := post(key, `{"amount":1999}`); code != http.StatusCreated || attempts.Load() != 1 {
		t.Fatalf("first request: %d after %d attempts, want 201 after 1", code, attempts.Load())
	}
	for _, tc := range []struct {
		name, key, body string
		status          int
		problem         string
	}{
		{"key reuse", key, `{"amount":5000}`, http.StatusUnprocessableEntity, idemhttp.ProblemKeyReuse},
		{"malformed key", `"unterminated`, `{"amount":1999}`, http.StatusBadRequest, idemhttp.ProblemKeyInvalid},
		{"empty key", ``, `{"amount":1999}`, http.StatusBadRequest, idemhttp.ProblemKeyInvalid},
	} {
		code, body := post(tc.key, tc.body)
		if code != tc.status || !strings.Contains(body, tc.problem) || attempts.Load() != 1 {
			t.Errorf("%s: %d %s after %d attempts; want %d %s after 1", tc.name, code, body, attempts.Load(), tc.status, tc.problem)
		}
	}
	if h.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", h.n())
	}
}
