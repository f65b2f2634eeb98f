// Package orderstest checks an order service built on orders the same way
// whatever its framework: each example's tests call Main from their
// TestMain and Run from one test. Every check starts the whole app, as main
// builds it, on a free port with a database of its own on a throwaway
// PostgreSQL server (idempg/pgtemp), and talks to it over HTTP; one runs the
// app as a process of its own and kills it.
package orderstest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg/example/orders"
	"github.com/idemkit/idempotency/idempg/pgtemp"
)

// childEnv, set, makes the test binary run the app (main) instead of the
// tests: the killed app's process. IDEMPOTENCY_TEST_* variables are the
// ones LoadSettings leaves to tests.
const childEnv = "IDEMPOTENCY_TEST_EXAMPLE_CHILD"

// pg is the PostgreSQL server of the tests, started by Main.
var pg *pgtemp.Server

// Main is the body of the tests' TestMain. With childEnv set it runs the
// app (run, the example's main) instead. Otherwise it starts the PostgreSQL
// server (a missing one skips the tests, unless
// IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1), runs the tests, and checks, once it
// stopped, that a stopped app leaves no goroutine behind.
func Main(m *testing.M, run func() int) {
	if os.Getenv(childEnv) != "" {
		os.Exit(run())
	}
	var err error
	pg, err = pgtemp.Start()
	if err != nil && (!errors.Is(err, pgtemp.ErrNotFound) || os.Getenv("IDEMPOTENCY_TEST_REQUIRE_POSTGRES") == "1") {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop()
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// NewDatabase creates a database of the test's own and returns its
// connection string.
func NewDatabase(t *testing.T) string {
	t.Helper()
	if pg == nil {
		t.Skip("no PostgreSQL (apt-get install postgresql; IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1 fails instead)")
	}
	name := "example_" + strings.ToLower(rand.Text()[:10])
	if err := pgtemp.CreateDatabase(t.Context(), pg.DSN, name); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(pg.DSN, "dbname=postgres", "dbname="+name, 1)
}

// Count returns the number of rows of table in the database at dsn.
func Count(t *testing.T, dsn, table string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// order is the body of a charge.
const order = `{"amount":1999,"currency":"EUR"}`

// App is a running app and an HTTP client for it.
type App struct {
	t      *testing.T
	app    *fxtest.App
	URL    string // http://127.0.0.1:port
	Client *http.Client
	DSN    string // the app's database
}

// Start starts the app that app builds on a free port and a database of its
// own, the provider answering after delay, and stops it when the test ends.
func Start(t *testing.T, app func(orders.Config) fx.Option, delay time.Duration) *App {
	t.Helper()
	dsn := NewDatabase(t)
	var srv *orders.Server
	a := fxtest.New(t,
		app(orders.Config{Addr: "127.0.0.1:0", LogLevel: "info", ChargeDelay: delay, PostgresURL: dsn}),
		// Start from the library's defaults, whatever IDEMPOTENCY_* variables
		// the developer's shell has.
		idemfxtest.IgnoreEnvironment(),
		fx.Replace(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		fx.Populate(&srv),
	)
	a.RequireStart()
	t.Cleanup(a.RequireStop)

	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections) // runs before the app stops
	return &App{t: t, app: a, URL: "http://" + srv.Addr(), Client: client, DSN: dsn}
}

// Response is what a test looks at in an HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   string // without the trailing newline some frameworks add
}

// Do sends a request; header holds name, value pairs.
func (a *App) Do(method, path, body string, header ...string) Response {
	a.t.Helper()
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.URL+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	r, err := send(a.Client, req)
	if err != nil {
		a.t.Fatal(err)
	}
	return r
}

func send(client *http.Client, req *http.Request) (Response, error) {
	resp, err := client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: strings.TrimSuffix(string(b), "\n")}, err
}

// Charge posts order 42 as tenant with key.
func (a *App) Charge(tenant, key, body string) Response {
	a.t.Helper()
	return a.Do("POST", "/orders/42", body, idemhttp.KeyHeader, key, orders.TenantHeader, tenant)
}

// Ledger returns GET /ledger.
func (a *App) Ledger() orders.View {
	a.t.Helper()
	r := a.Do("GET", "/ledger", "")
	var v orders.View
	if err := json.Unmarshal([]byte(r.Body), &v); r.Status != http.StatusOK || err != nil {
		a.t.Fatalf("GET /ledger: %d %s (%v)", r.Status, r.Body, err)
	}
	return v
}

// Run checks the order service that app builds, each check a subtest: 20
// concurrent duplicates charge once; a retry replays, a reused key is a 422
// problem, a missing key 400, a missing tenant 401; tenants do not share
// keys; a process killed with retries in flight charges once and frees
// the key at once; the app stops cleanly.
func Run(t *testing.T, app func(orders.Config) fx.Option) {
	t.Run("ConcurrentDuplicatesChargeOnce", func(t *testing.T) { concurrentDuplicates(t, app) })
	t.Run("Requests", func(t *testing.T) { requests(t, app) })
	t.Run("TenantsDoNotShareKeys", func(t *testing.T) { tenants(t, app) })
	t.Run("KilledWithRetriesInFlight", killed)
	t.Run("Stop", func(t *testing.T) { stop(t, app) })
}

func concurrentDuplicates(t *testing.T, app func(orders.Config) fx.Option) {
	a := Start(t, app, 50*time.Millisecond)
	const n = 20
	responses := make([]Response, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			responses[i] = a.Charge("acme", "order-42", order)
		})
	}
	close(start) // all at once
	wg.Wait()

	replayed := 0
	for i, r := range responses {
		if r.Status != http.StatusCreated || r.Body != responses[0].Body {
			t.Fatalf("response %d: %d %s, want 201 and the body of response 0: %s", i, r.Status, r.Body, responses[0].Body)
		}
		if r.Header.Get(idemhttp.ReplayedHeader) == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d responses with %s: true, want %d", replayed, idemhttp.ReplayedHeader, n-1)
	}
	want := `{"id":"ch_1","order":"42","tenant":"acme","amount":1999,"currency":"EUR"}`
	if l := a.Ledger(); l.Count != 1 || responses[0].Body != want {
		t.Fatalf("ledger %+v after the response %s, want one charge: %s", l, responses[0].Body, want)
	}
}

func requests(t *testing.T, app func(orders.Config) fx.Option) {
	a := Start(t, app, 50*time.Millisecond)
	first := a.Charge("acme", "order-42", order)
	if first.Status != http.StatusCreated || first.Header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("first POST: %d %v %s", first.Status, first.Header, first.Body)
	}
	retry := a.Charge("acme", "order-42", order)
	if retry.Status != http.StatusCreated || retry.Body != first.Body || retry.Header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %v %s, want the replay of %s", retry.Status, retry.Header, retry.Body, first.Body)
	}

	reused := a.Charge("acme", "order-42", strings.Replace(order, "1999", "5000", 1))
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(reused.Body), &p); err != nil || reused.Status != http.StatusUnprocessableEntity ||
		reused.Header.Get("Content-Type") != "application/problem+json" || p.Type != idemhttp.ProblemKeyReuse {
		t.Fatalf("the key with another body: %d %q %s, want a 422 %s problem", reused.Status, reused.Header.Get("Content-Type"), reused.Body, idemhttp.ProblemKeyReuse)
	}

	for _, tt := range []struct {
		name   string
		header []string
		body   string
		want   int
	}{
		{"no key", []string{orders.TenantHeader, "acme"}, order, http.StatusBadRequest},
		{"no tenant", []string{idemhttp.KeyHeader, "order-43"}, order, http.StatusUnauthorized},
		{"a bad body", []string{idemhttp.KeyHeader, "order-44", orders.TenantHeader, "acme"}, `{"amount":-1}`, http.StatusBadRequest},
		// The same key from another tenant is another charge, not a replay.
		{"another tenant, the same key", []string{idemhttp.KeyHeader, "order-42", orders.TenantHeader, "globex"}, order, http.StatusCreated},
	} {
		if r := a.Do("POST", "/orders/42", tt.body, tt.header...); r.Status != tt.want || r.Header.Get(idemhttp.ReplayedHeader) != "" {
			t.Errorf("%s: %d %v %s, want %d, not replayed", tt.name, r.Status, r.Header, r.Body, tt.want)
		}
	}
	if l := a.Ledger(); l.Count != 2 || l.Charges[1].Tenant != "globex" {
		t.Errorf("ledger %+v, want one charge per tenant", l)
	}
	// One record per request that the middleware protected, under its
	// scoped key: acme's order-42, acme's order-44 (its 400 is stored) and
	// globex's order-42. The handler's writes went through the same
	// transaction, so there is no second record.
	if n := Count(t, a.DSN, "idempotency_records"); n != 3 {
		t.Errorf("%d idempotency records, want 3: one per protected request", n)
	}
}

// A second tenant that sends the first tenant's key gets its own order,
// committed with its own record, never the first tenant's (issue 39: the
// handler used to store a second record under the bare key, and replayed
// acme's order to globex).
func tenants(t *testing.T, app func(orders.Config) fx.Option) {
	a := Start(t, app, 50*time.Millisecond)
	acme := a.Charge("acme", "k-1", order)
	globex := a.Charge("globex", "k-1", order)
	if acme.Status != http.StatusCreated || globex.Status != http.StatusCreated || acme.Body == globex.Body ||
		globex.Header.Get(idemhttp.ReplayedHeader) != "" || !strings.Contains(globex.Body, `"tenant":"globex"`) {
		t.Fatalf("acme: %d %s; globex with acme's key: %d %v %s; want two charges, globex's its own", acme.Status, acme.Body, globex.Status, globex.Header, globex.Body)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if r := a.Charge(tenant, "k-1", order); r.Header.Get(idemhttp.ReplayedHeader) != "true" || !strings.Contains(r.Body, `"tenant":"`+tenant+`"`) {
			t.Errorf("%s's retry: %d %s, want its own charge replayed", tenant, r.Status, r.Body)
		}
	}
	if n := Count(t, a.DSN, "idempotency_records"); n != 2 {
		t.Errorf("%d idempotency records, want 2", n)
	}
	if n := Count(t, a.DSN, "charges"); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
}

// The app is killed -9 while 20 retries of one order are in flight, and
// restarted: the order has exactly one charge, and the retry after the
// restart runs at once, because the dead process's transaction, and with it
// its claim of the key, ended with its connection. (Before issue 39, the
// middleware's committed pending record held the key for a lease: 29.6s.)
func killed(t *testing.T) {
	dsn := NewDatabase(t)
	addr := FreeAddr(t)
	app := StartProcess(t, addr, dsn, "CHARGE_DELAY=1h") // the provider never answers in time
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(ctx context.Context) (Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/orders/42", strings.NewReader(order))
		req.Header.Set(idemhttp.KeyHeader, "order-42")
		req.Header.Set(orders.TenantHeader, "acme")
		return send(client, req)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { _, _ = post(t.Context()) })
	}
	// Until the charge is in flight: its pending claim is an uncommitted row,
	// which pg_locks shows as a transaction holding a lock on the records.
	WaitFor(t, "the charge in flight", func() bool { return inFlight(t, dsn) })
	time.Sleep(200 * time.Millisecond) // the other 19 have arrived and wait
	if err := app.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = app.Wait()
	wg.Wait() // every client sees its connection end

	StartProcess(t, addr, dsn, "CHARGE_DELAY=50ms")
	start := time.Now()
	r, err := post(t.Context())
	took := time.Since(start)
	if err != nil || r.Status != http.StatusCreated || r.Header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("the retry after the restart: %d %s, %v; want 201, charged now", r.Status, r.Body, err)
	}
	t.Logf("the retry after the restart answered in %v (its charge takes 50ms)", took.Round(time.Millisecond))
	// The retry must not wait out anything: a margin for a busy machine, far
	// below the lease (30s) a committed pending record would hold the key.
	if took > 2*time.Second {
		t.Errorf("the retry after the restart took %v, want it within 2s", took)
	}
	if n := Count(t, dsn, "charges"); n != 1 {
		t.Errorf("%d charges of order 42, want 1", n)
	}
	if n := Count(t, dsn, "idempotency_records"); n != 1 {
		t.Errorf("%d idempotency records, want 1", n)
	}
}

// StartProcess runs the app as a process of its own (the test binary, which
// runs main when Main sees childEnv) on addr and dsn, with env's NAME=value
// entries added, and waits until GET /ledger answers 200; it is killed when
// the test ends.
func StartProcess(t *testing.T, addr, dsn string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "ADDR="+addr, "IDEMPOTENCY_POSTGRES_URL="+dsn,
		"IDEMPOTENCY_METRICS_ENABLED=false", "LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	WaitFor(t, "the app to serve", func() bool {
		resp, err := http.Get("http://" + addr + "/ledger")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	return cmd
}

// inFlight reports whether a transaction holds a row lock of the records
// table: a claim.
func inFlight(t *testing.T, dsn string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE c.relname = 'idempotency_records' AND l.mode = 'RowExclusiveLock' AND l.granted`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// WaitFor polls cond until it holds, failing the test after 30s.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreeAddr returns an address of 127.0.0.1 with a free port.
func FreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The app stops cleanly: the server drains and closes, and Main checks that
// nothing is left running.
func stop(t *testing.T, app func(orders.Config) fx.Option) {
	a := Start(t, app, 50*time.Millisecond)
	if r := a.Charge("acme", "order-42", order); r.Status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.Status, r.Body)
	}
	a.Client.CloseIdleConnections()
	a.app.RequireStop()
	if _, err := http.Get(a.URL + "/ledger"); err == nil {
		t.Fatal("the server still answers after the app stopped")
	}
}
