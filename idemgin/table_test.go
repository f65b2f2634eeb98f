package idemgin_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemgin"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idemhttp/middlewaretest"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestMain checks that no test leaves a goroutine behind, and stops the
// redis-server that the tests start.
func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(redistest.Main(m))
}

// TestBehaviour runs the HTTP behaviour table of idemhttp on gin and a real
// Redis.
func TestBehaviour(t *testing.T) {
	middlewaretest.TestMiddleware(t, ginFramework{}, redisStore)
}

// redisStore returns a store on the tests' redis-server, under a key prefix
// of t's own.
func redisStore(t *testing.T) idemstore.Store {
	return redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(redistest.Prefix(t)))
}

// ginFramework mounts the table's routes on a gin engine with gin's
// recovery (quiet: the table's panic is expected), each behind Middleware.
type ginFramework struct{}

func (ginFramework) Serve(c *coordinator.Coordinator, opts []idemhttp.Option, routes ...middlewaretest.Route) http.Handler {
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard))
	mw := idemgin.Middleware(c, opts...)
	for _, rt := range routes {
		r.Handle(rt.Method, rt.Path, mw, func(c *gin.Context) { rt.Handle(exchange{c}) })
	}
	return r
}

// exchange writes the table's responses with gin's helpers.
type exchange struct{ c *gin.Context }

func (x exchange) Request() *http.Request       { return x.c.Request }
func (x exchange) Param(name string) string     { return x.c.Param(name) }
func (x exchange) SetHeader(name, value string) { x.c.Header(name, value) }
func (x exchange) JSON(status int, v any)       { x.c.JSON(status, v) }
func (x exchange) String(status int, s string)  { x.c.String(status, "%s", s) }
func (x exchange) NoContent(status int)         { x.c.Status(status) }
func (x exchange) Abort(status int, msg string) { x.c.AbortWithStatusJSON(status, gin.H{"error": msg}) }

func (x exchange) Stream(status int, chunks ...string) {
	x.c.Status(status)
	i := 0
	x.c.Stream(func(w io.Writer) bool {
		_, _ = io.WriteString(w, chunks[i])
		i++
		return i < len(chunks)
	})
}
