package idemecho_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemecho"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idemhttp/middlewaretest"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestMain checks that no test leaves a goroutine behind, and stops the
// redis-server that the tests start.
func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.Main(m)) }

// TestBehaviour runs the HTTP behaviour table of idemhttp on Echo and a real
// Redis.
func TestBehaviour(t *testing.T) {
	middlewaretest.TestMiddleware(t, echoFramework{}, redisStore)
}

// redisStore returns a store on the tests' redis-server, under a key prefix
// of t's own.
func redisStore(t *testing.T) idemstore.Store {
	return redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(redistest.Prefix(t)))
}

// echoFramework mounts the table's routes on Echo with its Recover
// middleware, each behind Middleware.
type echoFramework struct{}

func (echoFramework) Serve(c *coordinator.Coordinator, opts []idemhttp.Option, routes ...middlewaretest.Route) http.Handler {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Logger.SetOutput(io.Discard)
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true}))
	mw := idemecho.Middleware(c, opts...)
	for _, rt := range routes {
		e.Add(rt.Method, rt.Path, func(c echo.Context) error {
			x := &exchange{c: c}
			rt.Handle(x)
			return x.err
		}, mw)
	}
	return e
}

// exchange writes the table's responses with Echo's helpers; Abort is the
// handler returning an *echo.HTTPError.
type exchange struct {
	c   echo.Context
	err error
}

func (x *exchange) Request() *http.Request       { return x.c.Request() }
func (x *exchange) Param(name string) string     { return x.c.Param(name) }
func (x *exchange) SetHeader(name, value string) { x.c.Response().Header().Set(name, value) }
func (x *exchange) JSON(status int, v any)       { x.err = x.c.JSON(status, v) }
func (x *exchange) String(status int, s string)  { x.err = x.c.String(status, s) }
func (x *exchange) NoContent(status int)         { x.err = x.c.NoContent(status) }
func (x *exchange) Abort(status int, msg string) { x.err = echo.NewHTTPError(status, msg) }

func (x *exchange) Stream(status int, chunks ...string) {
	res := x.c.Response()
	res.WriteHeader(status)
	for _, c := range chunks {
		if _, err := io.WriteString(res, c); err != nil {
			x.err = err
			return
		}
		res.Flush()
	}
}
