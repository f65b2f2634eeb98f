package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.uber.org/fx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zapio"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemecho"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
)

// tenantHeader names the caller. It stands in for authentication: a real
// service takes the tenant from verified credentials, never from what the
// client merely asserts.
const tenantHeader = "X-Tenant"

// newRouter is the HTTP API: the Echo instance with its routes.
func newRouter(cfg config, c *coordinator.Coordinator, l *ledger, log *zap.Logger) *echo.Echo {
	e := echo.New()
	e.Debug = cfg.LogLevel == "debug"
	e.HideBanner, e.HidePort = true, true // the server is ours (newServer), and logs its address
	// Echo's own logger (errors only) writes to zap, and so do panics.
	e.Logger.SetOutput(&zapio.Writer{Log: log.Named("echo"), Level: zapcore.ErrorLevel})
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(_ echo.Context, err error, stack []byte) error {
			log.Error("panic", zap.Error(err), zap.ByteString("stack", stack))
			return err
		},
	}))
	// The stand-in for authentication runs before the idempotency
	// middleware, which scopes keys with what it sets.
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if t := c.Request().Header.Get(tenantHeader); t != "" {
				c.Set("tenant", t)
			}
			return next(c)
		}
	})
	idem := idemecho.Middleware(c,
		// An order without a key is refused (400): clients must be able to
		// retry a charge safely.
		idemhttp.WithKeyRequired(true),
		// Keys are per tenant: two tenants who send the same key never see
		// each other's charge. Without a tenant the answer is 401.
		idemecho.WithKeyScope(func(c echo.Context) (string, error) {
			if t, _ := c.Get("tenant").(string); t != "" {
				return "tenant:" + t, nil
			}
			return "", errors.New("no " + tenantHeader + " header")
		}),
	)
	// The middleware is on the route, so the operation is the route:
	// "POST.orders.id", for every order.
	e.POST("/orders/:id", chargeOrder(cfg, l, log), idem)
	e.GET("/ledger", func(c echo.Context) error {
		v, err := l.view(c.Request().Context())
		if err != nil {
			return echo.NewHTTPError(http.StatusInternalServerError, "the ledger could not be read").SetInternal(err)
		}
		return c.JSON(http.StatusOK, v)
	})
	return e
}

// Charge is a charge of an order: money moved.
type Charge struct {
	ID       string `json:"id"`
	Order    string `json:"order"`
	Tenant   string `json:"tenant"`
	Amount   int64  `json:"amount"` // in minor units: 1999 is 19.99
	Currency string `json:"currency"`
}

// chargeRequest is the body of POST /orders/:id, JSON whatever its
// Content-Type says (curl -d sends a form's).
type chargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// chargeOrder is POST /orders/:id. It knows nothing about idempotency but
// where to write: the middleware in front of it makes sure it runs once per
// key, inside the transaction that holds the key, and replays its response
// (201 and the charge, or the 400 of an error it returns) to every retry.
// The charge commits with that response, or, on a 5xx or a crash, neither
// does.
func chargeOrder(cfg config, l *ledger, log *zap.Logger) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req chargeRequest
		if err := json.NewDecoder(c.Request().Body).Decode(&req); err != nil {
			return echo.NewHTTPError(http.StatusBadRequest, "invalid JSON body").SetInternal(err)
		}
		if req.Amount <= 0 || len(req.Currency) != 3 {
			return echo.NewHTTPError(http.StatusBadRequest, "a positive amount and a 3-letter currency are required")
		}
		// The middleware hands the handler the request with the action's
		// context, which carries the transaction of the key's claim.
		ctx := c.Request().Context()
		// The payment provider's latency, long enough for duplicates to
		// overlap.
		select {
		case <-time.After(cfg.ChargeDelay):
		case <-ctx.Done():
			return echo.ErrServiceUnavailable // 5xx: rolled back and not stored, a retry charges
		}
		tx, ok := idempg.Tx(ctx)
		if !ok {
			return echo.NewHTTPError(http.StatusInternalServerError, "no idempotency transaction: the route must be behind idemecho.Middleware over the PostgreSQL store")
		}
		tenant, _ := c.Get("tenant").(string)
		ch, err := l.add(ctx, tx, Charge{Order: c.Param("id"), Tenant: tenant, Amount: req.Amount, Currency: req.Currency})
		if err != nil {
			log.Error("charge not recorded", zap.Error(err))
			return echo.NewHTTPError(http.StatusInternalServerError, "the charge could not be recorded").SetInternal(err)
		}
		log.Info("charged", zap.String("id", ch.ID), zap.String("order", ch.Order), zap.String("tenant", ch.Tenant))
		return c.JSON(http.StatusCreated, ch)
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

func newServer(lc fx.Lifecycle, sd fx.Shutdowner, cfg config, e *echo.Echo, log *zap.Logger) *server {
	s := &server{http: &http.Server{
		Handler:           e,
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
