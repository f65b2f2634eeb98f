// Package idemecho is the Echo adapter of idemkit: middleware that runs an
// Echo handler at most once per Idempotency-Key, through a
// coordinator.Coordinator, and replays the stored response to every retry.
//
//	e := echo.New()
//	e.Use(middleware.Recover())
//	e.POST("/orders/:id", createOrder, idemecho.Middleware(c, idemhttp.WithKeyScope(tenantOf)))
//
// It is a thin shell over idemhttp.Middleware, so the contract is
// idemhttp's, option for option (docs/http.md): the IETF Idempotency-Key
// header, scopes, fingerprints, the in-flight modes, replays flagged with
// Idempotent-Replayed, responses that cannot be replayed, and RFC 9457
// problems with 400, 401, 409, 413, 422 and 503. What Echo adds is named
// here: the operation is the matched route (c.Path()), handlers write
// through Echo's helpers, and an error a handler returns becomes the
// response that is stored. The table of
// github.com/idemkit/idempotency/idemhttp/middlewaretest runs against
// net/http, gin and Echo alike.
//
// It is Echo v4 (github.com/labstack/echo/v4), in a module of its own,
// github.com/idemkit/idempotency/idemecho, so that applications of the core
// module do not get Echo in their module graph.
package idemecho
