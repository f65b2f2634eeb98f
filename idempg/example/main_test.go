// The tests are in package main because a main package cannot be imported.
// They start the whole app, as main builds it, on a free port over a
// PostgreSQL server of their own, and talk to it over HTTP.
package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg/example/orders/orderstest"
)

func TestMain(m *testing.M) { orderstest.Main(m, run) }

// startApp starts the app on a fresh database and returns its URL.
func startApp(t *testing.T) string {
	t.Helper()
	return orderstest.Start(t, appOptions, 0).URL
}

type response struct {
	status   int
	replayed bool
	body     string
	header   http.Header
}

func post(t *testing.T, client *http.Client, url, key, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/transfers", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return response{}
	}
	if key != "" {
		req.Header.Set(idemhttp.KeyHeader, key)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", string(b), resp.Header}
}

// 20 concurrent duplicates of one transfer: one transfer, two ledger
// entries, the same answer to all; the key reused is a 422, no key a 400.
func TestTransferOnce(t *testing.T) {
	url := startApp(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	const body = `{"from":"alice","to":"bob","amount":1999}`
	out := make([]response, 20)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { out[i] = post(t, client, url, "t-1", body) })
	}
	wg.Wait()
	replays := 0
	for i, r := range out {
		if r.status != http.StatusCreated || r.body != out[0].body {
			t.Errorf("duplicate %d: %d %s, want 201 and %s", i, r.status, r.body, out[0].body)
		}
		if r.replayed {
			replays++
		}
	}
	if replays != 19 {
		t.Errorf("%d replayed answers, want 19", replays)
	}
	// The middleware's problems: their type, and never cached.
	r := post(t, client, url, "t-1", `{"from":"alice","to":"bob","amount":5000}`)
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || r.status != http.StatusUnprocessableEntity || p.Type != idemhttp.ProblemKeyReuse ||
		r.header.Get("Content-Type") != "application/problem+json" || r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("key reused: %d %v %s, want a 422 %s problem, not cached", r.status, r.header, r.body, idemhttp.ProblemKeyReuse)
	}
	if r := post(t, client, url, "", body); r.status != http.StatusBadRequest {
		t.Errorf("no key: %d %s, want 400", r.status, r.body)
	}
	resp, err := client.Get(url + "/ledger")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v ledgerView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if v.Transfers != 1 || v.Entries != 2 || v.Balances["alice"] != -1999 || v.Balances["bob"] != 1999 {
		t.Errorf("ledger %+v, want one transfer of 1999 from alice to bob", v)
	}
}
