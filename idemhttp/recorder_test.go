package idemhttp_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator/memstore"
	"github.com/idemkit/idempotency/idemhttp"
)

// The handler sees the headers middleware outside it set, and what it does
// to them is what the client gets, live and replayed: values it adds are
// added, a header it replaces is replaced, one it deletes is deleted. The
// record holds only those changes, so a header outer middleware sets anew on
// each request keeps the replaying request's value.
func TestOuterMiddlewareHeadersAreKept(t *testing.T) {
	var requests atomic.Int64
	outer := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := requests.Add(1)
			h := w.Header()
			h.Add("Vary", "Origin") // CORS
			h.Set("Cache-Control", "no-store")
			h.Set("Content-Language", "en")
			h.Set("Link", fmt.Sprintf("</requests/%d>; rel=monitor", n))
			h.Set("X-Request-Id", fmt.Sprint("req-", n))
			next.ServeHTTP(w, r)
		})
	}
	var seen atomic.Value
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(strings.Join(w.Header().Values("Vary"), ","))
		w.Header().Add("Vary", "Accept-Encoding")     // added
		w.Header().Set("Cache-Control", "max-age=60") // replaced
		w.Header().Del("Content-Language")            // deleted
		w.Header().Set("Location", "/payments/pay_1") // new
		w.WriteHeader(http.StatusCreated)
	})
	store := memstore.New()
	c, _ := newCoordinatorOn(t, store)
	mux := outer(route("POST /payments", h, idemhttp.Middleware(c)))
	plain := outer(h)

	want := send(plain, "POST", "/payments", "k", "{}").Header()
	for i, name := range []string{"live", "replay", "second replay"} {
		w := send(mux, "POST", "/payments", "k", "{}")
		if got := seen.Load(); got != "Origin" {
			t.Errorf("%s: the handler read Vary %q, want the outer Origin", name, got)
		}
		if isReplay(w) != (i > 0) {
			t.Fatalf("%s: replayed %v", name, isReplay(w))
		}
		for _, k := range []string{"Vary", "Cache-Control", "Content-Language", "Location"} {
			if got, want := w.Header().Values(k), want.Values(k); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("%s: %s = %q, want %q as without the middleware", name, k, got, want)
			}
		}
		n := requests.Load()
		if got, want := w.Header().Get("Link"), fmt.Sprintf("</requests/%d>; rel=monitor", n); got != want {
			t.Errorf("%s: Link = %q, want this request's %q", name, got, want)
		}
		if got, want := w.Header().Get("X-Request-Id"), fmt.Sprint("req-", n); got != want {
			t.Errorf("%s: X-Request-Id = %q, want this request's %q", name, got, want)
		}
	}
	rec := store.Snapshot(idemstore.Key{Operation: "POST.payments", Key: "k"})
	meta, _, _ := bytes.Cut(rec.Result, []byte("\n"))
	const stored = `{"v":1,"status":201,` +
		`"header":{"Location":["/payments/pay_1"],"Vary":["Accept-Encoding"]},` +
		`"replace":{"Cache-Control":["max-age=60"],"Content-Language":null}}`
	if string(meta) != stored {
		t.Errorf("stored envelope\n%s\nwant only the handler's changes\n%s", meta, stored)
	}
}

// Records stored before the replace field existed hold the handler's own
// headers; a replay adds them to those of outer middleware.
func TestReplayAddsStoredHeadersToOuterOnes(t *testing.T) {
	store := memstore.New()
	c, _ := newCoordinatorOn(t, store)
	var p payments
	storeResult(t, store, "k", `{"v":1,"status":201,"header":{"Vary":["Accept-Encoding"]}}`+"\n")
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	cors := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Vary", "Origin")
		mux.ServeHTTP(w, r)
	})
	w := send(cors, "POST", "/payments", "k", "")
	if got := strings.Join(w.Header().Values("Vary"), ","); !isReplay(w) || got != "Origin,Accept-Encoding" {
		t.Fatalf("replayed %v, Vary %q; want Origin,Accept-Encoding", isReplay(w), got)
	}
}

// Headers set after the status are not sent by net/http, so they are
// neither sent nor stored here: after WriteHeader, and after the implicit 200
// of the first Write.
func TestHeaderSetAfterStatusIsNotSent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w http.ResponseWriter)
	}{
		{"after WriteHeader", func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }},
		{"after Write", func(w http.ResponseWriter) { _, _ = io.WriteString(w, "created") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				tc.write(w)
				_, _ = io.WriteString(w, "created")
				w.Header().Set("Location", "/payments/late") // too late in net/http
				w.Header().Set("Content-Type", "application/json")
			})
			d := direct(h)
			defer d.Close()
			want, _ := post(t, d, "k")

			c, _ := newCoordinator(t)
			srv := httptest.NewServer(route("POST /payments", h, idemhttp.Middleware(c)))
			defer srv.Close()
			for _, name := range []string{"live", "replay"} {
				resp, _ := post(t, srv, "k")
				for _, k := range []string{"Location", "Content-Type"} {
					if got, want := resp.Header.Get(k), want.Header.Get(k); got != want {
						t.Errorf("%s: %s = %q, want %q as net/http sends it", name, k, got, want)
					}
				}
			}
		})
	}
}

// Trailers go out as trailers, as net/http sends them: one declared in the
// Trailer header and one named with http.TrailerPrefix, set after the body,
// also when the response was streamed. Trailers are not stored: a replay has
// none.
func TestTrailers(t *testing.T) {
	for _, flush := range []bool{false, true} {
		t.Run(fmt.Sprintf("flushed %v", flush), func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Checksum")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "created")
				if flush {
					_ = http.NewResponseController(w).Flush()
				}
				w.Header().Set("X-Checksum", "abc")
				w.Header().Set(http.TrailerPrefix+"X-Rows", "1")
			})
			d := direct(h)
			defer d.Close()
			want, _ := post(t, d, "k")
			if want.Trailer.Get("X-Checksum") != "abc" || want.Trailer.Get("X-Rows") != "1" || want.Header.Get("X-Checksum") != "" {
				t.Fatalf("net/http sent header %v, trailer %v", want.Header, want.Trailer)
			}

			c, _ := newCoordinator(t)
			srv := httptest.NewServer(route("POST /payments", h, idemhttp.Middleware(c)))
			defer srv.Close()
			live, body := post(t, srv, "k")
			if string(body) != "created" || live.Header.Get(idemhttp.ReplayedHeader) != "" {
				t.Fatalf("live: %q, %v", body, live.Header)
			}
			for _, k := range []string{"X-Checksum", "X-Rows"} {
				if got, want := live.Header.Get(k), want.Header.Get(k); got != want {
					t.Errorf("live: %s as a header = %q, want %q", k, got, want)
				}
				if got, want := live.Trailer.Get(k), want.Trailer.Get(k); got != want {
					t.Errorf("live: %s as a trailer = %q, want %q", k, got, want)
				}
			}
			if flush {
				return // a streamed response is not stored
			}
			replay, body := post(t, srv, "k")
			if replay.Header.Get(idemhttp.ReplayedHeader) != "true" || string(body) != "created" {
				t.Fatalf("second response is not the replay: %q %v", body, replay.Header)
			}
			if len(replay.Trailer) != 0 || replay.Header.Get("X-Checksum") != "" || replay.Header.Get("Trailer") != "" {
				t.Errorf("replay: header %v, trailer %v; want no trailers", replay.Header, replay.Trailer)
			}
		})
	}
}

// net/http does not sniff a Content-Type for a body with a Content-Encoding
// (issue 31753); neither does the recorder, live or stored.
func TestNoSniffWithContentEncoding(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"id":"pay_1"}`))
	_ = zw.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(gz.Bytes())
	})
	d := direct(h)
	defer d.Close()
	resp, _ := post(t, d, "k")
	want := resp.Header.Values("Content-Type")
	if len(want) != 0 {
		t.Fatalf("net/http sniffed %q", want)
	}

	c, _ := newCoordinator(t)
	srv := httptest.NewServer(route("POST /payments", h, idemhttp.Middleware(c)))
	defer srv.Close()
	for _, name := range []string{"live", "replay"} {
		resp, body := post(t, srv, "k")
		if got := resp.Header.Values("Content-Type"); len(got) != 0 || !bytes.Equal(body, gz.Bytes()) {
			t.Errorf("%s: Content-Type = %q, body %q; want no Content-Type as net/http sends it, and the gzip body", name, got, body)
		}
	}
}

// net/http's way to suppress an automatic header is to set it to nil. A nil
// Content-Type is stored as such, so the replay has no Content-Type either,
// rather than a sniffed one.
func TestSuppressedContentTypeIsReplayed(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	})
	c, _ := newCoordinator(t)
	srv := httptest.NewServer(route("POST /payments", h, idemhttp.Middleware(c)))
	defer srv.Close()
	live, _ := post(t, srv, "k")
	replay, _ := post(t, srv, "k")
	if replay.Header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatal("second response is not a replay")
	}
	if l, r := live.Header.Values("Content-Type"), replay.Header.Values("Content-Type"); len(l) != 0 || len(r) != 0 {
		t.Errorf("Content-Type live %q, replay %q; want none in both", l, r)
	}
}
