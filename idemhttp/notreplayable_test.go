package idemhttp_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// count returns how many events of kind k were seen.
func (e *events) count(k idemevent.Kind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

// notReplayable checks that w is the documented answer to a request whose
// key was processed with a response that could not be stored: 409
// ProblemNotReplayable, without Retry-After.
func notReplayable(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	problemOf(t, w, http.StatusConflict, idemhttp.ProblemNotReplayable)
	if ra, ok := w.Header()["Retry-After"]; ok {
		t.Fatalf("Retry-After = %q; a not-replayable key must not invite a retry", ra)
	}
	if isReplay(w) {
		t.Fatal("a not-replayable answer is marked as a replay")
	}
}

// counting counts its runs and writes 201 and body in pieces of 64 KiB.
type counting struct {
	runs atomic.Int64
	body []byte
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.runs.Add(1)
	time.Sleep(20 * time.Millisecond) // let concurrent duplicates collide
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusCreated)
	for b := c.body; len(b) > 0; {
		n := min(len(b), 64<<10)
		_, _ = w.Write(b[:n])
		b = b[n:]
	}
}

func TestLargeResponseRunsOnce(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20/16) // 2 MiB, over the 1 MiB default
	t.Run("twice", func(t *testing.T) {
		c, ev := newCoordinator(t)
		h := &counting{body: big}
		mux := route("POST /export", h, idemhttp.Middleware(c))
		first := send(mux, "POST", "/export", "k", "")
		if first.Code != http.StatusCreated || !bytes.Equal(first.Body.Bytes(), big) || isReplay(first) {
			t.Fatalf("first = %d, %d bytes, replayed %v; want the live 201 with all 2 MiB", first.Code, first.Body.Len(), isReplay(first))
		}
		notReplayable(t, send(mux, "POST", "/export", "k", ""))
		if n := h.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
		if got := ev.errors(idemevent.ErrorRecordValidation); got != 1 {
			t.Fatalf("record_validation_error = %d, want 1 (the first request)", got)
		}
		if got := ev.count(idemevent.NotReplayable); got != 1 {
			t.Fatalf("not_replayable events = %d, want 1 (the retry)", got)
		}
	})
	t.Run("ten at once", func(t *testing.T) {
		c, ev := newCoordinator(t)
		h := &counting{body: big}
		mux := route("POST /export", h, idemhttp.Middleware(c))
		var wg sync.WaitGroup
		res := make([]*httptest.ResponseRecorder, 10)
		for i := range res {
			wg.Go(func() { res[i] = send(mux, "POST", "/export", "k", "") })
		}
		wg.Wait()
		if n := h.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times for ten requests with one key, want 1", n)
		}
		live := 0
		for _, w := range res {
			if w.Code == http.StatusCreated {
				live++
				if !bytes.Equal(w.Body.Bytes(), big) {
					t.Fatalf("the live response has %d bytes, want 2 MiB", w.Body.Len())
				}
				continue
			}
			notReplayable(t, w)
		}
		if live != 1 || ev.count(idemevent.NotReplayable) != 9 {
			t.Fatalf("%d live responses, %d not_replayable events; want 1 and 9", live, ev.count(idemevent.NotReplayable))
		}
	})
}

// The middleware's own limit, not only the coordinator's, makes a response
// not replayable; a body at the limit is stored.
func TestResponseOverTheMiddlewareLimitIsNotReplayable(t *testing.T) {
	c, ev := newCoordinator(t) // the coordinator's limit (1 MiB) is far away
	h := &counting{body: []byte(strings.Repeat("x", 100))}
	mux := route("POST /big", h, idemhttp.Middleware(c, idemhttp.WithMaxResponseBytes(25)))
	if w := send(mux, "POST", "/big", "k", ""); w.Code != http.StatusCreated || w.Body.Len() != 100 || w.Header().Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("first = %d, %d bytes, Content-Type %q; want the whole live 201", w.Code, w.Body.Len(), w.Header().Get("Content-Type"))
	}
	notReplayable(t, send(mux, "POST", "/big", "k", ""))
	if n := h.runs.Load(); n != 1 || ev.errors(idemevent.ErrorRecordValidation) != 1 {
		t.Fatalf("runs %d, record_validation_error %d; want 1 and 1", n, ev.errors(idemevent.ErrorRecordValidation))
	}

	atLimit := &counting{body: []byte(strings.Repeat("x", 25))}
	mux = route("POST /small", atLimit, idemhttp.Middleware(c, idemhttp.WithMaxResponseBytes(25)))
	send(mux, "POST", "/small", "k", "")
	if w := send(mux, "POST", "/small", "k", ""); !isReplay(w) || w.Body.Len() != 25 || atLimit.runs.Load() != 1 {
		t.Fatalf("body at the limit: replayed %v, %d bytes, %d runs; want it stored", isReplay(w), w.Body.Len(), atLimit.runs.Load())
	}
}

// A result over the coordinator's limit (the envelope, not the body) is not
// replayable either.
func TestResponseOverTheCoordinatorLimitIsNotReplayable(t *testing.T) {
	c, _ := newCoordinator(t, coordinator.WithMaxResultBytes(64))
	var p payments
	mux := route("POST /payments", &p, idemhttp.Middleware(c))
	if w := send(mux, "POST", "/payments", "k", strings.Repeat("b", 100)); w.Code != 201 || isReplay(w) {
		t.Fatalf("first = %d replayed %v; want a fresh 201", w.Code, isReplay(w))
	}
	notReplayable(t, send(mux, "POST", "/payments", "k", strings.Repeat("b", 100)))
	if p.n() != 1 {
		t.Fatalf("handler ran %d times, want 1", p.n())
	}
}

func TestStreamedResponseIsNotReplayable(t *testing.T) {
	c, ev := newCoordinator(t)
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		io.WriteString(w, "data: 2\n\n")
	})
	mux := route("POST /stream", h, idemhttp.Middleware(c))
	w := send(mux, "POST", "/stream", "k", "")
	if w.Body.String() != "data: 1\n\ndata: 2\n\n" || !w.Flushed || isReplay(w) {
		t.Fatalf("body %q flushed %v replayed %v; want the live stream", w.Body, w.Flushed, isReplay(w))
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { notReplayable(t, send(mux, "POST", "/stream", "k", "")) })
	}
	wg.Wait()
	if runs.Load() != 1 || ev.errors(idemevent.ErrorRecordValidation) != 1 || ev.count(idemevent.NotReplayable) != 10 {
		t.Fatalf("runs %d, record_validation_error %d, not_replayable %d; want 1, 1 and 10",
			runs.Load(), ev.errors(idemevent.ErrorRecordValidation), ev.count(idemevent.NotReplayable))
	}
}

// A response the store policy refuses is a failure, and failures are not
// cached: streamed or not, the key is released and a retry runs again.
func TestStreamedFailureIsReleased(t *testing.T) {
	c, _ := newCoordinator(t)
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "busy")
		_ = http.NewResponseController(w).Flush()
	})
	mux := route("POST /stream", h, idemhttp.Middleware(c))
	for i := range 2 {
		if w := send(mux, "POST", "/stream", "k", ""); w.Code != http.StatusServiceUnavailable || w.Body.String() != "busy" {
			t.Fatalf("request %d = %d %q; want the handler's live 503", i+1, w.Code, w.Body)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2: a refused 503 releases the key", runs.Load())
	}
}

func TestHijackedResponseIsNotReplayable(t *testing.T) {
	c, ev := newCoordinator(t)
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(brw, "HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		brw.Flush()
	})
	srv := httptest.NewServer(route("POST /payments", h, idemhttp.Middleware(c)))
	defer srv.Close()
	resp, b := post(t, srv, "k")
	if resp.StatusCode != 202 || string(b) != "ok" {
		t.Fatalf("%d %q, want the hijacker's 202 ok", resp.StatusCode, b)
	}
	// The client may read the hijacker's response before the middleware has
	// stored the record: a retry until then waits for it, or runs nothing.
	for deadline := time.Now().Add(5 * time.Second); ev.errors(idemevent.ErrorRecordValidation) < 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	for range 2 {
		resp, b := post(t, srv, "k")
		if resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), idemhttp.ProblemNotReplayable) || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("retry = %d %q Retry-After %q; want 409 %s without Retry-After", resp.StatusCode, b, resp.Header.Get("Retry-After"), idemhttp.ProblemNotReplayable)
		}
	}
	if runs := runs.Load(); runs != 1 || ev.errors(idemevent.ErrorRecordValidation) != 1 {
		t.Fatalf("runs %d, record_validation_error %d; want 1 and 1", runs, ev.errors(idemevent.ErrorRecordValidation))
	}
}

// TestLargeResponseRunsOnceOnRedis: on the Redis store, two instances of
// the middleware (each with its own client and coordinator) serve ten
// concurrent requests for a 2 MiB response with one key: the handler runs
// once, and every other request, and a later retry on either instance, gets
// 409 not-replayable from the record in Redis.
func TestLargeResponseRunsOnceOnRedis(t *testing.T) {
	prefix := redistest.Prefix(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 2<<20/16)
	h := &counting{body: big}
	var muxes []http.Handler
	for range 2 {
		rc := redis.NewClient(redistest.ServerOptions(t))
		t.Cleanup(func() { _ = rc.Close() })
		c, _ := newCoordinatorOn(t, redisrepo.New(rc, redisrepo.WithKeyPrefix(prefix)))
		muxes = append(muxes, route("POST /export", h, idemhttp.Middleware(c)))
	}
	res := make([]*httptest.ResponseRecorder, 10)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() { res[i] = send(muxes[i%2], "POST", "/export", "k", "") })
	}
	wg.Wait()
	live := 0
	for _, w := range res {
		if w.Code == http.StatusCreated && bytes.Equal(w.Body.Bytes(), big) {
			live++
			continue
		}
		notReplayable(t, w)
	}
	if live != 1 || h.runs.Load() != 1 {
		t.Fatalf("%d live responses after %d runs, want 1 and 1", live, h.runs.Load())
	}
	for _, mux := range muxes {
		notReplayable(t, send(mux, "POST", "/export", "k", ""))
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// A handler that streamed has sent its response, and nothing follows it:
// not the record of a duplicate that ran beside it (in-flight mode run) and
// completed the key first.
func TestStreamedResponseIsTheLastWrite(t *testing.T) {
	c, _ := newCoordinator(t, coordinator.WithInFlight(coordinator.InFlightRun))
	gate, streaming := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			_, _ = io.WriteString(w, "part1")
			w.(http.Flusher).Flush()
			close(streaming)
			<-gate
			_, _ = io.WriteString(w, "part2")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":2}`)
	})
	mux := route("POST /x", h, idemhttp.Middleware(c))
	var first *httptest.ResponseRecorder
	done := make(chan struct{})
	go func() {
		defer close(done)
		first = send(mux, "POST", "/x", "k", "")
	}()
	<-streaming
	second := send(mux, "POST", "/x", "k", "")
	close(gate)
	<-done
	if second.Code != http.StatusCreated || second.Body.String() != `{"id":2}` {
		t.Errorf("the duplicate got %d %q, want its own 201", second.Code, second.Body)
	}
	if first.Code != http.StatusOK || first.Body.String() != "part1part2" || isReplay(first) {
		t.Errorf("the streamed response is %d %q (replayed %v), want 200 \"part1part2\" alone", first.Code, first.Body, isReplay(first))
	}
}
