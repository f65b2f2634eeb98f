package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
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

// transfer is POST /transfers.
func (b *bank) transfer(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(idemhttp.KeyHeader)
	if key == "" {
		problem(w, http.StatusBadRequest, "POST /transfers requires an "+idemhttp.KeyHeader+" header: a retry with the same key never moves the money twice.")
		return
	}
	var req transferRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil {
		problem(w, http.StatusBadRequest, "The body is not a transfer: "+err.Error())
		return
	}
	if req.From == "" || req.To == "" || req.From == req.To || req.Amount <= 0 {
		problem(w, http.StatusBadRequest, `A transfer needs "from" and "to", two different accounts, and a positive "amount".`)
		return
	}
	// The fingerprint tells a retry from the key reused for another
	// transfer.
	fp, err := coordinator.Fingerprint(req.From, req.To, req.Amount)
	if err != nil {
		problem(w, http.StatusInternalServerError, err.Error())
		return
	}
	call := coordinator.Call{Operation: "transfer.create", Key: key, Fingerprint: fp}
	res, err := idempg.DoResult(r.Context(), b.c, call, func(ctx context.Context, tx pgx.Tx) (Transfer, error) {
		t := Transfer{From: req.From, To: req.To, Amount: req.Amount}
		err := tx.QueryRow(ctx, `INSERT INTO transfers (from_acct, to_acct, amount) VALUES ($1, $2, $3)
			RETURNING id, created_at`, t.From, t.To, t.Amount).Scan(&t.ID, &t.At)
		if err != nil {
			return t, err
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger_entries (transfer_id, account, amount) VALUES ($1, $2, -$4::bigint), ($1, $3, $4::bigint)`,
			t.ID, t.From, t.To, t.Amount)
		return t, err
	})
	var inProgress *coordinator.InProgressError
	switch {
	case err == nil:
	case errors.Is(err, coordinator.ErrKeyReuse):
		problem(w, http.StatusUnprocessableEntity, "This "+idemhttp.KeyHeader+" was used for another transfer; use a new key.")
		return
	case errors.As(err, &inProgress):
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(inProgress.RetryAfter.Seconds()))))
		problem(w, http.StatusConflict, "A transfer with this key is in progress; retry later.")
		return
	case errors.Is(err, coordinator.ErrInvalidRequest):
		problem(w, http.StatusBadRequest, err.Error())
		return
	case errors.Is(err, coordinator.ErrStorage):
		// Nothing committed, or the COMMIT's answer was lost: a retry with
		// the same key replays or moves the money once.
		b.log.Warn("transfer: database failure", zap.Error(err))
		problem(w, http.StatusServiceUnavailable, "The database failed; retry with the same key.")
		return
	default:
		b.log.Error("transfer failed", zap.Error(err))
		problem(w, http.StatusInternalServerError, "The transfer failed; nothing was moved.")
		return
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	} else {
		b.log.Info("transferred", zap.Int64("id", res.Value.ID), zap.String("from", res.Value.From),
			zap.String("to", res.Value.To), zap.Int64("amount", res.Value.Amount))
	}
	writeJSON(w, http.StatusCreated, res.Value)
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

// server is the HTTP server, started and stopped with the app.
type server struct {
	srv *http.Server
	ln  net.Listener
}

// Addr is the address the server listens on.
func (s *server) Addr() string { return s.ln.Addr().String() }

func newServer(lc fx.Lifecycle, cfg config, b *bank, log *zap.Logger) (*server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", b.transfer)
	mux.HandleFunc("GET /ledger", b.ledger)
	s := &server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := net.Listen("tcp", cfg.Addr)
			if err != nil {
				return fmt.Errorf("ADDR: %w", err)
			}
			s.ln = ln
			log.Info("serving on http://" + s.Addr())
			go func() { _ = s.srv.Serve(ln) }()
			return nil
		},
		OnStop: s.srv.Shutdown,
	})
	return s, nil
}
