package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zapio"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemecho"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/example/orders"
)

// newRouter is the HTTP API: the Echo instance with its routes.
func newRouter(cfg orders.Config, c *coordinator.Coordinator, l *orders.Ledger, log *zap.Logger) *echo.Echo {
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
			if t := c.Request().Header.Get(orders.TenantHeader); t != "" {
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
			return "", errors.New("no " + orders.TenantHeader + " header")
		}),
	)
	// The middleware is on the route, so the operation is the route:
	// "POST.orders.id", for every order.
	e.POST("/orders/:id", chargeOrder(cfg, l, log), idem)
	e.GET("/ledger", func(c echo.Context) error {
		v, err := l.View(c.Request().Context())
		if err != nil {
			return echo.NewHTTPError(http.StatusInternalServerError, "the ledger could not be read").SetInternal(err)
		}
		return c.JSON(http.StatusOK, v)
	})
	return e
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
func chargeOrder(cfg orders.Config, l *orders.Ledger, log *zap.Logger) echo.HandlerFunc {
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
		ch, err := l.Add(ctx, tx, orders.Charge{Order: c.Param("id"), Tenant: tenant, Amount: req.Amount, Currency: req.Currency})
		if err != nil {
			log.Error("charge not recorded", zap.Error(err))
			return echo.NewHTTPError(http.StatusInternalServerError, "the charge could not be recorded").SetInternal(err)
		}
		log.Info("charged", zap.String("id", ch.ID), zap.String("order", ch.Order), zap.String("tenant", ch.Tenant))
		return c.JSON(http.StatusCreated, ch)
	}
}
