package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
)

// attempt is one request a fakeBase saw.
type attempt struct {
	at   time.Time
	key  []string // the Idempotency-Key values
	body string
}

// fakeBase is a RoundTripper that records what it is sent and answers each
// attempt with the next of its responses (the last one again when they run
// out). It stands in for the network in the tests that need the fake
// clock of testing/synctest.
type fakeBase struct {
	mu        sync.Mutex
	responses []fakeResponse
	attempts  []attempt
	closed    atomic.Int64 // response bodies closed
	idle      atomic.Int64 // CloseIdleConnections calls
}

type fakeResponse struct {
	status int
	header []string // name, value pairs
}

func (f *fakeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, attempt{at: time.Now(), key: req.Header.Values(idemhttp.KeyHeader), body: string(body)})
	r := f.responses[min(len(f.attempts), len(f.responses))-1]
	h := http.Header{}
	for i := 0; i+1 < len(r.header); i += 2 {
		h.Add(r.header[i], r.header[i+1])
	}
	return &http.Response{
		StatusCode: r.status,
		Header:     h,
		Body:       &countedBody{Reader: strings.NewReader("body"), closed: &f.closed},
		Request:    req,
	}, nil
}

func (f *fakeBase) CloseIdleConnections() { f.idle.Add(1) }

func (f *fakeBase) seen() []attempt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]attempt(nil), f.attempts...)
}

type countedBody struct {
	io.Reader
	closed *atomic.Int64
}

func (b *countedBody) Close() error { b.closed.Add(1); return nil }

// conflict is Middleware's 409 in-progress answer: Retry-After in seconds.
func conflict(retryAfter string) fakeResponse {
	return fakeResponse{status: http.StatusConflict, header: []string{"Retry-After", retryAfter}}
}

var created = fakeResponse{status: http.StatusCreated}

// newTransport returns a Transport over base, failing the test on an error.
func newTransport(t *testing.T, base http.RoundTripper, opts ...idemhttp.ClientOption) *idemhttp.Transport {
	t.Helper()
	tr, err := idemhttp.NewTransport(base, opts...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

// postTo returns a POST of body with GetBody set, as http.NewRequest makes
// it.
func postTo(t *testing.T, ctx context.Context, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.test/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// A 409 with Retry-After is retried after it, with the same key and the
// same body, until the server answers otherwise; the 409s' bodies are
// closed.
func TestTransportRetriesInProgressWithTheSameKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{conflict("1"), conflict("2"), created}}
		start := time.Now()
		resp, err := newTransport(t, base).RoundTrip(postTo(t, t.Context(), `{"amount":1999}`))
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("RoundTrip = %v, %v; want 201", resp, err)
		}
		_ = resp.Body.Close()
		seen := base.seen()
		if len(seen) != 3 {
			t.Fatalf("%d attempts, want 3", len(seen))
		}
		for i, a := range seen {
			if len(a.key) != 1 || a.key[0] != seen[0].key[0] || a.body != `{"amount":1999}` {
				t.Errorf("attempt %d: key %q body %q; want the first attempt's key %q and the body", i, a.key, a.body, seen[0].key)
			}
		}
		if d1, d2 := seen[1].at.Sub(start), seen[2].at.Sub(seen[1].at); d1 != time.Second || d2 != 2*time.Second {
			t.Errorf("retried after %v and %v, want the Retry-After: 1s and 2s", d1, d2)
		}
		if n := base.closed.Load(); n != 3 {
			t.Errorf("%d response bodies closed, want 3 (two 409s and the 201)", n)
		}
	})
}

// WithInProgressWait bounds the total wait; the Retry-After forms that
// RFC 9110 allows are honoured; a 409 without a Retry-After it can read is
// returned at once.
func TestTransportInProgressWait(t *testing.T) {
	bound := func(d time.Duration) []idemhttp.ClientOption {
		return []idemhttp.ClientOption{idemhttp.WithInProgressWait(d)}
	}
	always := func(r fakeResponse) func() []fakeResponse {
		return func() []fakeResponse { return []fakeResponse{r} }
	}
	for _, tc := range []struct {
		name      string
		opts      []idemhttp.ClientOption
		responses func() []fakeResponse // made in the bubble, for its clock
		status    int                   // of the response returned
		attempts  int
		elapsed   time.Duration // when the last attempt was sent
	}{
		{"default bound of 30s", nil, always(conflict("10")), http.StatusConflict, 4, 30 * time.Second},
		{"bound of 12s", bound(12 * time.Second), always(conflict("5")), http.StatusConflict, 3, 10 * time.Second},
		{"Retry-After longer than the bound", bound(time.Second), always(conflict("2")), http.StatusConflict, 1, 0},
		{"bound of 0", bound(0), always(conflict("1")), http.StatusConflict, 1, 0},
		{"Retry-After 0 waits 100ms", bound(time.Second), always(conflict("0")), http.StatusConflict, 11, time.Second},
		{"Retry-After as a date", bound(7 * time.Second), func() []fakeResponse {
			return []fakeResponse{conflict(time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat)), created}
		}, http.StatusCreated, 2, 3 * time.Second},
		{"Retry-After as a past date", bound(time.Second), func() []fakeResponse {
			return []fakeResponse{conflict(time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)), created}
		}, http.StatusCreated, 2, 100 * time.Millisecond},
		{"no Retry-After (not-replayable)", nil, always(fakeResponse{status: http.StatusConflict}), http.StatusConflict, 1, 0},
		{"unreadable Retry-After", nil, always(conflict("soon")), http.StatusConflict, 1, 0},
		{"negative Retry-After", nil, always(conflict("-1")), http.StatusConflict, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{responses: tc.responses()}
				start := time.Now()
				resp, err := newTransport(t, base, tc.opts...).RoundTrip(postTo(t, t.Context(), "{}"))
				if err != nil || resp.StatusCode != tc.status {
					t.Fatalf("RoundTrip = %v, %v; want %d", resp, err, tc.status)
				}
				_ = resp.Body.Close()
				seen := base.seen()
				if last := seen[len(seen)-1].at.Sub(start); len(seen) != tc.attempts || last != tc.elapsed {
					t.Fatalf("%d attempts, the last after %v; want %d after %v", len(seen), last, tc.attempts, tc.elapsed)
				}
			})
		})
	}
}

// The answers that the same key would get again are never retried, nor is
// anything but a 409; neither are they read or closed.
func TestTransportDoesNotRetryOtherAnswers(t *testing.T) {
	for _, r := range []fakeResponse{
		{status: http.StatusBadRequest, header: []string{"Retry-After", "1"}},
		{status: http.StatusUnprocessableEntity, header: []string{"Retry-After", "1"}},
		{status: http.StatusConflict},
		{status: http.StatusServiceUnavailable, header: []string{"Retry-After", "1"}},
		{status: http.StatusTooManyRequests, header: []string{"Retry-After", "1"}},
		{status: http.StatusOK},
	} {
		t.Run(http.StatusText(r.status), func(t *testing.T) {
			base := &fakeBase{responses: []fakeResponse{r, created}}
			resp, err := newTransport(t, base).RoundTrip(postTo(t, t.Context(), "{}"))
			if err != nil || resp.StatusCode != r.status {
				t.Fatalf("RoundTrip = %v, %v; want %d", resp, err, r.status)
			}
			if n := len(base.seen()); n != 1 || base.closed.Load() != 0 {
				t.Fatalf("%d attempts, %d bodies closed; want 1 attempt and the body left to the caller", n, base.closed.Load())
			}
			_ = resp.Body.Close()
		})
	}
}

// A 409 is retried only when the body can be sent again: a request with a
// body and no GetBody gets the 409, one without a body is retried.
func TestTransportRetriesOnlyReplayableBodies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{conflict("1"), created}}
		req := postTo(t, t.Context(), "{}")
		req.GetBody = nil
		resp, err := newTransport(t, base).RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusConflict || len(base.seen()) != 1 {
			t.Fatalf("without GetBody: %v, %v after %d attempts; want the 409 after 1", resp, err, len(base.seen()))
		}
		_ = resp.Body.Close()

		base = &fakeBase{responses: []fakeResponse{conflict("1"), created}}
		req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, "http://api.test/payments", nil)
		resp, err = newTransport(t, base).RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusCreated || len(base.seen()) != 2 {
			t.Fatalf("without a body: %v, %v after %d attempts; want 201 after 2", resp, err, len(base.seen()))
		}
		_ = resp.Body.Close()
	})
}

// The wait ends with the request's context, with its cause, and nothing is
// sent after it.
func TestTransportStopsWaitingWithTheContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{conflict("5"), created}}
		cause := errors.New("the caller gave up")
		ctx, cancel := context.WithCancelCause(t.Context())
		time.AfterFunc(2*time.Second, func() { cancel(cause) })
		resp, err := newTransport(t, base).RoundTrip(postTo(t, ctx, "{}"))
		if resp != nil || !errors.Is(err, cause) {
			t.Fatalf("RoundTrip = %v, %v; want the context's cause", resp, err)
		}
		if n := len(base.seen()); n != 1 || base.closed.Load() != 1 {
			t.Fatalf("%d attempts, %d bodies closed; want 1 attempt and its 409 closed", n, base.closed.Load())
		}
	})
}

var uuid4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// The key comes from the request's header, else ContextWithKey, else a
// fresh key that is written into the caller's request, so that sending the
// request again, a shallow copy of it or a clone made afterwards carries it.
func TestTransportKeySources(t *testing.T) {
	t.Run("the request's header", func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{created}}
		req := postTo(t, idemhttp.ContextWithKey(t.Context(), "from-context"), "{}")
		req.Header.Set(idemhttp.KeyHeader, `"order-42"`)
		roundTrip(t, newTransport(t, base), req)
		if got := base.seen()[0].key; len(got) != 1 || got[0] != `"order-42"` {
			t.Fatalf("sent key %q, want the header as it was", got)
		}
	})
	t.Run("ContextWithKey", func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{created}}
		tr := newTransport(t, base)
		for _, tc := range []struct{ key, header string }{
			{"order-42", "order-42"},
			{`"quoted`, `"\"quoted"`}, // the middleware would parse a leading quote as an RFC 8941 string
			{`a"b\c`, `a"b\c`},
		} {
			req := postTo(t, idemhttp.ContextWithKey(t.Context(), tc.key), "{}")
			roundTrip(t, tr, req)
			seen := base.seen()
			if got := seen[len(seen)-1].key; len(got) != 1 || got[0] != tc.header {
				t.Errorf("key %q sent as %q, want %q", tc.key, got, tc.header)
			}
			if v := req.Header.Values(idemhttp.KeyHeader); v != nil {
				t.Errorf("the caller's request got the header %q; the context already keeps the key", v)
			}
		}
	})
	t.Run("minted and kept", func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{created}}
		tr := newTransport(t, base)
		req := postTo(t, t.Context(), "{}")
		roundTrip(t, tr, req)
		key := req.Header.Get(idemhttp.KeyHeader)
		if !uuid4.MatchString(key) {
			t.Fatalf("the caller's request has key %q, want a UUIDv4 written into it", key)
		}
		shallow := *req
		for _, again := range []*http.Request{req, &shallow, req.Clone(t.Context()), req.WithContext(t.Context())} {
			again.Body, _ = req.GetBody()
			roundTrip(t, tr, again)
		}
		for i, a := range base.seen() {
			if len(a.key) != 1 || a.key[0] != key {
				t.Errorf("attempt %d sent key %q, want %q", i, a.key, key)
			}
		}
		other := postTo(t, t.Context(), "{}")
		roundTrip(t, tr, other)
		if k := other.Header.Get(idemhttp.KeyHeader); k == key || !uuid4.MatchString(k) {
			t.Errorf("another request got key %q, want a fresh UUIDv4", k)
		}
	})
	t.Run("minted concurrently", func(t *testing.T) {
		// The same request sent at once by many goroutines gets one key
		// (and the race detector sees no write against a read).
		base := &fakeBase{responses: []fakeResponse{created}}
		tr := newTransport(t, base)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://api.test/payments", nil)
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() { roundTrip(t, tr, req) })
		}
		wg.Wait()
		for i, a := range base.seen() {
			if len(a.key) != 1 || a.key[0] != req.Header.Get(idemhttp.KeyHeader) {
				t.Fatalf("attempt %d sent key %q, want the one key %q", i, a.key, req.Header.Get(idemhttp.KeyHeader))
			}
		}
	})
	t.Run("the action's downstream key", func(t *testing.T) {
		// Every run of a coordinator action sends its downstream key; a
		// key the caller gave still wins, and a named step has its own.
		base := &fakeBase{responses: []fakeResponse{created}}
		tr := newTransport(t, base)
		store := memstore.New()
		c, err := coordinator.New(store)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cl := coordinator.Call{Operation: "order.checkout", Key: "order-42"}
		var want, step string
		var reqs []*http.Request
		for run := range 2 {
			_, err := coordinator.Do(t.Context(), c, cl, func(ctx context.Context) (int, error) {
				want, _ = coordinator.DownstreamKey(ctx)
				step, _ = coordinator.DownstreamKey(coordinator.WithDownstreamStep(ctx, "refund"))
				req := postTo(t, ctx, "{}")
				reqs = append(reqs, req)
				roundTrip(t, tr, req)
				roundTrip(t, tr, postTo(t, coordinator.WithDownstreamStep(ctx, "refund"), "{}"))
				roundTrip(t, tr, postTo(t, idemhttp.ContextWithKey(ctx, "by-hand"), "{}"))
				byHeader := postTo(t, ctx, "{}")
				byHeader.Header.Set(idemhttp.KeyHeader, "header")
				roundTrip(t, tr, byHeader)
				return run, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			store.Put(idemstore.Key{Operation: cl.Operation, Key: cl.Key}, idemstore.Record{}) // lost: the action runs again
		}
		seen := base.seen()
		if len(seen) != 8 {
			t.Fatalf("%d requests sent, want 8", len(seen))
		}
		for run := range 2 {
			for i, wantKey := range []string{want, step, "by-hand", "header"} {
				if got := seen[run*4+i].key; len(got) != 1 || got[0] != wantKey {
					t.Errorf("run %d, request %d sent key %q, want %q", run+1, i+1, got, wantKey)
				}
			}
		}
		for _, req := range reqs {
			if v := req.Header.Values(idemhttp.KeyHeader); v != nil {
				t.Errorf("the caller's request got the header %q; the action derives its key again", v)
			}
		}
	})
	t.Run("a request without a header map", func(t *testing.T) {
		base := &fakeBase{responses: []fakeResponse{created}}
		req := &http.Request{Method: http.MethodPost, URL: postTo(t, t.Context(), "").URL}
		roundTrip(t, newTransport(t, base), req)
		if got := base.seen()[0].key; len(got) != 1 || !uuid4.MatchString(got[0]) {
			t.Fatalf("sent key %q, want a fresh UUIDv4", got)
		}
	})
}

// roundTrip sends req through tr and closes the response.
func roundTrip(t *testing.T, tr http.RoundTripper, req *http.Request) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Error(err)
		return
	}
	_ = resp.Body.Close()
}

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	closed atomic.Int64
}

func (b *closeCounter) Close() error { b.closed.Add(1); return nil }

// An invalid key from ContextWithKey is an error, and nothing is sent; the
// request's body is closed, as a RoundTripper must.
func TestTransportRefusesAnInvalidContextKey(t *testing.T) {
	for _, key := range []string{"", "has space", "tab\t", "é", strings.Repeat("k", coordinator.MaxKeyLen+1)} {
		base := &fakeBase{responses: []fakeResponse{created}}
		body := &closeCounter{Reader: strings.NewReader("{}")}
		req, _ := http.NewRequestWithContext(idemhttp.ContextWithKey(t.Context(), key), http.MethodPost, "http://api.test/payments", body)
		resp, err := newTransport(t, base).RoundTrip(req)
		var ire *coordinator.InvalidRequestError
		if resp != nil || !errors.As(err, &ire) || !strings.HasPrefix(err.Error(), "idemhttp: key from ContextWithKey: ") {
			t.Errorf("key %q: RoundTrip = %v, %v; want an *InvalidRequestError naming ContextWithKey", key, resp, err)
		}
		if len(base.seen()) != 0 || body.closed.Load() != 1 {
			t.Errorf("key %q: %d attempts, body closed %d times; want none and once", key, len(base.seen()), body.closed.Load())
		}
	}
}

// Requests of methods that are not protected pass through untouched: no
// key, from the context or minted, and no retry of a 409.
func TestTransportPassesOtherMethodsThrough(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []idemhttp.ClientOption
		method  string
		protect bool
	}{
		{"GET", nil, http.MethodGet, false},
		{"empty method (GET)", nil, "", false},
		{"HEAD", nil, http.MethodHead, false},
		{"PUT", nil, http.MethodPut, false},
		{"DELETE", nil, http.MethodDelete, false},
		{"lowercase post", nil, "post", false},
		{"POST", nil, http.MethodPost, true},
		{"PATCH", nil, http.MethodPatch, true},
		{"PUT when protected", []idemhttp.ClientOption{idemhttp.WithClientMethods(http.MethodPut)}, http.MethodPut, true},
		{"POST when only PUT is", []idemhttp.ClientOption{idemhttp.WithClientMethods(http.MethodPut)}, http.MethodPost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &fakeBase{responses: []fakeResponse{conflict("1"), created}}
				req, _ := http.NewRequestWithContext(idemhttp.ContextWithKey(t.Context(), "from-context"), tc.method, "http://api.test/payments", nil)
				resp, err := newTransport(t, base, tc.opts...).RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				seen := base.seen()
				if tc.protect {
					if len(seen) != 2 || len(seen[0].key) != 1 || seen[0].key[0] != "from-context" {
						t.Fatalf("%d attempts with key %q; want the 409 retried with the context's key", len(seen), seen[0].key)
					}
					return
				}
				if len(seen) != 1 || seen[0].key != nil || resp.StatusCode != http.StatusConflict || len(req.Header) != 0 {
					t.Fatalf("%d attempts, key %q, status %d, request header %v; want one attempt, no key, the 409, the request untouched",
						len(seen), seen[0].key, resp.StatusCode, req.Header)
				}
			})
		})
	}
}

// NewTransport returns every invalid option as a *coordinator.OptionError,
// joined; a nil option is skipped (docs/user-guide.md, "Options").
func TestNewTransportRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opt    idemhttp.ClientOption
		option string
		value  string
	}{
		{"no methods", idemhttp.WithClientMethods(), "WithClientMethods", "got none"},
		{"empty method", idemhttp.WithClientMethods("POST", ""), "WithClientMethods", `got ""`},
		{"method with a space", idemhttp.WithClientMethods("POST /x"), "WithClientMethods", `"POST /x"`},
		{"negative wait", idemhttp.WithInProgressWait(-time.Second), "WithInProgressWait", "got -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := idemhttp.NewTransport(nil, nil, tc.opt)
			var oe *coordinator.OptionError
			if tr != nil || !errors.As(err, &oe) || oe.Option != tc.option {
				t.Fatalf("NewTransport = %v, %v; want a *coordinator.OptionError for %s", tr, err, tc.option)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "idemhttp: invalid transport options: "+tc.option+": ") || !strings.Contains(msg, tc.value) {
				t.Fatalf("error %q does not name %s and %s", msg, tc.option, tc.value)
			}
		})
	}
	_, err := idemhttp.NewTransport(nil, idemhttp.WithClientMethods("a b"), idemhttp.WithInProgressWait(-1))
	var n int
	for _, name := range []string{"WithClientMethods", "WithInProgressWait"} {
		if strings.Contains(fmt.Sprint(err), name+": ") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("two bad options: %v; want both reported", err)
	}
	if _, err := idemhttp.NewTransport(nil, nil, idemhttp.WithInProgressWait(0), nil); err != nil {
		t.Fatalf("nil options among valid ones: %v", err)
	}
}

// A Transport not made by NewTransport says so instead of sending
// unprotected requests.
func TestZeroTransportRefuses(t *testing.T) {
	body := &closeCounter{Reader: strings.NewReader("{}")}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://api.test/payments", body)
	resp, err := new(idemhttp.Transport).RoundTrip(req)
	if resp != nil || err == nil || !strings.Contains(err.Error(), "NewTransport") || body.closed.Load() != 1 {
		t.Fatalf("RoundTrip = %v, %v, body closed %d; want an error naming NewTransport and the body closed", resp, err, body.closed.Load())
	}
}

// CloseIdleConnections reaches the base transport, so that
// http.Client.CloseIdleConnections does.
func TestTransportClosesIdleConnections(t *testing.T) {
	base := &fakeBase{}
	(&http.Client{Transport: newTransport(t, base)}).CloseIdleConnections()
	if base.idle.Load() != 1 {
		t.Fatal("the base transport's CloseIdleConnections was not called")
	}
	newTransport(t, roundTripFunc(nil)).CloseIdleConnections() // a base without the method
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// SetKey sets the header in the form the middleware reads back as the same
// key, and refuses what is not a key.
func TestSetKey(t *testing.T) {
	for _, tc := range []struct{ key, header string }{
		{"order-42", "order-42"},
		{`"quoted"`, `"\"quoted\""`},
		{`a"b\c`, `a"b\c`},
		{strings.Repeat("k", coordinator.MaxKeyLen), strings.Repeat("k", coordinator.MaxKeyLen)},
	} {
		req := postTo(t, t.Context(), "{}")
		req.Header.Add(idemhttp.KeyHeader, "old")
		req.Header.Add(idemhttp.KeyHeader, "older")
		if err := idemhttp.SetKey(req, tc.key); err != nil {
			t.Fatalf("SetKey(%q): %v", tc.key, err)
		}
		if got := req.Header.Values(idemhttp.KeyHeader); len(got) != 1 || got[0] != tc.header {
			t.Errorf("SetKey(%q) set %q, want %q", tc.key, got, tc.header)
		}
	}
	bare := &http.Request{Method: http.MethodPost}
	if err := idemhttp.SetKey(bare, "k"); err != nil || bare.Header.Get(idemhttp.KeyHeader) != "k" {
		t.Errorf("SetKey on a request without a header map: %v, header %v", err, bare.Header)
	}
	for _, key := range []string{"", "has space", "new\nline", "é", strings.Repeat("k", coordinator.MaxKeyLen+1)} {
		req := postTo(t, t.Context(), "{}")
		err := idemhttp.SetKey(req, key)
		var ire *coordinator.InvalidRequestError
		if !errors.As(err, &ire) || !strings.HasPrefix(err.Error(), "idemhttp: SetKey: ") || len(req.Header) != 0 {
			t.Errorf("SetKey(%q) = %v, header %v; want an *InvalidRequestError and the request as it was", key, err, req.Header)
		}
	}
	if err := idemhttp.SetKey(nil, "k"); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("SetKey(nil) = %v, want an error", err)
	}
}

// The keys SetKey and ContextWithKey send are read back by the middleware
// as the keys they were given: a second request with the same key is the
// replay.
func TestClientKeysAreTheMiddlewares(t *testing.T) {
	for _, key := range []string{"order-42", `"quoted"`, `"`, `a"b\c`, `\`} {
		c, _ := newCoordinator(t)
		h := &payments{}
		mux := route("POST /payments", h, idemhttp.Middleware(c))
		tr := newTransport(t, roundTripFunc(func(r *http.Request) (*http.Response, error) {
			w := send(mux, r.Method, "/payments", r.Header.Get(idemhttp.KeyHeader), "{}")
			return w.Result(), nil
		}))
		req := postTo(t, t.Context(), "{}")
		if err := idemhttp.SetKey(req, key); err != nil {
			t.Fatal(err)
		}
		first, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		second, err := tr.RoundTrip(postTo(t, idemhttp.ContextWithKey(t.Context(), key), "{}"))
		if err != nil {
			t.Fatal(err)
		}
		if first.StatusCode != http.StatusCreated || second.StatusCode != http.StatusCreated || idemhttp.Replayed(first) || !idemhttp.Replayed(second) || h.n() != 1 {
			t.Errorf("key %q: %d replayed %v, then %d replayed %v, %d runs; want 201, then its replay, 1 run",
				key, first.StatusCode, idemhttp.Replayed(first), second.StatusCode, idemhttp.Replayed(second), h.n())
		}
	}
}

// NewKey returns distinct UUIDv4s.
func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := idemhttp.NewKey()
		if !uuid4.MatchString(k) || seen[k] || coordinator.ValidateKey(k) != nil {
			t.Fatalf("NewKey() = %q: want a fresh UUIDv4", k)
		}
		seen[k] = true
	}
}

func TestReplayed(t *testing.T) {
	for _, tc := range []struct {
		resp *http.Response
		want bool
	}{
		{nil, false},
		{&http.Response{}, false},
		{&http.Response{Header: http.Header{idemhttp.ReplayedHeader: {"true"}}}, true},
		{&http.Response{Header: http.Header{idemhttp.ReplayedHeader: {"false"}}}, false},
	} {
		if got := idemhttp.Replayed(tc.resp); got != tc.want {
			t.Errorf("Replayed(%v) = %v, want %v", tc.resp, got, tc.want)
		}
	}
}
