// Package middlewaretest is the behaviour table of idemkit's HTTP
// middleware: one set of cases that the middleware of every web framework
// (idemhttp for net/http, idemgin, idemecho) passes, so that a difference
// between frameworks is a failing test rather than a surprise.
//
// A framework's tests implement Framework, mounting the table's routes on
// the framework's router behind its middleware, and Exchange, writing the
// table's responses with the framework's own helpers (gin's c.JSON, Echo's
// c.String, ...); then they call TestMiddleware with the store to run on:
//
//	func TestBehaviour(t *testing.T) {
//		middlewaretest.TestMiddleware(t, ginFramework{}, func(t *testing.T) idemstore.Store {
//			return redisrepo.New(redistest.Server(t), redisrepo.WithKeyPrefix(redistest.Prefix(t)))
//		})
//	}
//
// Every request goes through a real HTTP server (httptest.Server). The
// cases check the contract of docs/http.md: replay of status, body and safe
// headers with Idempotent-Replayed, key reuse, the in-flight modes, scopes,
// responses that cannot be replayed, store outages, request bodies, panics,
// the operation named after the matched route, and concurrent duplicates.
package middlewaretest

import (
	"net/http"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// A Framework serves the table's routes through one web framework.
type Framework interface {
	// Serve returns the framework's router as an http.Handler, serving
	// routes behind the framework's idempotency middleware made from c and
	// opts, inside the panic recovery that the framework's applications
	// usually have (none for net/http, whose server recovers).
	Serve(c *coordinator.Coordinator, opts []idemhttp.Option, routes ...Route) http.Handler
}

// A Route is one route of the table.
type Route struct {
	// Method is the route's method, such as "POST".
	Method string
	// Path is the route's path, with ":name" for a parameter, as gin and
	// Echo write it ("/orders/:id"); net/http mounts it as "/orders/{id}".
	Path string
	// Handle answers the route's requests through the framework.
	Handle func(Exchange)
}

// An Exchange is one request and its response as the framework's handler
// sees them. Each Framework implements it with the framework's own helpers,
// so that the table exercises what a handler of that framework writes.
type Exchange interface {
	// Request returns the request, as the handler gets it.
	Request() *http.Request
	// Param returns the value of the route's parameter name.
	Param(name string) string
	// SetHeader sets a response header.
	SetHeader(name, value string)
	// JSON answers status with v as JSON.
	JSON(status int, v any)
	// String answers status with s as text/plain.
	String(status int, s string)
	// NoContent answers status without a body, setting only the status
	// (gin: c.Status, whose status is sent once the handler returns).
	NoContent(status int)
	// Stream answers status and writes chunks one by one, flushing each.
	Stream(status int, chunks ...string)
	// Abort ends the request with an error status in the framework's way
	// (gin: c.AbortWithStatusJSON; Echo: the handler returns an
	// *echo.HTTPError; net/http: http.Error).
	Abort(status int, message string)
}

// PathPattern rewrites a Route path's ":name" parameters to net/http's
// "{name}": "/orders/:id" becomes "/orders/{id}".
func PathPattern(path string) string {
	out := make([]byte, 0, len(path)+4)
	for i := 0; i < len(path); i++ {
		if path[i] != ':' || i == 0 || path[i-1] != '/' {
			out = append(out, path[i])
			continue
		}
		j := i + 1
		for j < len(path) && path[j] != '/' {
			j++
		}
		out = append(out, '{')
		out = append(out, path[i+1:j]...)
		out = append(out, '}')
		i = j - 1
	}
	return string(out)
}

// TestMiddleware runs the table against fw, each case with a coordinator
// over a store from newStore (a fresh one per case, or one with a key prefix
// of the case's own).
func TestMiddleware(t *testing.T, fw Framework, newStore func(t *testing.T) idemstore.Store) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(&env{t: t, fw: fw, newStore: newStore})
		})
	}
}
