package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemkit/idempotency/internal/unprotected"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemkey"
)

// errNotStored is the action's error for a response that the store policy
// refuses: the coordinator releases the key, and the middleware sends the
// response anyway. A failure is not cached: a retry runs the handler again.
// A response that the policy allows but that cannot be stored (streamed,
// hijacked, too large) is not an error of the action: the codec refuses to
// encode it, and the coordinator keeps the key as not replayable.
var errNotStored = errors.New("idemhttp: response not stored by the store policy")

// Middleware returns net/http middleware that runs the handler at most once
// per Idempotency-Key, through c, and replays the stored response to every
// retry.
//
// A request is protected when its method is one of WithMethods (POST and
// PATCH by default) and it carries an Idempotency-Key header; without the
// header it passes through unprotected, or is refused with 400 under
// WithKeyRequired(true). The key is scoped to the caller by WithKeyScope and
// stored under an operation named by WithOperation, WithOperationFunc or the
// request's ServeMux pattern. The handler's response is buffered and, when
// the store policy allows, stored and sent; retries get the stored status,
// body and allow-listed headers with "Idempotent-Replayed: true". Refusals are
// problem+json: 400 for a missing or malformed key, 401 when the scope hook
// fails (with WithAuthChallenge's WWW-Authenticate), 413 for a body over
// WithMaxBodyBytes, 409 with Retry-After while the first request runs, 409
// without Retry-After (ProblemNotReplayable) once a request with the key was
// processed but its response could not be stored (streamed, hijacked or over
// WithMaxResponseBytes), 422 for a key reused for another request, 503 with
// Retry-After when the store fails and c fails closed.
//
// When c is disabled (coordinator.WithEnabled(false), the kill switch) the
// middleware steps aside: every request goes to the handler as it came, with
// no key check, scope hook, body limit or buffering.
//
// A handler that panics has sent nothing (unless it streamed); the key is
// released and the panic goes on to net/http. Middleware panics when c is nil
// or an option is invalid (see Option), as http.ServeMux.Handle does for a
// bad pattern.
func Middleware(c *coordinator.Coordinator, opts ...Option) func(http.Handler) http.Handler {
	if c == nil {
		panic("idemhttp: Middleware: coordinator is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	return func(next http.Handler) http.Handler {
		return &handler{c: c, cfg: &cfg, codec: codec{replay: cfg.replaySet}, next: next}
	}
}

type handler struct {
	c     *coordinator.Coordinator
	cfg   *config
	codec codec
	next  http.Handler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.c.Enabled() || !h.cfg.methodSet[r.Method] {
		// The kill switch (coordinator.WithEnabled(false)) steps aside
		// entirely: no key check, scope hook, body cap or buffering can
		// refuse or alter a request the handler would serve.
		h.next.ServeHTTP(w, r)
		return
	}
	values := r.Header[KeyHeader]
	switch {
	case len(values) == 0 && h.cfg.required:
		h.fail(w, r, problem(ProblemKeyMissing, http.StatusBadRequest,
			fmt.Sprintf("%s %s requires an %s header.", r.Method, r.URL.Path, KeyHeader), nil))
		return
	case len(values) == 0:
		unprotected.Report(h.c, r.Context(), h.operation(r)) // counted as unprotected{method="none"}
		h.next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		h.fail(w, r, problem(ProblemKeyInvalid, http.StatusBadRequest,
			fmt.Sprintf("The request has %d %s headers; send one.", len(values), KeyHeader), nil))
		return
	}
	key, err := parseKey(values[0])
	if err != nil {
		detail := err.Error()
		if ir := (*coordinator.InvalidRequestError)(nil); errors.As(err, &ir) {
			detail = ir.Reason
		}
		h.fail(w, r, problem(ProblemKeyInvalid, http.StatusBadRequest,
			fmt.Sprintf("The %s header is invalid: %s. Send 1 to %d visible ASCII characters, raw or as a quoted string.",
				KeyHeader, detail, coordinator.MaxKeyLen), err))
		return
	}
	if h.cfg.scope != nil {
		scope, err := h.cfg.scope(r)
		if err != nil {
			if h.cfg.challenge != "" {
				w.Header().Set("WWW-Authenticate", h.cfg.challenge)
			}
			h.fail(w, r, problem(ProblemCallerUnknown, http.StatusUnauthorized,
				"The caller could not be identified, so the idempotency key cannot be scoped to it.", err))
			return
		}
		key = idemkey.Scoped(scope, key)
	}
	body, ok := h.readBody(w, r)
	if !ok {
		return
	}
	call := coordinator.Call{
		Operation:   h.operation(r),
		Key:         key,
		Fingerprint: fingerprint(r, h.cfg.fpHeadersCanon, body),
		TTL:         h.cfg.ttl,
	}
	r = r.WithContext(r.Context()) // a shallow copy: the caller's request keeps its Body
	r.Body = io.NopCloser(bytes.NewReader(body))

	var own *response
	res, err := coordinator.DoWithCodec(r.Context(), h.c, call, h.codec, func(ctx context.Context) (*response, error) {
		rec := newRecorder(w, h.cfg.maxResponse)
		h.next.ServeHTTP(rec, r.WithContext(ctx))
		own = rec.result()
		if !h.cfg.storePolicy(own.status) {
			return own, errNotStored
		}
		return own, nil
	})
	switch {
	case own != nil && own.sent:
		// The handler streamed or hijacked: its response went out, and
		// nothing may follow it (not another caller's record that the
		// completion met, nor a problem about a failed commit, which the
		// observer reports).
		writeLive(w, own)
	case err == nil && res.Replayed:
		writeReplay(w, res.Value)
	case own != nil && (err == nil || errors.Is(err, errNotStored)):
		// The handler ran here: send its response, stored or not.
		writeLive(w, own)
	default:
		h.fail(w, r, h.problemFor(w, err))
	}
}

// operation names the request's operation: the option, else the function,
// else the route pattern, else DefaultOperation.
func (h *handler) operation(r *http.Request) string {
	if h.cfg.operation != "" {
		return h.cfg.operation
	}
	if f := h.cfg.operationFunc; f != nil {
		if op := OperationName(f(r)); op != "" {
			return op
		}
	}
	if op := OperationName(r.Pattern); op != "" {
		return op
	}
	return DefaultOperation
}

// readBody reads the request body for the fingerprint, refusing one over the
// limit with 413.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := h.cfg.maxBody
	tooLarge := problem(ProblemBodyTooLarge, http.StatusRequestEntityTooLarge,
		fmt.Sprintf("The request body is larger than %d bytes, the most an idempotent request may send.", limit), nil)
	if r.ContentLength > limit {
		h.fail(w, r, tooLarge)
		return nil, false
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		h.fail(w, r, tooLarge)
		return nil, false
	case err != nil:
		h.fail(w, r, problem(ProblemBodyUnreadable, http.StatusBadRequest, "The request body could not be read.", err))
		return nil, false
	case int64(len(body)) > limit:
		h.fail(w, r, tooLarge)
		return nil, false
	}
	return body, true
}

// problemFor maps an error of the coordinator, returned before the handler
// ran, to a Problem, setting Retry-After where it applies.
func (h *handler) problemFor(w http.ResponseWriter, err error) Problem {
	var inProgress *coordinator.InProgressError
	switch {
	case errors.As(err, &inProgress):
		w.Header().Set("Retry-After", retryAfter(h.cfg.retryAfter))
		return problem(ProblemInProgress, http.StatusConflict,
			"A request with this Idempotency-Key is still being processed. Retry it later with the same key.", err)
	case errors.Is(err, coordinator.ErrNotReplayable):
		// No Retry-After: a retry gets the same answer. Not the original
		// status: the record keeps none, and a 2xx without the handler's
		// body would pass for a success response that it is not.
		return problem(ProblemNotReplayable, http.StatusConflict,
			"A request with this Idempotency-Key was already processed, but its response could not be stored, so it cannot be returned again. Do not retry with this key: look the outcome up instead.", err)
	case errors.Is(err, coordinator.ErrKeyReuse):
		return problem(ProblemKeyReuse, http.StatusUnprocessableEntity,
			"This Idempotency-Key was used for a different request (method, path, query or body). Use a new key for a new request.", err)
	case errors.Is(err, coordinator.ErrStorage):
		w.Header().Set("Retry-After", retryAfter(h.cfg.retryAfter))
		return problem(ProblemStoreUnavailable, http.StatusServiceUnavailable,
			"The idempotency store is unavailable, so the request was not processed. Retry it later with the same key.", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return problem("about:blank", http.StatusServiceUnavailable,
			"The request ended before it was processed.", err)
	case errors.Is(err, coordinator.ErrInvalidRequest):
		// The key was checked above, so this is the server's configuration
		// (a TTL outside the coordinator's bounds), not the client's fault.
		return problem("about:blank", http.StatusInternalServerError,
			"The idempotency layer is misconfigured.", err)
	default:
		return problem("about:blank", http.StatusInternalServerError, "", err)
	}
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, p Problem) {
	h.cfg.problemWriter(w, r, p)
}

// retryAfter formats d as a Retry-After value: whole seconds, rounded up, at
// least 1.
func retryAfter(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	return strconv.FormatInt(max(s, 1), 10)
}

// writeLive sends the response the handler just produced, as net/http would
// have sent it: the header as it was when the status was set (outer
// middleware's headers as the handler left them, deleted ones included),
// then the body, then the trailers.
func writeLive(w http.ResponseWriter, resp *response) {
	if !resp.sent {
		setHeader(w.Header(), resp.header)
		w.WriteHeader(resp.status)
		if len(resp.body) > 0 {
			_, _ = w.Write(resp.body)
		}
	}
	// Set after the body, these go out as trailers: declared ones because
	// the header sent had them in Trailer, the others by their
	// http.TrailerPrefix.
	for k, vs := range resp.trailer {
		w.Header()[k] = vs
	}
}

// writeReplay sends a stored response: its status, body and allow-listed
// headers, marked as a replay. The headers outer middleware set on this
// request stay, as the handler's did on the first: stored values the handler
// added are added to them, and headers it replaced or removed are replaced or
// removed.
func writeReplay(w http.ResponseWriter, resp *response) {
	h := w.Header()
	for k, vs := range resp.replace {
		h[k] = slices.Clone(vs) // nil stays nil: a suppressed header
	}
	for k, vs := range resp.add {
		h[k] = append(h[k], vs...)
	}
	h.Set(ReplayedHeader, "true")
	w.WriteHeader(resp.status)
	if len(resp.body) > 0 && bodyAllowed(resp.status) {
		_, _ = w.Write(resp.body)
	}
}
