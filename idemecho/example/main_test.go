// The tests are in package main because a main package cannot be imported.
// Each test starts the whole app, as main builds it, on a free port with a
// database of its own on a throwaway PostgreSQL server, and talks to it over
// HTTP. TestKilledWithRetriesInFlight runs the app as a process of its own,
// and kills it.
package main

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
	"github.com/idemkit/idempotency/idempg/pgtemp"
)

// childEnv, set, makes the test binary run the app (main) instead of the
// tests: TestKilledWithRetriesInFlight's app process.
const childEnv = "IDEMECHO_EXAMPLE_CHILD"

// pg is the PostgreSQL server of the tests, started by TestMain.
var pg *pgtemp.Server

// TestMain starts the PostgreSQL server (a missing one skips the tests,
// unless IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1), and checks, once it stopped,
// that a stopped app leaves no goroutine behind: HTTP server, pool.
func TestMain(m *testing.M) {
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

// newDatabase creates a database of the test's own and returns its
// connection string.
func newDatabase(t *testing.T) string {
	t.Helper()
	if pg == nil {
		t.Skip("no PostgreSQL (apt-get install postgresql; IDEMPOTENCY_TEST_REQUIRE_POSTGRES=1 fails instead)")
	}
	name := "echo_" + strings.ToLower(rand.Text()[:10])
	if err := pgtemp.CreateDatabase(t.Context(), pg.DSN, name); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(pg.DSN, "dbname=postgres", "dbname="+name, 1)
}

// count returns the number of rows of table in the database at dsn.
func count(t *testing.T, dsn, table string) int {
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

const order = `{"amount":1999,"currency":"EUR"}`

// testApp is a running app and an HTTP client for it.
type testApp struct {
	t      *testing.T
	app    *fxtest.App
	url    string // http://127.0.0.1:port
	client *http.Client
	dsn    string // the app's database
}

// startApp starts the app on a database of its own and stops it when the
// test ends.
func startApp(t *testing.T) *testApp {
	t.Helper()
	dsn := newDatabase(t)
	var srv *server
	app := fxtest.New(t,
		appOptions(config{Addr: "127.0.0.1:0", LogLevel: "info", ChargeDelay: 50 * time.Millisecond, PostgresURL: dsn}),
		// Start from the library's defaults, whatever IDEMPOTENCY_* variables
		// the developer's shell has.
		idemfxtest.IgnoreEnvironment(),
		fx.Replace(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		fx.Populate(&srv),
	)
	app.RequireStart()
	t.Cleanup(app.RequireStop)

	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections) // runs before the app stops
	return &testApp{t: t, app: app, url: "http://" + srv.Addr(), client: client, dsn: dsn}
}

// response is what a test looks at in an HTTP response.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request; header holds name, value pairs.
func (a *testApp) do(method, path, body string, header ...string) response {
	a.t.Helper()
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.url+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := a.client.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// charge posts order 42 as tenant with key.
func (a *testApp) charge(tenant, key, body string) response {
	a.t.Helper()
	return a.do("POST", "/orders/42", body, idemhttp.KeyHeader, key, tenantHeader, tenant)
}

// ledger returns GET /ledger.
func (a *testApp) ledger() ledgerView {
	a.t.Helper()
	r := a.do("GET", "/ledger", "")
	var v ledgerView
	if err := json.Unmarshal([]byte(r.body), &v); r.status != http.StatusOK || err != nil {
		a.t.Fatalf("GET /ledger: %d %s (%v)", r.status, r.body, err)
	}
	return v
}

func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	app := startApp(t)

	const n = 20
	responses := make([]response, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			responses[i] = app.charge("acme", "order-42", order)
		})
	}
	close(start) // all at once
	wg.Wait()

	replayed := 0
	for i, r := range responses {
		if r.status != http.StatusCreated || r.body != responses[0].body {
			t.Fatalf("response %d: %d %s, want 201 and the body of response 0: %s", i, r.status, r.body, responses[0].body)
		}
		if r.header.Get(idemhttp.ReplayedHeader) == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d responses with %s: true, want %d", replayed, idemhttp.ReplayedHeader, n-1)
	}
	want := `{"id":"ch_1","order":"42","tenant":"acme","amount":1999,"currency":"EUR"}` + "\n"
	if l := app.ledger(); l.Count != 1 || responses[0].body != want {
		t.Fatalf("ledger %+v after the response %s, want one charge: %s", l, responses[0].body, want)
	}
}

func TestRequests(t *testing.T) {
	app := startApp(t)

	first := app.charge("acme", "order-42", order)
	if first.status != http.StatusCreated || first.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("first POST: %d %v %s", first.status, first.header, first.body)
	}
	retry := app.charge("acme", "order-42", order)
	if retry.status != http.StatusCreated || retry.body != first.body || retry.header.Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %v %s, want the replay of %s", retry.status, retry.header, retry.body, first.body)
	}

	reused := app.charge("acme", "order-42", strings.Replace(order, "1999", "5000", 1))
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(reused.body), &p); err != nil || reused.status != http.StatusUnprocessableEntity ||
		reused.header.Get("Content-Type") != "application/problem+json" || p.Type != idemhttp.ProblemKeyReuse {
		t.Fatalf("the key with another body: %d %q %s, want a 422 %s problem", reused.status, reused.header.Get("Content-Type"), reused.body, idemhttp.ProblemKeyReuse)
	}

	for _, tt := range []struct {
		name   string
		header []string
		body   string
		want   int
	}{
		{"no key", []string{tenantHeader, "acme"}, order, http.StatusBadRequest},
		{"no tenant", []string{idemhttp.KeyHeader, "order-43"}, order, http.StatusUnauthorized},
		{"a bad body", []string{idemhttp.KeyHeader, "order-44", tenantHeader, "acme"}, `{"amount":-1}`, http.StatusBadRequest},
		// The same key from another tenant is another charge, not a replay.
		{"another tenant, the same key", []string{idemhttp.KeyHeader, "order-42", tenantHeader, "globex"}, order, http.StatusCreated},
	} {
		if r := app.do("POST", "/orders/42", tt.body, tt.header...); r.status != tt.want || r.header.Get(idemhttp.ReplayedHeader) != "" {
			t.Errorf("%s: %d %v %s, want %d, not replayed", tt.name, r.status, r.header, r.body, tt.want)
		}
	}
	if l := app.ledger(); l.Count != 2 || l.Charges[1].Tenant != "globex" {
		t.Errorf("ledger %+v, want one charge per tenant", l)
	}
	// One record per request that the middleware protected, under its
	// scoped key: acme's order-42, acme's order-44 (its 400 is stored) and
	// globex's order-42. The handler's writes went through the same
	// transaction, so there is no second record.
	if n := count(t, app.dsn, "idempotency_records"); n != 3 {
		t.Errorf("%d idempotency records, want 3: one per protected request", n)
	}
}

// A second tenant that sends the first tenant's key gets its own order,
// committed with its own record, never the first tenant's (issue 39: the
// handler used to store a second record under the bare key, and replayed
// acme's order to globex).
func TestTenantsDoNotShareKeys(t *testing.T) {
	app := startApp(t)
	acme := app.charge("acme", "k-1", order)
	globex := app.charge("globex", "k-1", order)
	if acme.status != http.StatusCreated || globex.status != http.StatusCreated || acme.body == globex.body ||
		globex.header.Get(idemhttp.ReplayedHeader) != "" || !strings.Contains(globex.body, `"tenant":"globex"`) {
		t.Fatalf("acme: %d %s; globex with acme's key: %d %v %s; want two charges, globex's its own", acme.status, acme.body, globex.status, globex.header, globex.body)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if r := app.charge(tenant, "k-1", order); r.header.Get(idemhttp.ReplayedHeader) != "true" || !strings.Contains(r.body, `"tenant":"`+tenant+`"`) {
			t.Errorf("%s's retry: %d %s, want its own charge replayed", tenant, r.status, r.body)
		}
	}
	if n := count(t, app.dsn, "idempotency_records"); n != 2 {
		t.Errorf("%d idempotency records, want 2", n)
	}
	if n := count(t, app.dsn, "charges"); n != 2 {
		t.Errorf("%d charges, want 2", n)
	}
}

// The app is killed -9 while 20 retries of one order are in flight, and
// restarted: the order has exactly one charge, and the retry after the
// restart runs at once, because the dead process's transaction, and with it
// its claim of the key, ended with its connection. (Before issue 39, the
// middleware's committed pending record held the key for a lease: 29.6s.)
func TestKilledWithRetriesInFlight(t *testing.T) {
	dsn := newDatabase(t)
	addr := freeAddr(t)
	app := startProcess(t, addr, dsn, "1h") // the provider never answers in time
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(ctx context.Context) (response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/orders/42", strings.NewReader(order))
		req.Header.Set(idemhttp.KeyHeader, "order-42")
		req.Header.Set(tenantHeader, "acme")
		resp, err := client.Do(req)
		if err != nil {
			return response{}, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { _, _ = post(t.Context()) })
	}
	// Until the charge is in flight: its pending claim is an uncommitted row,
	// which pg_locks shows as a transaction holding a lock on the records.
	waitFor(t, "the charge in flight", func() bool { return inFlight(t, dsn) })
	time.Sleep(200 * time.Millisecond) // the other 19 have arrived and wait
	if err := app.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = app.Wait()
	wg.Wait() // every client sees its connection end

	startProcess(t, addr, dsn, "50ms")
	start := time.Now()
	r, err := post(t.Context())
	took := time.Since(start)
	if err != nil || r.status != http.StatusCreated || r.header.Get(idemhttp.ReplayedHeader) != "" {
		t.Fatalf("the retry after the restart: %d %s, %v; want 201, charged now", r.status, r.body, err)
	}
	t.Logf("the retry after the restart answered in %v (its charge takes 50ms)", took.Round(time.Millisecond))
	// The retry must not wait out anything: a margin for a busy machine, far
	// below the lease (30s) a committed pending record would hold the key.
	if took > 2*time.Second {
		t.Errorf("the retry after the restart took %v, want it within 2s", took)
	}
	if n := count(t, dsn, "charges"); n != 1 {
		t.Errorf("%d charges of order 42, want 1", n)
	}
	if n := count(t, dsn, "idempotency_records"); n != 1 {
		t.Errorf("%d idempotency records, want 1", n)
	}
}

// startProcess runs the app as a process of its own (this test binary,
// which runs main when childEnv is set) on addr and dsn, with the provider's
// latency delay, and waits until it serves; it is killed when the test
// ends.
func startProcess(t *testing.T, addr, dsn, delay string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "ADDR="+addr, "IDEMPOTENCY_POSTGRES_URL="+dsn, "CHARGE_DELAY="+delay,
		"IDEMPOTENCY_METRICS_ENABLED=false", "LOG_LEVEL=warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, "the app to serve", func() bool {
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

// waitFor polls cond until it holds, failing the test after 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeAddr returns an address of 127.0.0.1 with a free port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The app stops cleanly: the server drains and closes, and TestMain checks
// that nothing is left running.
func TestStop(t *testing.T) {
	app := startApp(t)
	if r := app.charge("acme", "order-42", order); r.status != http.StatusCreated {
		t.Fatalf("POST: %d %s", r.status, r.body)
	}
	app.client.CloseIdleConnections()
	app.app.RequireStop()
	if _, err := http.Get(app.url + "/ledger"); err == nil {
		t.Fatal("the server still answers after the app stopped")
	}
}
