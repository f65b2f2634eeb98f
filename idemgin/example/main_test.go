// The tests are in package main because a main package cannot be imported.
// Each test starts the whole app, as main builds it, on a free port with its
// own embedded Redis, and talks to it over HTTP.
package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	idemfxtest "github.com/idemkit/idempotency/fxtest"
	"github.com/idemkit/idempotency/idemhttp"
)

// TestMain checks that a stopped app leaves no goroutine behind: HTTP
// server, Redis client, embedded Redis.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const order = `{"amount":1999,"currency":"EUR"}`

// testApp is a running app and an HTTP client for it.
type testApp struct {
	t      *testing.T
	app    *fxtest.App
	url    string // http://127.0.0.1:port
	client *http.Client
}

// startApp starts the app and stops it when the test ends.
func startApp(t *testing.T) *testApp {
	t.Helper()
	var srv *server
	app := fxtest.New(t,
		appOptions(config{Addr: "127.0.0.1:0", LogLevel: "info", EmbeddedRedis: true}),
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
	return &testApp{t: t, app: app, url: "http://" + srv.Addr(), client: client}
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
	want := `{"id":"ch_1","order":"42","tenant":"acme","amount":1999,"currency":"EUR"}`
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
