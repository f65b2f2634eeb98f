package idemgin

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
)

// Middleware returns gin middleware that runs the rest of the handler chain
// at most once per Idempotency-Key, through c, and replays the stored
// response to every retry, with the contract of idemhttp.Middleware: opts
// are idemhttp's options, and the answers, problems and headers are
// idemhttp's.
//
// The operation is the matched route: c.FullPath() after the method, so
// "POST /orders/:id" stores its keys under "POST.orders.id" for every order,
// unless idemhttp.WithOperation or idemhttp.WithOperationFunc names it. The
// handlers after the middleware see gin's own context (c.Keys, c.Params,
// c.FullPath()), and write through gin's helpers (c.JSON, c.String, c.Status,
// c.Stream, the Abort family) as they would without it; what they write is
// buffered, stored and then sent. When the middleware answers a request
// itself (a replay, a refusal), it aborts the chain.
//
// Middleware panics when c is nil or an option is invalid, as
// idemhttp.Middleware does.
func Middleware(c *coordinator.Coordinator, opts ...idemhttp.Option) gin.HandlerFunc {
	mw := idemhttp.Middleware(c, opts...)
	return func(gc *gin.Context) {
		outer := gc.Writer
		ran := false
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			req := gc.Request
			gc.Request = r
			defer func() { gc.Request = req }()
			if w == http.ResponseWriter(outer) { // not protected: as if the middleware were not there
				gc.Next()
				return
			}
			// The status gin holds so far: 200, or 404/405 for a request
			// no route matched (the middleware on the engine), or one an
			// earlier handler set (c.Status).
			rw := &writer{ResponseWriter: w, outer: outer, status: outer.Status(), size: -1}
			gc.Writer = rw
			defer func() { gc.Writer = outer }()
			gc.Next()
			// gin sends a status set without a body (c.Status) once the
			// chain returns: so does the middleware, to what it records.
			rw.WriteHeaderNow()
		}))
		h.ServeHTTP(outer, routed(gc))
		if !ran {
			gc.Abort()
		}
	}
}

// routed returns a copy of gc's request that carries gc, with the matched
// route as its pattern, which idemhttp names the operation after
// ("POST /orders/:id"); gin has no route for a request it answers with 404.
func routed(gc *gin.Context) *http.Request {
	r := gc.Request.WithContext(context.WithValue(gc.Request.Context(), ginContext{}, gc))
	if path := gc.FullPath(); path != "" {
		r.Pattern = r.Method + " " + path
	}
	return r
}

// ginContext is the request context key of the gin context, for
// WithKeyScope.
type ginContext struct{}

// WithKeyScope is idemhttp.WithKeyScope with gin's context: scope tells
// whose request it is from what earlier middleware put in c (c.Set, c.Keys),
// so that keys of different callers never meet. When it returns an error
// the request is refused with 401 (idemhttp.ProblemCallerUnknown) and the
// handler does not run. It works in Middleware only: elsewhere every request
// is refused.
func WithKeyScope(scope func(c *gin.Context) (string, error)) idemhttp.Option {
	return idemhttp.WithKeyScope(func(r *http.Request) (string, error) {
		gc, ok := r.Context().Value(ginContext{}).(*gin.Context)
		if !ok {
			return "", errors.New("idemgin: WithKeyScope is an option of idemgin.Middleware")
		}
		return scope(gc)
	})
}

// writer is the gin.ResponseWriter of the handlers after the middleware: it
// writes to idemhttp's recorder with gin's semantics, in which a status is
// held until the body (or WriteHeaderNow), so that the headers a helper sets
// after the status (c.JSON's Content-Type) are part of the response.
type writer struct {
	http.ResponseWriter                    // idemhttp's recorder
	outer               gin.ResponseWriter // the connection's writer
	status              int
	size                int // -1 until the header is written
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := io.WriteString(w.ResponseWriter, s)
	w.size += n
	return n, err
}

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != -1 }

// Flush streams the response: it goes to the client as it is written, and
// is not stored (idemhttp keeps the key as not replayable).
func (w *writer) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection to the handler; nothing is stored.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size < 0 {
		w.size = 0
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// CloseNotify reports the client going away, as the connection's writer
// does (gin.ResponseWriter requires it).
func (w *writer) CloseNotify() <-chan bool { return w.outer.CloseNotify() }

// Pusher returns nil: a response that is recorded to be replayed cannot
// push.
func (w *writer) Pusher() http.Pusher { return nil }

// Unwrap returns idemhttp's recorder, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }
