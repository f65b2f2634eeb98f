package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
)

func TestReplayHeaders(t *testing.T) {
	c, _ := newCoordinator(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Resource-Id", "res_1")
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Add("Link", "</a>; rel=a")
		w.Header().Add("Link", "</b>; rel=b")
		w.Header().Set("Set-Cookie", "a=b")
		fmt.Fprint(w, "ok")
	})
	t.Run("default", func(t *testing.T) {
		mux := route("POST /r", h, idemhttp.Middleware(c))
		send(mux, "POST", "/r", "default", "")
		w := send(mux, "POST", "/r", "default", "")
		if got := w.Header().Values("Link"); len(got) != 2 {
			t.Fatalf("replayed Link = %q, want both values", got)
		}
		if w.Header().Get("X-Resource-Id") != "" {
			t.Fatal("X-Resource-Id replayed; it is not in the default allow-list")
		}
	})
	t.Run("WithReplayHeaders", func(t *testing.T) {
		mux := route("POST /r", h, idemhttp.Middleware(c, idemhttp.WithReplayHeaders("x-resource-id")))
		send(mux, "POST", "/r", "custom", "")
		w := send(mux, "POST", "/r", "custom", "")
		if w.Header().Get("X-Resource-Id") != "res_1" {
			t.Fatalf("X-Resource-Id = %q, want res_1", w.Header().Get("X-Resource-Id"))
		}
		if _, ok := w.Header()["Link"]; ok {
			t.Fatal("Link replayed; the allow-list was replaced")
		}
		// Content-Type: not stored, so net/http sniffs the body again.
		if w.Header().Get("Set-Cookie") != "" {
			t.Fatal("Set-Cookie replayed")
		}
	})
}

// The live response and the stored one agree: a handler that sets no
// Content-Type gets the sniffed one in both.
func TestLiveResponseMatchesReplay(t *testing.T) {
	c, _ := newCoordinator(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "<html><body>created</body></html>")
	})
	mux := route("POST /page", h, idemhttp.Middleware(c))
	first := send(mux, "POST", "/page", "k", "")
	retry := send(mux, "POST", "/page", "k", "")
	if first.Code != 200 || retry.Code != 200 || first.Body.String() != retry.Body.String() {
		t.Fatalf("first %d %q, retry %d %q", first.Code, first.Body, retry.Code, retry.Body)
	}
	if ct := first.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" || retry.Header().Get("Content-Type") != ct {
		t.Fatalf("Content-Type first %q, retry %q; want text/html; charset=utf-8 for both", ct, retry.Header().Get("Content-Type"))
	}
}

func TestEmptyAndNoContentResponses(t *testing.T) {
	c, _ := newCoordinator(t)
	t.Run("nothing written", func(t *testing.T) {
		mux := route("POST /x", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), idemhttp.Middleware(c))
		send(mux, "POST", "/x", "nothing", "")
		if w := send(mux, "POST", "/x", "nothing", ""); w.Code != 200 || w.Body.Len() != 0 || !isReplay(w) {
			t.Fatalf("replay = %d %q replayed %v, want an empty 200 replay", w.Code, w.Body, isReplay(w))
		}
	})
	t.Run("204", func(t *testing.T) {
		mux := route("POST /x", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			if _, err := w.Write([]byte("x")); err != http.ErrBodyNotAllowed {
				t.Errorf("Write after 204 = %v, want ErrBodyNotAllowed", err)
			}
		}), idemhttp.Middleware(c))
		send(mux, "POST", "/x", "204", "")
		if w := send(mux, "POST", "/x", "204", ""); w.Code != 204 || w.Body.Len() != 0 || !isReplay(w) {
			t.Fatalf("replay = %d %q replayed %v, want a 204 replay", w.Code, w.Body, isReplay(w))
		}
	})
}

// statusHandler answers with the statuses given, one per run, then 201.
func statusHandler(statuses ...int) (http.Handler, func() int) {
	runs := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		status := http.StatusCreated
		if runs <= len(statuses) {
			status = statuses[runs-1]
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, "run %d: %d", runs, status)
	}), func() int { return runs }
}

func TestStorePolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		opts   []idemhttp.Option
		stored bool
	}{
		{"500 not stored", 500, nil, false},
		{"503 not stored", 503, nil, false},
		{"429 not stored", 429, nil, false},
		{"408 not stored", 408, nil, false},
		{"499 not stored", 499, nil, false},
		{"404 stored", 404, nil, true},
		{"400 stored", 400, nil, true},
		{"409 stored", 409, nil, true},
		{"500 stored by policy", 500, []idemhttp.Option{idemhttp.WithStorePolicy(func(int) bool { return true })}, true},
		{"201 refused by policy", 201, []idemhttp.Option{idemhttp.WithStorePolicy(func(s int) bool { return s != 201 })}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newCoordinator(t)
			h, runs := statusHandler(tc.status)
			mux := route("POST /x", h, idemhttp.Middleware(c, tc.opts...))
			first := send(mux, "POST", "/x", "k", "")
			if first.Code != tc.status || first.Body.String() != fmt.Sprintf("run 1: %d", tc.status) {
				t.Fatalf("first = %d %q; the live response must be served whatever the policy", first.Code, first.Body)
			}
			retry := send(mux, "POST", "/x", "k", "")
			if tc.stored {
				if runs() != 1 || !isReplay(retry) || retry.Code != tc.status || retry.Body.String() != first.Body.String() {
					t.Fatalf("retry = %d %q replayed %v after %d runs; want the stored response", retry.Code, retry.Body, isReplay(retry), runs())
				}
				return
			}
			if runs() != 2 || isReplay(retry) || retry.Code == tc.status && tc.status != 201 {
				t.Fatalf("retry = %d %q replayed %v after %d runs; want a second run", retry.Code, retry.Body, isReplay(retry), runs())
			}
		})
	}
}

func TestRequestBody(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c, idemhttp.WithMaxBodyBytes(10)))
	t.Run("restored for the handler", func(t *testing.T) {
		w := send(mux, "POST", "/payments", "restored", "0123456789")
		if want := `"request":"0123456789"`; !strings.Contains(w.Body.String(), want) {
			t.Fatalf("body %s, want the handler to have read %s", w.Body, want)
		}
	})
	t.Run("413 over the limit", func(t *testing.T) {
		before := p.n()
		problemOf(t, send(mux, "POST", "/payments", "big", "0123456789a"), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
		// Without a Content-Length, too.
		r := httptest.NewRequest("POST", "/payments", io.MultiReader(strings.NewReader("01234"), strings.NewReader("56789ab")))
		r.ContentLength = -1
		r.Header.Set(idemhttp.KeyHeader, "chunked")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		problemOf(t, w, http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
		// And an outer http.MaxBytesReader that trips first.
		r = httptest.NewRequest("POST", "/payments", strings.NewReader("0123456789"))
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 5)
		r.Header.Set(idemhttp.KeyHeader, "outer")
		w = httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		problemOf(t, w, http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
		if p.n() != before {
			t.Fatal("handler ran for a body over the limit")
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		r := httptest.NewRequest("POST", "/payments", io.MultiReader(strings.NewReader("01"), errReader{}))
		r.Header.Set(idemhttp.KeyHeader, "broken")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		problemOf(t, w, http.StatusBadRequest, idemhttp.ProblemBodyUnreadable)
	})
	t.Run("without a key the body is not read", func(t *testing.T) {
		if w := send(mux, "POST", "/payments", "", "0123456789abcdef"); w.Code != http.StatusCreated {
			t.Fatalf("status %d, want 201: the limit applies to protected requests only", w.Code)
		}
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, fmt.Errorf("connection reset") }

func TestKeyReuseIs422(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("/", &p, idemhttp.Middleware(c, idemhttp.WithFingerprintHeaders("X-Account")))
	send(mux, "POST", "/payments?currency=eur", "k", `{"amount":1999}`, "X-Account", "a1")
	for _, tc := range []struct {
		name, method, target, body string
		headers                    []string
	}{
		{"body", "POST", "/payments?currency=eur", `{"amount":5000}`, []string{"X-Account", "a1"}},
		{"query", "POST", "/payments?currency=usd", `{"amount":1999}`, []string{"X-Account", "a1"}},
		{"path", "POST", "/payments/", `{"amount":1999}`, []string{"X-Account", "a1"}},
		{"method", "PATCH", "/payments?currency=eur", `{"amount":1999}`, []string{"X-Account", "a1"}},
		{"fingerprinted header", "POST", "/payments?currency=eur", `{"amount":1999}`, []string{"X-Account", "a2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problemOf(t, send(mux, tc.method, tc.target, "k", tc.body, tc.headers...), http.StatusUnprocessableEntity, idemhttp.ProblemKeyReuse)
		})
	}
	// Other headers are not part of the fingerprint.
	if w := send(mux, "POST", "/payments?currency=eur", "k", `{"amount":1999}`, "X-Account", "a1", "User-Agent", "retry/2"); !isReplay(w) {
		t.Fatalf("retry = %d %s, want a replay", w.Code, w.Body)
	}
	if p.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.n())
	}
}

// storeResult writes a completed record under POST.payments:key, as an
// older version or a corrupted store might have left it.
func storeResult(t *testing.T, store idemstore.Store, key, result string) {
	t.Helper()
	_, _, err := store.Reserve(context.Background(), idemstore.Key{Operation: "POST.payments", Key: key}, idemstore.Write{
		State: idemstore.StateCompleted, Token: "0123456789abcdef0123456789abcdef",
		Result: []byte(result), TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestUnreadableRecordHeals(t *testing.T) {
	for _, tc := range []struct{ name, result string }{
		{"no envelope", "not an envelope"},
		{"bad JSON", "{\n"},
		{"unknown version", `{"v":2,"status":201}` + "\nbody"},
		{"bad status", `{"v":1,"status":100}` + "\nbody"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memstore.New()
			c, ev := newCoordinatorOn(t, store)
			var p payments
			mux := route("POST /payments", &p, idemhttp.Middleware(c))
			storeResult(t, store, "k", tc.result)
			first := send(mux, "POST", "/payments", "k", "")
			if first.Code != 201 || isReplay(first) || p.n() != 1 || ev.errors(idemevent.ErrorDecode) != 1 {
				t.Fatalf("first = %d replayed %v, runs %d, decode errors %d; want a fresh run", first.Code, isReplay(first), p.n(), ev.errors(idemevent.ErrorDecode))
			}
			if retry := send(mux, "POST", "/payments", "k", ""); !isReplay(retry) || !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) {
				t.Fatalf("retry replayed %v body %s; want the healed record", isReplay(retry), retry.Body)
			}
		})
	}
}

// The allow-list and the never-replayed headers apply when replaying too,
// whatever a stored record holds.
func TestReplayFiltersStoredHeaders(t *testing.T) {
	store := memstore.New()
	c, _ := newCoordinatorOn(t, store)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	storeResult(t, store, "k", `{"v":1,"status":201,"future":true,"header":{"Set-Cookie":["a=b"],"Authorization":["Bearer x"],"X-Internal":["1"],"Content-Type":["text/plain"]},"replace":{"Set-Cookie":["c=d"],"X-Internal":null}}`+"\nhello")
	w := send(mux, "POST", "/payments", "k", "")
	if !isReplay(w) || w.Code != 201 || w.Body.String() != "hello" || w.Header().Get("Content-Type") != "text/plain" {
		t.Fatalf("replay = %d %q %v", w.Code, w.Body, w.Header())
	}
	for _, h := range []string{"Set-Cookie", "Authorization", "X-Internal"} {
		if _, ok := w.Header()[h]; ok {
			t.Errorf("replay carries %s", h)
		}
	}
	if p.n() != 0 {
		t.Fatalf("handler ran %d times, want 0", p.n())
	}
}

func TestCanceledWhileWaiting(t *testing.T) {
	c, _ := newCoordinator(t)
	b := newBlocking()
	mux := route("POST /payments", b, idemhttp.Middleware(c))
	finish := inFlight(t, mux, b, "k")
	defer finish()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	r := httptest.NewRequestWithContext(ctx, "POST", "/payments", strings.NewReader(`{}`))
	r.Header.Set(idemhttp.KeyHeader, "k")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || b.n() != 0 {
		t.Fatalf("status %d, runs %d; want 503 and the first request still running", w.Code, b.n())
	}
}

// The kill switch (coordinator.WithEnabled(false)) makes the middleware step
// aside: every request reaches the handler as it came, also those the
// middleware would refuse (a malformed key, a missing required one, a body
// over the cap, a failing scope hook, as in an auth outage the switch is
// pulled for), and nothing is stored.
func TestKillSwitch(t *testing.T) {
	c, _ := newCoordinator(t, coordinator.WithEnabled(false))
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c,
		idemhttp.WithKeyRequired(true),
		idemhttp.WithMaxBodyBytes(8),
		idemhttp.WithKeyScope(func(r *http.Request) (string, error) {
			if r.Header.Get("X-Tenant") == "" {
				return "", errors.New("no tenant")
			}
			return r.Header.Get("X-Tenant"), nil
		})))
	tenant := []string{"X-Tenant", "t1"}
	for _, tc := range []struct {
		name, key, body string
		headers         []string
	}{
		{"first", "k", "body", tenant},
		{"retry", "k", "body", tenant},
		{"body over the cap", "k", `{"amount":1999}`, tenant},
		{"scope hook fails", "k", "body", nil},
		{"invalid key", "a b", "body", tenant},
		{"no key, though required", "", "body", tenant},
	} {
		w := send(mux, "POST", "/payments", tc.key, tc.body, tc.headers...)
		if w.Code != 201 || isReplay(w) || !strings.Contains(w.Body.String(), fmt.Sprintf("%q", tc.body)) {
			t.Errorf("%s: %d %s replayed %v; want the handler's fresh 201 that saw the body", tc.name, w.Code, w.Body, isReplay(w))
		}
	}
	if p.n() != 6 {
		t.Fatalf("handler ran %d times, want 6", p.n())
	}
}

func TestTTL(t *testing.T) {
	c, _ := newCoordinator(t)
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c, idemhttp.WithTTL(time.Millisecond)))
	// Outside the coordinator's bounds (1s by default): the server's fault.
	w := send(mux, "POST", "/payments", "k", "")
	if w.Code != http.StatusInternalServerError || p.n() != 0 {
		t.Fatalf("status %d, runs %d; want 500 and no run", w.Code, p.n())
	}
}
