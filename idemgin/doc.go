// Package idemgin is the gin adapter of idemkit: middleware that runs a gin
// handler chain at most once per Idempotency-Key, through a
// coordinator.Coordinator, and replays the stored response to every retry.
//
//	r := gin.New()
//	r.Use(gin.Recovery())
//	r.POST("/orders/:id", idemgin.Middleware(c, idemhttp.WithKeyScope(tenantOf)), createOrder)
//
// It is a thin shell over idemhttp.Middleware, so the contract is
// idemhttp's, option for option (docs/http.md): the IETF Idempotency-Key
// header, scopes, fingerprints, the in-flight modes, replays flagged with
// Idempotent-Replayed, responses that cannot be replayed, and RFC 9457
// problems with 400, 401, 409, 413, 422 and 503. What gin adds is named
// here: the operation is the matched route (c.FullPath()), and the handlers
// write through gin's own helpers. The table of
// github.com/idemkit/idempotency/idemhttp/middlewaretest runs against
// net/http, gin and Echo alike.
//
// It is a module of its own, github.com/idemkit/idempotency/idemgin, so that
// applications of the core module do not get gin in their module graph.
package idemgin
