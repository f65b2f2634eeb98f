// The tests are in package main because a main package cannot be imported.
// Each test starts the whole app, as main builds it, on a free port with its
// own embedded Redis.
package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	idemfxtest "github.com/idemkit/idempotency/fxtest"
)

// TestMain checks that a stopped app leaves no goroutine behind: HTTP
// server, refund workers, Redis client, embedded Redis.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testApp is a running app and an HTTP client for it.
type testApp struct {
	t      *testing.T
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
	return &testApp{t: t, url: "http://" + srv.Addr(), client: client}
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

// pay posts a payment as tenant shop_1 with key.
func (a *testApp) pay(key, body string) response {
	a.t.Helper()
	return a.do("POST", "/payments", body, "Idempotency-Key", key, "X-Tenant", "shop_1")
}

// ledger returns GET /ledger.
func (a *testApp) ledger() ledgerView {
	a.t.Helper()
	r := a.do("GET", "/ledger", "")
	if r.status != http.StatusOK {
		a.t.Fatalf("GET /ledger: %d %s", r.status, r.body)
	}
	var v ledgerView
	if err := json.Unmarshal([]byte(r.body), &v); err != nil {
		a.t.Fatalf("GET /ledger: %v in %s", err, r.body)
	}
	return v
}
