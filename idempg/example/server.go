package main

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
)

// The app's own tables, beside the store's. A transfer and its two ledger
// entries are one transaction: Do's.
const appSchema = `
CREATE TABLE IF NOT EXISTS transfers (
    id         bigserial PRIMARY KEY,
    from_acct  text NOT NULL,
    to_acct    text NOT NULL,
    amount     bigint NOT NULL CHECK (amount > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger_entries (
    transfer_id bigint NOT NULL REFERENCES transfers (id),
    account     text NOT NULL,
    amount      bigint NOT NULL
);`

// Transfer is money moved from one account to another.
type Transfer struct {
	ID     int64     `json:"id"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Amount int64     `json:"amount"` // in minor units: 1999 is 19.99
	At     time.Time `json:"at"`
}

// transferRequest is the body of POST /transfers.
type transferRequest struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

// bank moves money, once per Idempotency-Key.
type bank struct {
	c    *coordinator.Coordinator
	pool *pgxpool.Pool
	log  *zap.Logger
}

// newBank creates the app's tables on start; idempg.Module has applied the
// store's schema by then (its hook runs first: the coordinator is built
// before the bank).
func newBank(lc fx.Lifecycle, c *coordinator.Coordinator, pool *pgxpool.Pool, log *zap.Logger) *bank {
	lc.Append(fx.StartHook(func(ctx context.Context) error {
		_, err := pool.Exec(ctx, appSchema)
		return err
	}))
	return &bank{c: c, pool: pool, log: log}
}

// transfer is POST /transfers, behind idemhttp.Middleware (newServer): the
// middleware answers a missing key (400), a key in progress (409), a key
// reused for another transfer (422) and a database that is down (503), and
// replays the stored answer to every retry. The handler runs inside the
// transaction that holds the key, and writes through it: the transfer, its
// two ledger entries, the answer and the idempotency record commit together.
// A 5xx rolls the writes back.
func (b *bank) transfer(w http.ResponseWriter, r *http.Request) {
	var req transferRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "The body is not a transfer: "+err.Error())
		return
	}
	if req.From == "" || req.To == "" || req.From == req.To || req.Amount <= 0 {
		problem(w, http.StatusBadRequest, `A transfer needs "from" and "to", two different accounts, and a positive "amount".`)
		return
	}
	tx, ok := idempg.Tx(r.Context())
	if !ok {
		problem(w, http.StatusInternalServerError, "No idempotency transaction: POST /transfers must be behind idemhttp.Middleware over the PostgreSQL store.")
		return
	}
	ctx := r.Context()
	t := Transfer{From: req.From, To: req.To, Amount: req.Amount}
	err := tx.QueryRow(ctx, `INSERT INTO transfers (from_acct, to_acct, amount) VALUES ($1, $2, $3)
		RETURNING id, created_at`, t.From, t.To, t.Amount).Scan(&t.ID, &t.At)
	if err == nil {
		_, err = tx.Exec(ctx, `INSERT INTO ledger_entries (transfer_id, account, amount) VALUES ($1, $2, -$4::bigint), ($1, $3, $4::bigint)`,
			t.ID, t.From, t.To, t.Amount)
	}
	if err != nil {
		b.log.Error("transfer failed", zap.Error(err))
		problem(w, http.StatusInternalServerError, "The transfer failed; nothing was moved.") // 5xx: rolled back, not stored
		return
	}
	b.log.Info("transferred", zap.Int64("id", t.ID), zap.String("from", t.From), zap.String("to", t.To), zap.Int64("amount", t.Amount))
	writeJSON(w, http.StatusCreated, t)
}

// ledgerView is GET /ledger: every entry and the balances.
type ledgerView struct {
	Transfers int              `json:"transfers"`
	Entries   int              `json:"entries"`
	Balances  map[string]int64 `json:"balances"`
}

func (b *bank) ledger(w http.ResponseWriter, r *http.Request) {
	v := ledgerView{Balances: map[string]int64{}}
	if err := b.pool.QueryRow(r.Context(), `SELECT (SELECT count(*) FROM transfers), (SELECT count(*) FROM ledger_entries)`).
		Scan(&v.Transfers, &v.Entries); err != nil {
		problem(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	rows, err := b.pool.Query(r.Context(), `SELECT account, sum(amount) FROM ledger_entries GROUP BY account`)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	for rows.Next() {
		var acct string
		var sum int64
		if err := rows.Scan(&acct, &sum); err != nil {
			problem(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		v.Balances[acct] = sum
	}
	if err := rows.Err(); err != nil {
		problem(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// problem answers an RFC 9457 problem.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": http.StatusText(status), "status": status, "detail": detail})
}

// newMux is the HTTP API. Keys are required: a client must be able to
// retry a transfer safely. The operation is named after the route:
// "POST.transfers".
func newMux(b *bank) *http.ServeMux {
	mux := http.NewServeMux()
	idem := idemhttp.Middleware(b.c, idemhttp.WithKeyRequired(true))
	mux.Handle("POST /transfers", idem(http.HandlerFunc(b.transfer)))
	mux.HandleFunc("GET /ledger", b.ledger)
	return mux
}
