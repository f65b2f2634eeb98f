package idemhttp_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/idemhttp/middlewaretest"
	"github.com/idemkit/idempotency/internal/redistest"
	"github.com/idemkit/idempotency/redisrepo"
)

// TestBehaviour runs the HTTP behaviour table, which idemgin and idemecho run
// too, on net/http's ServeMux and a real Redis.
func TestBehaviour(t *testing.T) {
	middlewaretest.TestMiddleware(t, netHTTP{}, func(t *testing.T) idemstore.Store {
		return redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(redistest.Prefix(t)))
	})
}

// netHTTP mounts the table's routes on a ServeMux, each behind Middleware.
type netHTTP struct{}

func (netHTTP) Serve(c *coordinator.Coordinator, opts []idemhttp.Option, routes ...middlewaretest.Route) http.Handler {
	mux := http.NewServeMux()
	mw := idemhttp.Middleware(c, opts...)
	for _, r := range routes {
		mux.Handle(r.Method+" "+middlewaretest.PathPattern(r.Path), mw(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.Handle(exchange{w, req})
		})))
	}
	return mux
}

// exchange writes the table's responses with net/http alone.
type exchange struct {
	w http.ResponseWriter
	r *http.Request
}

func (x exchange) Request() *http.Request       { return x.r }
func (x exchange) Param(name string) string     { return x.r.PathValue(name) }
func (x exchange) SetHeader(name, value string) { x.w.Header().Set(name, value) }
func (x exchange) NoContent(status int)         { x.w.WriteHeader(status) }
func (x exchange) Abort(status int, msg string) { http.Error(x.w, msg, status) }
func (x exchange) String(status int, s string) {
	x.send(status, "text/plain; charset=utf-8", []byte(s))
}
func (x exchange) JSON(status int, v any) {
	b, _ := json.Marshal(v)
	x.send(status, "application/json", b)
}
func (x exchange) send(status int, ct string, b []byte) {
	x.w.Header().Set("Content-Type", ct)
	x.w.WriteHeader(status)
	_, _ = x.w.Write(b)
}

func (x exchange) Stream(status int, chunks ...string) {
	x.w.WriteHeader(status)
	for _, c := range chunks {
		_, _ = io.WriteString(x.w, c)
		_ = http.NewResponseController(x.w).Flush()
	}
}
