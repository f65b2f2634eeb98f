package idemecho

import (
	"context"
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// Middleware returns Echo middleware that runs the next handler at most once
// per Idempotency-Key, through c, and replays the stored response to every
// retry, with the contract of idemhttp.Middleware: opts are idemhttp's
// options, and the answers, problems and headers are idemhttp's.
//
// The operation is the matched route: c.Path() after the method, so
// "POST /orders/:id" stores its keys under "POST.orders.id" for every order,
// unless idemhttp.WithOperation or idemhttp.WithOperationFunc names it. Add
// it with Echo#Use, a group's Use or a route's middleware (not Echo#Pre,
// which runs before the route is known). The next handler writes through
// Echo's helpers (c.JSON, c.String, c.NoContent, c.Stream) as it would
// without the middleware. An error it returns is answered by Echo's
// HTTPErrorHandler inside the middleware, so that the error response (an
// *echo.HTTPError's status and message) is what the key stores and replays,
// as any other response; the middleware then returns the error, with the
// response committed, so that middleware before it (a logger) sees it. A
// replay returns nil. A panic goes on to Echo's Recover middleware and
// releases the key. What the next handler writes is buffered, stored and
// then sent.
//
// Middleware panics when c is nil or an option is invalid, as
// idemhttp.Middleware does.
func Middleware(c *coordinator.Coordinator, opts ...idemhttp.Option) echo.MiddlewareFunc {
	mw := idemhttp.Middleware(c, opts...)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(ec echo.Context) error {
			outer := ec.Response()
			var passed error
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				req := ec.Request()
				ec.SetRequest(r)
				defer ec.SetRequest(req)
				if w == http.ResponseWriter(outer) { // not protected: as if the middleware were not there
					passed = next(ec)
					return
				}
				// The next handler writes to idemhttp's recorder through a
				// Response of its own; the connection's Response is written
				// once, by idemhttp, with what was recorded.
				ec.SetResponse(echo.NewResponse(w, ec.Echo()))
				defer ec.SetResponse(outer)
				if passed = next(ec); passed != nil {
					ec.Error(passed)
				}
			}))
			h.ServeHTTP(outer, routed(ec))
			// A protected handler's error has been answered (and the
			// answer written): it goes on up the chain for the loggers and
			// metrics there, and Echo's error handler, which skips a
			// committed response, writes nothing more.
			return passed
		}
	}
}

// routed returns a copy of ec's request that carries ec, with the matched
// route as its pattern, which idemhttp names the operation after
// ("POST /orders/:id").
func routed(ec echo.Context) *http.Request {
	r := ec.Request().WithContext(context.WithValue(ec.Request().Context(), echoContext{}, ec))
	if path := ec.Path(); path != "" {
		r.Pattern = r.Method + " " + path
	}
	return r
}

// echoContext is the request context key of the Echo context, for
// WithKeyScope.
type echoContext struct{}

// WithKeyScope is idemhttp.WithKeyScope with Echo's context: scope tells
// whose request it is from what earlier middleware put in c (c.Set), so that
// keys of different callers never meet. When it returns an error the
// request is refused with 401 (idemhttp.ProblemCallerUnknown) and the
// handler does not run. It works in Middleware only: elsewhere every request
// is refused.
func WithKeyScope(scope func(c echo.Context) (string, error)) idemhttp.Option {
	return idemhttp.WithKeyScope(func(r *http.Request) (string, error) {
		ec, ok := r.Context().Value(echoContext{}).(echo.Context)
		if !ok {
			return "", errors.New("idemecho: WithKeyScope is an option of idemecho.Middleware")
		}
		return scope(ec)
	})
}
