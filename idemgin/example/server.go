package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/fx"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgin"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
)

// tenantHeader names the caller. It stands in for authentication: a real
// service takes the tenant from verified credentials, never from what the
// client merely asserts.
const tenantHeader = "X-Tenant"

// newRouter is the HTTP API: the gin engine with its routes.
func newRouter(cfg config, c *coordinator.Coordinator, l *ledger, log *zap.Logger) *gin.Engine {
	// gin's mode is process-wide: debug mode logs every route and request.
	if cfg.LogLevel == "debug" {
		gin.SetMode(gin.DebugMode)
	} else {
		gin.SetMode(gin.ReleaseMode)
	}
	r := gin.New()
	_ = r.SetTrustedProxies(nil) // nil never fails: the client's address is the peer's
	// The stand-in for authentication runs before the idempotency
	// middleware, which scopes keys with what it sets.
	r.Use(gin.Recovery(), func(c *gin.Context) {
		if t := c.GetHeader(tenantHeader); t != "" {
			c.Set("tenant", t)
		}
	})
	idem := idemgin.Middleware(c,
		// An order without a key is refused (400): clients must be able to
		// retry a charge safely.
		idemhttp.WithKeyRequired(true),
		// Keys are per tenant: two tenants who send the same key never see
		// each other's charge. Without a tenant the answer is 401.
		idemgin.WithKeyScope(func(c *gin.Context) (string, error) {
			if t := c.GetString("tenant"); t != "" {
				return "tenant:" + t, nil
			}
			return "", errors.New("no " + tenantHeader + " header")
		}),
	)
	// The middleware is on the route, so the operation is the route:
	// "POST.orders.id", for every order.
	r.POST("/orders/:id", idem, chargeOrder(cfg, l, log))
	r.GET("/ledger", func(c *gin.Context) {
		v, err := l.view(c.Request.Context())
		if err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return
		}
		c.JSON(http.StatusOK, v)
	})
	return r
}

// Charge is a charge of an order: money moved.
type Charge struct {
	ID       string `json:"id"`
	Order    string `json:"order"`
	Tenant   string `json:"tenant"`
	Amount   int64  `json:"amount"` // in minor units: 1999 is 19.99
	Currency string `json:"currency"`
}

// chargeRequest is the body of POST /orders/:id.
type chargeRequest struct {
	Amount   int64  `json:"amount" binding:"gt=0"`
	Currency string `json:"currency" binding:"len=3"`
}

// chargeOrder is POST /orders/:id. It knows nothing about idempotency but
// where to write: the middleware in front of it makes sure it runs once per
// key, inside the transaction that holds the key, and replays its response
// (201 and the charge, or 400) to every retry. The charge commits with that
// response, or, on a 5xx or a crash, neither does.
func chargeOrder(cfg config, l *ledger, log *zap.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		var req chargeRequest
		if err := c.ShouldBindJSON(&req); err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		ctx := c.Request.Context()
		// The payment provider's latency, long enough for duplicates to
		// overlap.
		select {
		case <-time.After(cfg.ChargeDelay):
		case <-ctx.Done():
			c.Status(http.StatusServiceUnavailable) // 5xx: rolled back and not stored, a retry charges
			return
		}
		tx, ok := idempg.Tx(ctx)
		if !ok {
			c.JSON(http.StatusInternalServerError, gin.H{"error": "no idempotency transaction: the route must be behind idemgin.Middleware over the PostgreSQL store"})
			return
		}
		ch, err := l.add(ctx, tx, Charge{Order: c.Param("id"), Tenant: c.GetString("tenant"), Amount: req.Amount, Currency: req.Currency})
		if err != nil {
			log.Error("charge not recorded", zap.Error(err))
			c.JSON(http.StatusInternalServerError, gin.H{"error": "the charge could not be recorded"})
			return
		}
		log.Info("charged", zap.String("id", ch.ID), zap.String("order", ch.Order), zap.String("tenant", ch.Tenant))
		c.JSON(http.StatusCreated, ch)
	}
}

// chargesTable is the app's own table, beside the store's.
const chargesTable = `CREATE TABLE IF NOT EXISTS charges (
    id         bigserial PRIMARY KEY,
    order_ref  text NOT NULL,
    tenant     text NOT NULL,
    amount     bigint NOT NULL CHECK (amount > 0),
    currency   text NOT NULL
)`

// ledger records every charge really made, in PostgreSQL. If idempotency
// works, a retry never adds a second one.
type ledger struct{ pool *pgxpool.Pool }

// newLedger creates the charges table on start, after idempg.Module has
// applied the store's schema: newRouter asks for the coordinator before the
// ledger, so the store's start hook comes first.
func newLedger(lc fx.Lifecycle, pool *pgxpool.Pool) *ledger {
	lc.Append(fx.StartHook(func(ctx context.Context) error {
		_, err := pool.Exec(ctx, chargesTable)
		return err
	}))
	return &ledger{pool: pool}
}

// add records ch through tx and returns it with its charge ID.
func (l *ledger) add(ctx context.Context, tx pgx.Tx, ch Charge) (Charge, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO charges (order_ref, tenant, amount, currency) VALUES ($1, $2, $3, $4) RETURNING id`,
		ch.Order, ch.Tenant, ch.Amount, ch.Currency).Scan(&id)
	ch.ID = fmt.Sprintf("ch_%d", id)
	return ch, err
}

// ledgerView is the JSON of GET /ledger.
type ledgerView struct {
	Count   int      `json:"count"`
	Charges []Charge `json:"charges"`
}

func (l *ledger) view(ctx context.Context) (ledgerView, error) {
	rows, _ := l.pool.Query(ctx, `SELECT 'ch_' || id, order_ref, tenant, amount, currency FROM charges ORDER BY id`)
	charges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Charge, error) {
		var ch Charge
		err := row.Scan(&ch.ID, &ch.Order, &ch.Tenant, &ch.Amount, &ch.Currency)
		return ch, err
	})
	return ledgerView{Count: len(charges), Charges: charges}, err
}

// server is the HTTP server, started and stopped by the fx lifecycle.
type server struct {
	http *http.Server
	addr string // set once it listens
}

// Addr returns the address the server listens on (after start).
func (s *server) Addr() string { return s.addr }

func newServer(lc fx.Lifecycle, sd fx.Shutdowner, cfg config, r *gin.Engine, log *zap.Logger) *server {
	s := &server{http: &http.Server{
		Handler:           r,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          zap.NewStdLog(log.Named("http")),
	}}
	served := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			// Listen here, not in the goroutine, so that a busy port fails
			// start-up with a clear error.
			ln, err := new(net.ListenConfig).Listen(ctx, "tcp", cfg.Addr)
			if err != nil {
				return fmt.Errorf("listen on %s (ADDR): %w", cfg.Addr, err)
			}
			s.addr = ln.Addr().String()
			go func() {
				defer close(served)
				if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
					log.Error("http server failed", zap.Error(err))
					_ = sd.Shutdown(fx.ExitCode(1))
				}
			}()
			log.Info("serving on http://"+s.addr, zap.String("addr", s.addr))
			return nil
		},
		OnStop: func(ctx context.Context) error {
			log.Info("shutting down: draining HTTP requests")
			err := s.http.Shutdown(ctx)
			<-served
			return err
		},
	})
	return s
}
