package middlewaretest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/coordinator/idemevent"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/coordinator/faultstore"
	"github.com/idemkit/idempotency/idemhttp"
)

// Concurrent is how many duplicates of one request the concurrency case
// sends at once.
const Concurrent = 50

// cases is the table. Each case starts its own server and coordinator.
var cases = []struct {
	name string
	run  func(e *env)
}{
	{"replay returns the stored response", replay},
	{"every helper's response replays as sent", helpers},
	{"server errors are not stored", serverErrors},
	{"the operation is the matched route", operationIsTheRoute},
	{"a key reused for another request is 422", keyReuse},
	{"a request without a key passes through", noKey},
	{"a required key is refused when missing", keyRequired},
	{"an invalid key is 400", invalidKey},
	{"other methods pass through", otherMethods},
	{"in flight, raise: 409 with Retry-After", inFlightRaise},
	{"in flight, wait: the waiter gets the replay", inFlightWait},
	{"in flight, wait past its bound: 409", waitPastTheBound},
	{"scopes keep callers apart", scopes},
	{"a streamed response is not replayable", streamed},
	{"a response over the limit is not replayable", overTheLimit},
	{"store down, raise: 503 with Retry-After", storeDownRaise},
	{"store down, run: unprotected", storeDownRun},
	{"a body over the limit is 413", bodyTooLarge},
	{"the handler reads the whole body", requestBody},
	{"a panic releases the key", panics},
	{"concurrent duplicates run the handler once", concurrent},
	{"the kill switch steps aside", killSwitch},
}

// payments is the route of most cases: it counts its runs and answers 201
// with a body naming the run, headers that are replayed (Location, ETag)
// and headers that must not be (Set-Cookie, X-Request-Id).
func payments(runs *atomic.Int64) Route {
	return Route{Method: http.MethodPost, Path: "/payments", Handle: func(x Exchange) {
		n := runs.Add(1)
		x.SetHeader("Location", fmt.Sprintf("/payments/pay_%d", n))
		x.SetHeader("ETag", fmt.Sprintf(`"v%d"`, n))
		x.SetHeader("Set-Cookie", fmt.Sprintf("session=s%d; HttpOnly", n))
		x.SetHeader("X-Request-Id", fmt.Sprintf("req-%d", n))
		x.JSON(http.StatusCreated, map[string]string{"id": fmt.Sprintf("pay_%d", n)})
	}}
}

func wantRuns(e *env, runs *atomic.Int64, want int64) {
	e.t.Helper()
	if n := runs.Load(); n != want {
		e.t.Fatalf("the handler ran %d times, want %d", n, want)
	}
}

func replay(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, payments(&runs))
	first := s.post("/payments", "k")
	s.want("first", first, http.StatusCreated, false)
	if !strings.Contains(first.body, "pay_1") || first.header.Get("Set-Cookie") == "" {
		e.t.Fatalf("first = %v with headers %v, want pay_1 and its cookie", first, first.header)
	}
	retry := s.post("/payments", "k")
	s.wantReplayOf("retry", retry, first)
	for _, h := range []string{"Location", "ETag"} {
		if got, want := retry.header.Get(h), first.header.Get(h); got != want {
			e.t.Errorf("replayed %s = %q, want the first response's %q", h, got, want)
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Request-Id"} {
		if v := retry.header.Get(h); v != "" {
			e.t.Errorf("replay carries %s: %q; it is never stored", h, v)
		}
	}
	wantRuns(e, &runs, 1)
}

func helpers(e *env) {
	routes := []struct {
		path   string
		status int
		ctype  string // what the Content-Type starts with
		handle func(Exchange)
	}{
		{"/json", http.StatusOK, "application/json", func(x Exchange) { x.JSON(http.StatusOK, map[string]int{"amount": 42}) }},
		{"/string", http.StatusCreated, "text/plain", func(x Exchange) { x.String(http.StatusCreated, "created") }},
		{"/no-content", http.StatusNoContent, "", func(x Exchange) { x.NoContent(http.StatusNoContent) }},
		{"/accepted", http.StatusAccepted, "", func(x Exchange) { x.NoContent(http.StatusAccepted) }},
		{"/abort", http.StatusConflict, "", func(x Exchange) { x.Abort(http.StatusConflict, "already paid") }},
	}
	runs := make([]atomic.Int64, len(routes))
	var rs []Route
	for i, r := range routes {
		rs = append(rs, Route{Method: http.MethodPost, Path: r.path, Handle: func(x Exchange) {
			runs[i].Add(1)
			r.handle(x)
		}})
	}
	s := e.serve(setup{}, rs...)
	for i, r := range routes {
		first := s.post(r.path, "k")
		s.want(r.path, first, r.status, false)
		if ct := first.header.Get("Content-Type"); !strings.HasPrefix(ct, r.ctype) {
			e.t.Fatalf("%s: Content-Type %q, want %s as the helper sets it", r.path, ct, r.ctype)
		}
		s.wantReplayOf(r.path+" retry", s.post(r.path, "k"), first)
		wantRuns(e, &runs[i], 1)
	}
}

func serverErrors(e *env) {
	var aborts, writes atomic.Int64
	s := e.serve(setup{},
		Route{Method: http.MethodPost, Path: "/abort", Handle: func(x Exchange) {
			aborts.Add(1)
			x.Abort(http.StatusInternalServerError, "try again")
		}},
		Route{Method: http.MethodPost, Path: "/unavailable", Handle: func(x Exchange) {
			writes.Add(1)
			x.JSON(http.StatusServiceUnavailable, map[string]string{"error": "busy"})
		}})
	for range 2 {
		s.want("abort with 500", s.post("/abort", "k"), http.StatusInternalServerError, false)
		s.want("503", s.post("/unavailable", "k"), http.StatusServiceUnavailable, false)
	}
	wantRuns(e, &aborts, 2)
	wantRuns(e, &writes, 2)
}

func operationIsTheRoute(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, Route{Method: http.MethodPost, Path: "/orders/:id", Handle: func(x Exchange) {
		runs.Add(1)
		x.JSON(http.StatusCreated, map[string]string{"order": x.Param("id")})
	}})
	s.want("order 42", s.post("/orders/42", "a"), http.StatusCreated, false)
	if a := s.post("/orders/43", "b"); a.status != http.StatusCreated || !strings.Contains(a.body, `"43"`) {
		e.t.Fatalf("order 43 = %v, want 201 naming order 43", a)
	}
	const op = "POST.orders.id"
	if ops := s.events.operations(); !slices.Equal(ops, []string{op, op}) {
		e.t.Fatalf("operations %q, want both %q: one operation per route, not per URL", ops, op)
	}
	// One operation: the same key on another URL of the route is a reuse.
	s.wantProblem("key of order 42 on order 43", s.post("/orders/43", "a"), http.StatusUnprocessableEntity, idemhttp.ProblemKeyReuse)
	wantRuns(e, &runs, 2)
}

func keyReuse(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, payments(&runs))
	s.want("first", s.post("/payments", "k"), http.StatusCreated, false)
	s.wantProblem("other body", s.send(http.MethodPost, "/payments", "k", `{"amount":2}`), http.StatusUnprocessableEntity, idemhttp.ProblemKeyReuse)
	wantRuns(e, &runs, 1)
}

func noKey(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, payments(&runs))
	for range 2 {
		s.want("without a key", s.post("/payments", ""), http.StatusCreated, false)
	}
	wantRuns(e, &runs, 2)
}

func keyRequired(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{middleware: []idemhttp.Option{idemhttp.WithKeyRequired(true)}}, payments(&runs))
	s.wantProblem("without a key", s.post("/payments", ""), http.StatusBadRequest, idemhttp.ProblemKeyMissing)
	wantRuns(e, &runs, 0)
}

func invalidKey(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, payments(&runs))
	s.wantProblem("a key of 256 characters", s.post("/payments", strings.Repeat("k", coordinator.MaxKeyLen+1)), http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
	s.wantProblem("two keys", s.send(http.MethodPost, "/payments", "a", `{}`, idemhttp.KeyHeader, "b"), http.StatusBadRequest, idemhttp.ProblemKeyInvalid)
	wantRuns(e, &runs, 0)
}

func otherMethods(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, Route{Method: http.MethodGet, Path: "/payments", Handle: func(x Exchange) {
		x.String(http.StatusOK, fmt.Sprint(runs.Add(1)))
	}})
	for range 2 {
		s.want("GET with a key", s.send(http.MethodGet, "/payments", "k", ""), http.StatusOK, false)
	}
	wantRuns(e, &runs, 2)
}

// held serves payments behind a gate, with the coordinator options given.
func held(e *env, opts ...coordinator.Option) (*server, *gate, *atomic.Int64) {
	runs := new(atomic.Int64)
	g := newGate()
	pay := payments(runs)
	inner := pay.Handle
	pay.Handle = func(x Exchange) {
		g.hold()
		inner(x)
	}
	return e.serve(setup{coordinator: opts}, pay), g, runs
}

func inFlightRaise(e *env) {
	s, g, runs := held(e, coordinator.WithInFlight(coordinator.InFlightRaise))
	first := background(func() answer { return s.post("/payments", "k") })
	<-g.started
	dup := s.post("/payments", "k")
	s.wantProblem("duplicate in flight", dup, http.StatusConflict, idemhttp.ProblemInProgress)
	s.wantRetryAfter("duplicate in flight", dup, "1")
	close(g.release)
	a := first()
	s.want("first", a, http.StatusCreated, false)
	s.wantReplayOf("retry after the first", s.post("/payments", "k"), a)
	wantRuns(e, runs, 1)
}

func inFlightWait(e *env) {
	s, g, runs := held(e)
	first := background(func() answer { return s.post("/payments", "k") })
	<-g.started
	waiter := background(func() answer { return s.post("/payments", "k") })
	s.collision()
	close(g.release)
	a := first()
	s.want("first", a, http.StatusCreated, false)
	s.wantReplayOf("waiter", waiter(), a)
	wantRuns(e, runs, 1)
}

func waitPastTheBound(e *env) {
	s, g, runs := held(e, coordinator.WithWaitTimeout(100*time.Millisecond))
	first := background(func() answer { return s.post("/payments", "k") })
	<-g.started
	dup := s.post("/payments", "k")
	s.wantProblem("waiter past its bound", dup, http.StatusConflict, idemhttp.ProblemInProgress)
	s.wantRetryAfter("waiter past its bound", dup, "1")
	close(g.release)
	s.want("first", first(), http.StatusCreated, false)
	wantRuns(e, runs, 1)
}

func scopes(e *env) {
	var runs atomic.Int64
	tenant := func(r *http.Request) (string, error) {
		if t := r.Header.Get("X-Tenant"); t != "" {
			return "tenant:" + t, nil
		}
		return "", errors.New("no tenant")
	}
	s := e.serve(setup{middleware: []idemhttp.Option{
		idemhttp.WithKeyScope(tenant), idemhttp.WithAuthChallenge(`Bearer realm="api"`),
	}}, payments(&runs))
	post := func(t string) answer { return s.send(http.MethodPost, "/payments", "k", `{}`, "X-Tenant", t) }
	a := post("a")
	s.want("tenant a", a, http.StatusCreated, false)
	b := post("b")
	s.want("tenant b with a's key", b, http.StatusCreated, false)
	if a.body == b.body {
		e.t.Fatalf("tenant b got tenant a's response %q", a.body)
	}
	s.wantReplayOf("tenant a again", post("a"), a)
	unknown := s.post("/payments", "k")
	s.wantProblem("no tenant", unknown, http.StatusUnauthorized, idemhttp.ProblemCallerUnknown)
	if got := unknown.header.Get("WWW-Authenticate"); got != `Bearer realm="api"` {
		e.t.Fatalf("WWW-Authenticate %q, want the challenge", got)
	}
	wantRuns(e, &runs, 2)
}

func streamed(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, Route{Method: http.MethodPost, Path: "/export", Handle: func(x Exchange) {
		runs.Add(1)
		x.Stream(http.StatusOK, "part 1\n", "part 2\n")
	}})
	first := s.post("/export", "k")
	s.want("streamed", first, http.StatusOK, false)
	if first.body != "part 1\npart 2\n" {
		e.t.Fatalf("streamed body %q, want both parts", first.body)
	}
	retry := s.post("/export", "k")
	s.wantProblem("retry", retry, http.StatusConflict, idemhttp.ProblemNotReplayable)
	s.wantRetryAfter("retry", retry, "")
	wantRuns(e, &runs, 1)
}

func overTheLimit(e *env) {
	var runs atomic.Int64
	big := strings.Repeat("x", 200)
	s := e.serve(setup{middleware: []idemhttp.Option{idemhttp.WithMaxResponseBytes(64)}},
		Route{Method: http.MethodPost, Path: "/report", Handle: func(x Exchange) {
			runs.Add(1)
			x.String(http.StatusOK, big)
		}})
	first := s.post("/report", "k")
	s.want("large", first, http.StatusOK, false)
	if first.body != big {
		e.t.Fatalf("large body of %d bytes, want all %d", len(first.body), len(big))
	}
	s.wantProblem("retry", s.post("/report", "k"), http.StatusConflict, idemhttp.ProblemNotReplayable)
	wantRuns(e, &runs, 1)
}

func storeDownRaise(e *env) {
	fs := faultstore.Wrap(e.newStore(e.t))
	fs.Fail(idemevent.MethodReserve, errors.New("dial tcp: connection refused"))
	var runs atomic.Int64
	s := e.serve(setup{store: fs, coordinator: []coordinator.Option{
		coordinator.WithOnStorageError(coordinator.OnStorageErrorRaise),
	}}, payments(&runs))
	a := s.post("/payments", "k")
	s.wantProblem("store down", a, http.StatusServiceUnavailable, idemhttp.ProblemStoreUnavailable)
	s.wantRetryAfter("store down", a, "1")
	if strings.Contains(a.body, "connection refused") {
		e.t.Fatalf("the problem %q shows the store's error", a.body)
	}
	wantRuns(e, &runs, 0)
	fs.Reset()
	s.want("store back", s.post("/payments", "k"), http.StatusCreated, false)
}

func storeDownRun(e *env) {
	fs := faultstore.Wrap(e.newStore(e.t))
	fs.Fail(idemevent.MethodReserve, errors.New("dial tcp: connection refused"))
	var runs atomic.Int64
	s := e.serve(setup{store: fs, coordinator: []coordinator.Option{
		coordinator.WithOnStorageError(coordinator.OnStorageErrorRun),
	}}, payments(&runs))
	for range 2 {
		s.want("store down", s.post("/payments", "k"), http.StatusCreated, false)
	}
	wantRuns(e, &runs, 2)
}

func bodyTooLarge(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{middleware: []idemhttp.Option{idemhttp.WithMaxBodyBytes(16)}}, payments(&runs))
	s.wantProblem("17 bytes", s.send(http.MethodPost, "/payments", "k", strings.Repeat("b", 17)),
		http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
	s.want("16 bytes", s.send(http.MethodPost, "/payments", "k", strings.Repeat("b", 16)), http.StatusCreated, false)
	wantRuns(e, &runs, 1)
}

func requestBody(e *env) {
	s := e.serve(setup{}, Route{Method: http.MethodPost, Path: "/echo", Handle: func(x Exchange) {
		b, err := io.ReadAll(x.Request().Body)
		if err != nil {
			x.Abort(http.StatusBadRequest, err.Error())
			return
		}
		x.String(http.StatusOK, string(b))
	}})
	body := `{"amount":42,"currency":"EUR"}`
	first := s.send(http.MethodPost, "/echo", "k", body)
	s.want("echo", first, http.StatusOK, false)
	if first.body != body {
		e.t.Fatalf("the handler read %q, want %q", first.body, body)
	}
	s.wantReplayOf("retry", s.send(http.MethodPost, "/echo", "k", body), first)
}

func panics(e *env) {
	var runs atomic.Int64
	pay := payments(&runs)
	inner := pay.Handle
	pay.Handle = func(x Exchange) {
		if runs.Load() == 0 {
			runs.Add(1)
			x.SetHeader("X-Partial", "1")
			panic("boom")
		}
		inner(x)
	}
	s := e.serve(setup{}, pay)
	// The framework (or net/http) answers the panic: a 500, or a dropped
	// connection.
	if a := s.post("/payments", "k"); a.err == nil && (a.status < 500 || a.replayed()) {
		e.t.Fatalf("panicking request = %v, want a 5xx or a dropped connection", a)
	}
	retry := s.post("/payments", "k")
	s.want("retry after the panic", retry, http.StatusCreated, false)
	s.wantReplayOf("retry again", s.post("/payments", "k"), retry)
	wantRuns(e, &runs, 2)
}

func concurrent(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{}, payments(&runs))
	answers := make([]answer, Concurrent)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = s.post("/payments", "k") })
	}
	wg.Wait()
	replays := 0
	for i, a := range answers {
		if a.err != nil || a.status != http.StatusCreated || a.body != answers[0].body {
			e.t.Fatalf("duplicate %d = %v, want 201 with %q", i, a, answers[0].body)
		}
		if a.replayed() {
			replays++
		}
	}
	if replays != Concurrent-1 {
		e.t.Fatalf("%d of %d duplicates replayed, want %d", replays, Concurrent, Concurrent-1)
	}
	wantRuns(e, &runs, 1)
}

func killSwitch(e *env) {
	var runs atomic.Int64
	s := e.serve(setup{coordinator: []coordinator.Option{coordinator.WithEnabled(false)}}, payments(&runs))
	s.want("disabled", s.post("/payments", "k"), http.StatusCreated, false)
	s.want("disabled, invalid key", s.post("/payments", strings.Repeat("k", coordinator.MaxKeyLen+1)), http.StatusCreated, false)
	wantRuns(e, &runs, 2)
}
