package main

import (
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"go.uber.org/zap"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgin"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idempg"
	"github.com/idemkit/idempotency/idempg/example/orders"
)

// newRouter is the HTTP API: the gin engine with its routes.
func newRouter(cfg orders.Config, c *coordinator.Coordinator, l *orders.Ledger, log *zap.Logger) *gin.Engine {
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
		if t := c.GetHeader(orders.TenantHeader); t != "" {
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
			return "", errors.New("no " + orders.TenantHeader + " header")
		}),
	)
	// The middleware is on the route, so the operation is the route:
	// "POST.orders.id", for every order.
	r.POST("/orders/:id", idem, chargeOrder(cfg, l, log))
	r.GET("/ledger", func(c *gin.Context) {
		v, err := l.View(c.Request.Context())
		if err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return
		}
		c.JSON(http.StatusOK, v)
	})
	return r
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
func chargeOrder(cfg orders.Config, l *orders.Ledger, log *zap.Logger) gin.HandlerFunc {
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
		ch, err := l.Add(ctx, tx, orders.Charge{Order: c.Param("id"), Tenant: c.GetString("tenant"), Amount: req.Amount, Currency: req.Currency})
		if err != nil {
			log.Error("charge not recorded", zap.Error(err))
			c.JSON(http.StatusInternalServerError, gin.H{"error": "the charge could not be recorded"})
			return
		}
		log.Info("charged", zap.String("id", ch.ID), zap.String("order", ch.Order), zap.String("tenant", ch.Tenant))
		c.JSON(http.StatusCreated, ch)
	}
}
