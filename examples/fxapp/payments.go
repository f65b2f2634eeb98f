package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idempotency/idemhttp"
)

// tenantHeader names the caller in this example. It stands in for
// authentication.
const tenantHeader = "X-Tenant"

// tenantOf tells whose request it is. The middleware scopes idempotency keys
// with it (idemhttp.WithKeyScope), and the payment handler records it.
//
// This is where authentication goes: a real service returns the tenant or
// user ID of the verified credentials (API key, session, JWT subject), never
// a value the client may choose freely. When it returns an error the
// middleware answers 401 and the handler does not run.
func tenantOf(r *http.Request) (string, error) {
	t := r.Header.Get(tenantHeader)
	if t == "" {
		return "", errors.New("no " + tenantHeader + " header")
	}
	return t, nil
}

// Charge is a charge made at the provider: money moved.
type Charge struct {
	ID       string    `json:"id"`
	Tenant   string    `json:"tenant"`
	Account  string    `json:"account"`
	Amount   int64     `json:"amount"` // in minor units: 1999 is 19.99
	Currency string    `json:"currency"`
	Created  time.Time `json:"created"`
}

// Refund is a refund made at the provider.
type Refund struct {
	ID        string    `json:"id"`
	MessageID string    `json:"message_id"`
	ChargeID  string    `json:"charge_id"`
	Amount    int64     `json:"amount"`
	Created   time.Time `json:"created"`
}

// provider is a fake payment provider. Every call is a real effect that must
// not happen twice, and takes 50-100ms, long enough for duplicate requests
// to overlap.
type provider struct {
	charges atomic.Int64
	refunds atomic.Int64
}

func newProvider() *provider { return &provider{} }

func (p *provider) Charge(ctx context.Context, tenant, account string, amount int64, currency string) (Charge, error) {
	if err := p.work(ctx); err != nil {
		return Charge{}, err
	}
	return Charge{
		ID:     fmt.Sprintf("ch_%06d", p.charges.Add(1)),
		Tenant: tenant, Account: account, Amount: amount, Currency: currency,
		Created: time.Now().UTC(),
	}, nil
}

func (p *provider) Refund(ctx context.Context, messageID, chargeID string, amount int64) (Refund, error) {
	if err := p.work(ctx); err != nil {
		return Refund{}, err
	}
	return Refund{
		ID:        fmt.Sprintf("re_%06d", p.refunds.Add(1)),
		MessageID: messageID, ChargeID: chargeID, Amount: amount,
		Created: time.Now().UTC(),
	}, nil
}

// work is the provider's latency; a cancelled request stops waiting.
func (p *provider) work(ctx context.Context) error {
	t := time.NewTimer(50*time.Millisecond + rand.N(50*time.Millisecond))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// ledger records every charge and refund the provider really made. If
// idempotency works, a retried request never adds a second entry.
type ledger struct {
	mu      sync.Mutex
	charges []Charge
	refunds []Refund
}

func newLedger() *ledger { return &ledger{} }

func (l *ledger) AddCharge(c Charge) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charges = append(l.charges, c)
}

func (l *ledger) AddRefund(r Refund) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refunds = append(l.refunds, r)
}

// ledgerView is the JSON of GET /ledger.
type ledgerView struct {
	Count   int           `json:"count"` // number of charges
	Charges []Charge      `json:"charges"`
	Refunds []Refund      `json:"refunds"`
	Queue   consumerStats `json:"refund_queue"`
}

func (l *ledger) view() ledgerView {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ledgerView{
		Count:   len(l.charges),
		Charges: slices.Clone(l.charges),
		Refunds: slices.Clone(l.refunds),
	}
}

// paymentRequest is the body of POST /payments.
type paymentRequest struct {
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// createPayment is POST /payments. It knows nothing about idempotency: the
// middleware in front of it makes sure it runs once per key, and replays its
// response (201 and the charge, or 400) to every retry.
func createPayment(p *provider, l *ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, err := tenantOf(r)
		if err != nil { // unreachable behind the middleware, which requires a key and a tenant
			writeProblem(w, http.StatusUnauthorized, err.Error())
			return
		}
		var req paymentRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
			return
		}
		if msg := req.validate(); msg != "" {
			writeProblem(w, http.StatusBadRequest, msg)
			return
		}

		charge, err := p.Charge(r.Context(), tenant, req.Account, req.Amount, req.Currency)
		if err != nil {
			// 5xx responses are not stored: the key is released and a retry
			// charges again, which is right, since nothing was charged.
			writeProblem(w, http.StatusBadGateway, "payment provider: "+err.Error())
			return
		}
		l.AddCharge(charge)
		writeJSON(w, http.StatusCreated, charge)
	})
}

func (req paymentRequest) validate() string {
	var problems []string
	if req.Account == "" {
		problems = append(problems, "account is required")
	}
	if req.Amount <= 0 {
		problems = append(problems, "amount must be a positive number of minor units")
	}
	if !currencyRE.MatchString(req.Currency) {
		problems = append(problems, "currency must be an ISO 4217 code such as EUR")
	}
	return strings.Join(problems, "; ")
}

// showLedger is GET /ledger.
func showLedger(l *ledger, rc *refundConsumer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := l.view()
		v.Queue = rc.stats()
		writeJSON(w, http.StatusOK, v)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeProblem answers with an RFC 9457 problem, like the middleware does.
func writeProblem(w http.ResponseWriter, status int, detail string) {
	idemhttp.WriteProblem(w, idemhttp.Problem{
		Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail,
	})
}
