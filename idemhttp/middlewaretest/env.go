package middlewaretest

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"
	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// env is one case's world: the framework, and the stores it may use.
type env struct {
	t        *testing.T
	fw       Framework
	newStore func(t *testing.T) idemstore.Store
}

// setup configures the server of a case.
type setup struct {
	store       idemstore.Store // nil: a store from newStore
	coordinator []coordinator.Option
	middleware  []idemhttp.Option
}

// server is a case's HTTP server and what its coordinator reported.
type server struct {
	t      *testing.T
	srv    *httptest.Server
	client *http.Client
	events *events
}

// serve starts a server of the framework with routes behind the middleware.
func (e *env) serve(s setup, routes ...Route) *server {
	t := e.t
	t.Helper()
	store := s.store
	if store == nil {
		store = e.newStore(t)
	}
	ev := &events{inFlight: make(chan struct{}, 64)}
	c, err := coordinator.New(store, append([]coordinator.Option{coordinator.WithObserver(ev)}, s.coordinator...)...)
	if err != nil {
		t.Fatalf("coordinator.New: %v", err)
	}
	srv := httptest.NewUnstartedServer(e.fw.Serve(c, s.middleware, routes...))
	// net/http logs a recovered panic; the panic case expects one.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	// No keep-alives: a client that reused a connection would resend a POST
	// with an Idempotency-Key (net/http deems it idempotent) when the server
	// drops the connection, as it does after a panic.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}
	t.Cleanup(func() {
		srv.Close()
		client.CloseIdleConnections()
		_ = c.Close() // waits for the coordinator's background work
	})
	return &server{t: t, srv: srv, client: client, events: ev}
}

// answer is a response as the client got it.
type answer struct {
	status int
	header http.Header
	body   string
	err    error // the request failed (the server dropped the connection)
}

func (a answer) replayed() bool { return a.header.Get(idemhttp.ReplayedHeader) == "true" }

func (a answer) String() string {
	if a.err != nil {
		return "error " + a.err.Error()
	}
	r := ""
	if a.replayed() {
		r = " (replayed)"
	}
	return strconv.Itoa(a.status) + r + " " + strconv.Quote(a.body)
}

// send sends one request; a key of "" sends no Idempotency-Key header, and
// headers are name, value pairs.
func (s *server) send(method, path, key, body string, headers ...string) answer {
	s.t.Helper()
	req, err := http.NewRequest(method, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idemhttp.KeyHeader, key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// post sends a POST with key and body {}.
func (s *server) post(path, key string) answer {
	s.t.Helper()
	return s.send(http.MethodPost, path, key, `{}`)
}

// want fails the test unless a has status and is (or is not) a replay.
func (s *server) want(what string, a answer, status int, replayed bool) {
	s.t.Helper()
	if a.err != nil || a.status != status || a.replayed() != replayed {
		s.t.Fatalf("%s: got %v, want %d, replayed %v", what, a, status, replayed)
	}
	if !replayed && a.header.Get(idemhttp.ReplayedHeader) != "" {
		s.t.Fatalf("%s: a live response carries %s: %q", what, idemhttp.ReplayedHeader, a.header.Get(idemhttp.ReplayedHeader))
	}
}

// wantReplayOf fails the test unless a replays first: same status, body and
// content type, flagged as a replay.
func (s *server) wantReplayOf(what string, a, first answer) {
	s.t.Helper()
	s.want(what, a, first.status, true)
	if a.body != first.body {
		s.t.Fatalf("%s: replayed body %q, want the first response's %q", what, a.body, first.body)
	}
	if got, want := a.header.Get("Content-Type"), first.header.Get("Content-Type"); got != want {
		s.t.Fatalf("%s: replayed Content-Type %q, want the first response's %q", what, got, want)
	}
}

// wantProblem fails the test unless a is a problem+json of type typ with
// status.
func (s *server) wantProblem(what string, a answer, status int, typ string) {
	s.t.Helper()
	if a.err != nil || a.status != status {
		s.t.Fatalf("%s: got %v, want %d %s", what, a, status, typ)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		s.t.Fatalf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		s.t.Fatalf("%s: problem body %q: %v", what, a.body, err)
	}
	if p.Type != typ || p.Status != status || p.Title == "" || p.Detail == "" {
		s.t.Fatalf("%s: problem %+v, want type %s, status %d, a title and a detail", what, p, typ, status)
	}
	if a.replayed() {
		s.t.Fatalf("%s: a problem flagged as a replay", what)
	}
}

// wantRetryAfter fails the test unless a has Retry-After: want.
func (s *server) wantRetryAfter(what string, a answer, want string) {
	s.t.Helper()
	if got := a.header.Get("Retry-After"); got != want {
		s.t.Fatalf("%s: Retry-After %q, want %q", what, got, want)
	}
}

// events keeps what the coordinator reported that the cases look at.
type events struct {
	mu   sync.Mutex
	miss []string // operations of the misses, in order
	// inFlight gets a value on each collision.
	inFlight chan struct{}
}

func (e *events) Observe(_ context.Context, ev idemevent.Event) {
	switch ev.Kind {
	case idemevent.Miss:
		e.mu.Lock()
		e.miss = append(e.miss, ev.Key.Operation)
		e.mu.Unlock()
	case idemevent.InFlight:
		select {
		case e.inFlight <- struct{}{}:
		default:
		}
	}
}

func (e *events) operations() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.miss...)
}

// collision waits for a caller to meet a held key.
func (s *server) collision() {
	s.t.Helper()
	select {
	case <-s.events.inFlight:
	case <-time.After(time.Minute):
		s.t.Fatal("no caller met the held key within a minute")
	}
}

// gate holds the first run of a handler until it is opened.
type gate struct {
	once             sync.Once
	started, release chan struct{}
}

func newGate() *gate { return &gate{started: make(chan struct{}), release: make(chan struct{})} }

// hold blocks the first caller until open; later callers pass.
func (g *gate) hold() {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.started)
		<-g.release
	}
}

// background sends req in a goroutine once, and returns a function that
// waits for its answer.
func background(send func() answer) func() answer {
	done := make(chan answer, 1)
	go func() { done <- send() }()
	return func() answer { return <-done }
}
