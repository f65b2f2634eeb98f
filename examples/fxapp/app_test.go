package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/idemhttp"
)

const payment = `{"account":"acc_1","amount":1999,"currency":"EUR"}`

func TestConcurrentDuplicatesChargeOnce(t *testing.T) {
	app := startApp(t)

	const n = 20
	responses := make([]response, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			responses[i] = app.pay("order-42", payment)
		})
	}
	close(start) // all at once
	wg.Wait()

	replayed := 0
	for i, r := range responses {
		if r.status != http.StatusCreated {
			t.Fatalf("response %d: status %d, want 201: %s", i, r.status, r.body)
		}
		if r.body != responses[0].body {
			t.Errorf("response %d: body\n%s\nwant the same as response 0:\n%s", i, r.body, responses[0].body)
		}
		if r.header.Get(idemhttp.ReplayedHeader) == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Errorf("%d responses with %s: true, want %d", replayed, idemhttp.ReplayedHeader, n-1)
	}

	l := app.ledger()
	if l.Count != 1 || len(l.Charges) != 1 {
		t.Fatalf("ledger has %d charges, want 1: %+v", l.Count, l.Charges)
	}
	var c Charge
	if err := json.Unmarshal([]byte(responses[0].body), &c); err != nil {
		t.Fatal(err)
	}
	if c.ID != l.Charges[0].ID || c.Amount != 1999 || c.Tenant != "shop_1" {
		t.Errorf("response charge %+v, ledger charge %+v", c, l.Charges[0])
	}
}

func TestKeyReusedForAnotherBody(t *testing.T) {
	app := startApp(t)

	if r := app.pay("order-42", payment); r.status != http.StatusCreated {
		t.Fatalf("first POST: %d %s", r.status, r.body)
	}
	r := app.pay("order-42", strings.Replace(payment, "1999", "5000", 1))
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("POST with the key and another body: %d %s, want 422", r.status, r.body)
	}
	var p idemhttp.Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatal(err)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" || p.Type != idemhttp.ProblemKeyReuse {
		t.Errorf("Content-Type %q, problem type %q; want application/problem+json, %s", ct, p.Type, idemhttp.ProblemKeyReuse)
	}
	if n := app.ledger().Count; n != 1 {
		t.Errorf("ledger has %d charges, want 1", n)
	}
}

func TestPaymentRequests(t *testing.T) {
	app := startApp(t)

	tests := []struct {
		name   string
		body   string
		header []string
		want   int
	}{
		{"no key", payment, []string{"X-Tenant", "shop_1"}, http.StatusBadRequest},
		{"no tenant", payment, []string{"Idempotency-Key", "k-1"}, http.StatusUnauthorized},
		{"invalid body", `{"account":"acc_1","amount":-1,"currency":"euro"}`, []string{"Idempotency-Key", "k-2", "X-Tenant", "shop_1"}, http.StatusBadRequest},
		{"tenant shop_1", payment, []string{"Idempotency-Key", "k-3", "X-Tenant", "shop_1"}, http.StatusCreated},
		// The same key from another tenant is another payment, not a replay.
		{"tenant shop_2, same key", payment, []string{"Idempotency-Key", "k-3", "X-Tenant", "shop_2"}, http.StatusCreated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := app.do("POST", "/payments", tt.body, tt.header...)
			if r.status != tt.want {
				t.Errorf("status %d, want %d: %s", r.status, tt.want, r.body)
			}
			if r.header.Get(idemhttp.ReplayedHeader) != "" {
				t.Errorf("replayed: %s", r.body)
			}
		})
	}
	if n := app.ledger().Count; n != 2 {
		t.Errorf("ledger has %d charges, want 2 (one per tenant)", n)
	}
}

func TestRedeliveredRefundProcessedOnce(t *testing.T) {
	app := startApp(t)

	// A broker delivering one message twice, possibly to two workers at once.
	msg := `{"id":"msg-7","charge_id":"ch_000001","amount":500}`
	for range 2 {
		if r := app.do("POST", "/refunds", msg); r.status != http.StatusAccepted {
			t.Fatalf("POST /refunds: %d %s", r.status, r.body)
		}
	}

	var l ledgerView
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if l = app.ledger(); l.Queue.Delivered == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer took %d of 2 deliveries in 5s", l.Queue.Delivered)
		}
	}
	want := consumerStats{Delivered: 2, Processed: 1, Duplicates: 1}
	if l.Queue != want {
		t.Errorf("consumer stats %+v, want %+v", l.Queue, want)
	}
	if len(l.Refunds) != 1 || l.Refunds[0].MessageID != "msg-7" {
		t.Errorf("refunds %+v, want one for msg-7", l.Refunds)
	}
}

func TestMetrics(t *testing.T) {
	app := startApp(t)

	app.pay("order-1", payment)
	app.pay("order-1", payment)

	r := app.do("GET", "/metrics", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", r.status)
	}
	for _, want := range []string{
		`idempotency_requests_total{operation="POST.payments",outcome="miss"} 1`,
		`idempotency_requests_total{operation="POST.payments",outcome="hit"} 1`,
		`idempotency_stored_total{operation="POST.payments"} 1`,
		`idempotency_storage_duration_seconds_bucket{`,
		`go_goroutines `, // the app's own collector, on the same registry
	} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name         string
		env          map[string]string
		wantAddr     string
		wantEmbedded bool
	}{
		{"defaults", nil, "127.0.0.1:8080", true},
		{"ADDR", map[string]string{"ADDR": ":9000"}, ":9000", true},
		{"redis url", map[string]string{"IDEMPOTENCY_REDIS_URL": "redis://redis:6379/0"}, "127.0.0.1:8080", false},
		{"redis cluster", map[string]string{"IDEMPOTENCY_REDIS_CLUSTER_ADDRS": "a:7000,b:7001"}, "127.0.0.1:8080", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"ADDR", "IDEMPOTENCY_REDIS_URL", "IDEMPOTENCY_REDIS_CLUSTER_ADDRS"} {
				t.Setenv(k, tt.env[k])
			}
			cfg := configFromEnv()
			if cfg.Addr != tt.wantAddr || cfg.EmbeddedRedis != tt.wantEmbedded {
				t.Errorf("got Addr %q, EmbeddedRedis %v; want %q, %v", cfg.Addr, cfg.EmbeddedRedis, tt.wantAddr, tt.wantEmbedded)
			}
		})
	}
}

// Invalid settings reach main as one *idempotency.SettingsError, and fx logs
// none of its error lines for them: main reports them once.
func TestInvalidSettingsReportedOnce(t *testing.T) {
	t.Setenv("IDEMPOTENCY_LEASE", "banana")
	core, logs := observer.New(zap.DebugLevel)
	app := fx.New(
		appOptions(config{Addr: "127.0.0.1:0", LogLevel: "info"}),
		fx.Replace(zap.New(core)),
	)
	var se *idempotency.SettingsError
	if !errors.As(app.Err(), &se) {
		t.Fatalf("app.Err() = %v, want a *idempotency.SettingsError", app.Err())
	}
	if len(se.Errs) != 1 || !strings.HasPrefix(se.Errs[0].Error(), "IDEMPOTENCY_LEASE: ") {
		t.Errorf("refusals = %q, want one for IDEMPOTENCY_LEASE", se.Errs)
	}
	for _, e := range logs.FilterLevelExact(zap.ErrorLevel).All() {
		t.Errorf("fx logged %q %v; main reports invalid settings itself", e.Message, e.ContextMap())
	}
}
