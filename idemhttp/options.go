package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// Defaults of the options.
const (
	// DefaultMaxBodyBytes is the largest request body the middleware reads to
	// fingerprint a request (WithMaxBodyBytes): 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxResponseBytes is the largest response body the middleware
	// buffers and stores (WithMaxResponseBytes): 1 MiB, the coordinator's
	// default result limit.
	DefaultMaxResponseBytes = coordinator.DefaultMaxResultBytes
	// DefaultOperation is the operation name of a request that has no route
	// pattern (the middleware wraps a whole mux, not one route) when neither
	// WithOperation nor WithOperationFunc names one.
	DefaultOperation = "http"
)

// An Option configures the middleware; pass options to Middleware. A nil
// Option is skipped. Middleware cannot return an error, so it panics on an
// invalid option value, with an error that names the option, the value and
// what is accepted (each a *coordinator.OptionError).
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	methods        []string
	required       bool
	operation      string
	operationFunc  func(*http.Request) string
	scope          func(*http.Request) (string, error)
	challenge      string
	maxBody        int64
	fpHeaders      []string
	maxResponse    int
	replayHeaders  []string
	storePolicy    func(status int) bool
	ttl            time.Duration
	retryAfter     time.Duration
	problemWriter  func(http.ResponseWriter, *http.Request, Problem)
	replaySet      map[string]bool // canonical names of replayHeaders
	methodSet      map[string]bool
	fpHeadersCanon []string // sorted canonical names of fpHeaders
}

func defaultConfig() config {
	return config{
		methods:       []string{http.MethodPost, http.MethodPatch},
		maxBody:       DefaultMaxBodyBytes,
		maxResponse:   DefaultMaxResponseBytes,
		replayHeaders: DefaultReplayHeaders(),
		storePolicy:   DefaultStorePolicy,
		retryAfter:    DefaultRetryAfter,
	}
}

// WithMethods sets the request methods the middleware protects; requests with
// other methods pass through untouched. Methods are compared exactly (they
// are case-sensitive in HTTP). Default POST and PATCH. Middleware panics when
// the list is empty or a name is not a token (RFC 9110).
func WithMethods(methods ...string) Option {
	ms := slices.Clone(methods)
	return optionFunc(func(c *config) { c.methods = ms })
}

// WithKeyRequired sets whether a protected request without an
// Idempotency-Key header is answered with 400 (problem type ProblemKeyMissing)
// instead of passed through unprotected. Default false.
func WithKeyRequired(required bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// WithOperation names the operation of every request the middleware
// protects, in place of the route pattern. The name must satisfy
// coordinator.ValidateOperation; Middleware panics otherwise. The last of
// WithOperation and WithOperationFunc wins.
func WithOperation(name string) Option {
	return optionFunc(func(c *config) { c.operation, c.operationFunc = name, nil })
}

// WithOperationFunc names the operation of each protected request. Its result
// is mapped to the operation rules with OperationName; an empty result means
// the route pattern, then DefaultOperation. The last of WithOperation and
// WithOperationFunc wins; nil removes the function.
func WithOperationFunc(f func(*http.Request) string) Option {
	return optionFunc(func(c *config) { c.operation, c.operationFunc = "", f })
}

// WithKeyScope sets the hook that tells whose request it is (the tenant, the
// account, the user), so that keys of different callers never meet: the
// stored key is derived from the scope and the client's key, and a caller
// who sends another caller's key gets their own fresh response, never the
// other's. When the hook returns an error the request is refused with 401
// (problem type ProblemCallerUnknown, with the WithAuthChallenge challenge)
// and the handler does not run.
//
// Scopes are compared as strings: every caller whose hook returns the same
// scope shares one key space, and the empty scope "" is one scope like any
// other, shared by all callers that get it. Return typed scopes
// ("tenant:42", "user:42") when IDs of different kinds can be equal.
//
// Without a scope hook (the default) every caller shares one key space per
// operation: anyone who learns or guesses another client's key receives that
// client's stored response. Set it on every multi-tenant API.
func WithKeyScope(scope func(*http.Request) (string, error)) Option {
	return optionFunc(func(c *config) { c.scope = scope })
}

// WithAuthChallenge sets the WWW-Authenticate challenge of the 401 that
// refuses a request whose scope hook (WithKeyScope) fails, e.g.
// `Bearer realm="api"`. RFC 9110 requires a 401 to carry one, and only the
// application knows its authentication scheme: set this, or keep
// authentication (which answers with its own challenge) before the
// middleware so that the hook does not fail. The header is set on the
// ResponseWriter before the problem writer runs. Default "": none. Middleware
// panics when the challenge holds control characters.
func WithAuthChallenge(challenge string) Option {
	return optionFunc(func(c *config) { c.challenge = challenge })
}

// WithMaxBodyBytes sets the largest request body the middleware reads to
// fingerprint a protected request; a larger body is refused with 413
// (problem type ProblemBodyTooLarge) before the handler runs. Default
// DefaultMaxBodyBytes (1 MiB). Middleware panics when n is not positive.
func WithMaxBodyBytes(n int64) Option {
	return optionFunc(func(c *config) { c.maxBody = n })
}

// WithFingerprintHeaders adds request headers to the fingerprint, which is
// otherwise the method, path, query and body. A key reused with another value
// of one of these headers is refused with 422. Default none. Middleware
// panics when a name is not a token (RFC 9110).
func WithFingerprintHeaders(names ...string) Option {
	ns := slices.Clone(names)
	return optionFunc(func(c *config) { c.fpHeaders = ns })
}

// WithMaxResponseBytes sets the largest response body that is buffered and
// stored. A handler that writes more has its response streamed to the client
// as it writes it, and not stored: the coordinator reports a
// record_validation_error and keeps the key as not replayable, so a retry
// gets 409 ProblemNotReplayable and the handler does not run again.
// Default DefaultMaxResponseBytes (1 MiB). The coordinator's own limit
// (coordinator.WithMaxResultBytes) applies to the stored envelope (body plus
// status and headers) too. Middleware panics when n is not positive.
func WithMaxResponseBytes(n int) Option {
	return optionFunc(func(c *config) { c.maxResponse = n })
}

// WithReplayHeaders sets the response headers that are stored and replayed,
// replacing DefaultReplayHeaders. Set-Cookie, Authorization and the other
// headers listed in the package documentation are never stored: Middleware
// panics when names includes one, or a name that is not a token (RFC 9110).
func WithReplayHeaders(names ...string) Option {
	ns := slices.Clone(names)
	return optionFunc(func(c *config) { c.replayHeaders = ns })
}

// WithStorePolicy sets which response statuses are stored and replayed. A
// response whose status the policy refuses is still sent to its client, but
// the key is released, so a retry runs the handler again. Default
// DefaultStorePolicy; nil also means DefaultStorePolicy.
func WithStorePolicy(store func(status int) bool) Option {
	return optionFunc(func(c *config) { c.storePolicy = store })
}

// WithTTL sets how long stored responses are kept (coordinator.Call.TTL),
// unless the operator set a TTL for the operation (coordinator
// WithOperationTTLs, IDEMPOTENCY_OPERATION_TTLS), which wins. Default 0: the
// coordinator's default TTL.
// A TTL outside the coordinator's bounds fails every protected request with
// 500. Middleware panics when d is negative.
func WithTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ttl = d })
}

// DefaultRetryAfter is the default Retry-After of the 409 and 503 responses;
// see WithRetryAfter.
const DefaultRetryAfter = time.Second

// WithRetryAfter sets the Retry-After of a 409 (the first request with the
// key is still running) and of a 503 (the store is down): when a client
// should try again. It is sent in whole seconds, rounded up. Default
// DefaultRetryAfter (1s): most actions take milliseconds, so the holder's
// remaining lease (30s by default, the time a crashed holder keeps its key)
// would keep clients away far too long. Middleware panics when d is not
// positive.
func WithRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryAfter = d })
}

// WithProblemWriter sets the function that writes the middleware's error
// responses, for APIs with their own error format. The middleware has set
// Retry-After on w where the problem calls for it. Default WriteProblem
// (RFC 9457 application/problem+json); nil also means WriteProblem.
func WithProblemWriter(write func(w http.ResponseWriter, r *http.Request, p Problem)) Option {
	return optionFunc(func(c *config) { c.problemWriter = write })
}

// DefaultReplayHeaders returns the response headers that are stored and
// replayed by default: those that describe the stored body or the created
// resource. Headers that describe one response on one connection (Date,
// Content-Length, X-Request-Id, rate-limit counters) and credentials are not
// among them.
func DefaultReplayHeaders() []string {
	return []string{
		"Cache-Control",
		"Content-Disposition",
		"Content-Encoding",
		"Content-Language",
		"Content-Location",
		"Content-Type",
		"ETag",
		"Expires",
		"Last-Modified",
		"Link",
		"Location",
		"Vary",
	}
}

// DefaultStorePolicy is the default store policy: every status is stored
// except 408 Request Timeout, 429 Too Many Requests, 499 (Client Closed
// Request, which grpc-gateway answers for a cancelled call) and the 5xx
// server errors, which say "try again" or "the request did not finish"
// rather than describe its outcome, as gRPC's Canceled and
// DeadlineExceeded are not stored.
func DefaultStorePolicy(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, statusClientClosedRequest:
		return false
	}
	return status < 500
}

// statusClientClosedRequest is nginx's and grpc-gateway's status for a
// request whose client went away before the answer.
const statusClientClosedRequest = 499

// isToken reports whether s is an RFC 9110 token, the syntax of methods and
// header field names.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// neverReplayed reports whether the response header k (canonical) is never
// stored, whatever the allow-list says: credentials, and headers that belong
// to one message on one connection.
func neverReplayed(k string) bool {
	switch k {
	case "Authorization", "Proxy-Authorization", "Proxy-Authenticate", "Cookie", "Set-Cookie", "Set-Cookie2",
		"Connection", "Keep-Alive", "Transfer-Encoding", "Te", "Trailer", "Upgrade", "Content-Length", "Date",
		ReplayedHeader:
		return true
	}
	return strings.HasPrefix(k, http.TrailerPrefix)
}

// validate checks the options and fills in the defaults that depend on them.
// It reports every refused value at once, each as a *coordinator.OptionError.
func (c *config) validate() error {
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, &coordinator.OptionError{Option: option, Err: fmt.Errorf(format, args...)})
	}
	if len(c.methods) == 0 {
		bad("WithMethods", "must name at least one method, got none")
	}
	c.methodSet = make(map[string]bool, len(c.methods))
	for _, m := range c.methods {
		if !isToken(m) {
			bad("WithMethods", "must name methods, which are tokens (RFC 9110), got %q", m)
		}
		c.methodSet[m] = true
	}
	if c.operation != "" {
		if err := coordinator.ValidateOperation(c.operation); err != nil {
			bad("WithOperation", "must be 1 to %d bytes of [A-Za-z0-9._-] (coordinator.ValidateOperation), got %q",
				coordinator.MaxOperationLen, c.operation)
		}
	}
	if c.maxBody <= 0 {
		bad("WithMaxBodyBytes", "must be positive, got %d", c.maxBody)
	}
	if c.maxResponse <= 0 {
		bad("WithMaxResponseBytes", "must be positive, got %d", c.maxResponse)
	}
	if strings.ContainsFunc(c.challenge, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		bad("WithAuthChallenge", "must not hold control characters, got %q", c.challenge)
	}
	if c.ttl < 0 {
		bad("WithTTL", "must not be negative (0s means the coordinator's default), got %v", c.ttl)
	}
	if c.retryAfter <= 0 {
		bad("WithRetryAfter", "must be positive, got %v", c.retryAfter)
	}
	c.replaySet = make(map[string]bool, len(c.replayHeaders))
	for _, h := range c.replayHeaders {
		k := http.CanonicalHeaderKey(h)
		switch {
		case neverReplayed(k):
			bad("WithReplayHeaders", "must not name a header that is never replayed (see the package documentation), got %s", k)
		case !isToken(h):
			bad("WithReplayHeaders", "must name header fields, which are tokens (RFC 9110), got %q", h)
		}
		c.replaySet[k] = true
	}
	for _, h := range c.fpHeaders {
		if !isToken(h) {
			bad("WithFingerprintHeaders", "must name header fields, which are tokens (RFC 9110), got %q", h)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("idemhttp: invalid options: %w", errors.Join(errs...))
	}
	c.fpHeadersCanon = nil
	for _, h := range c.fpHeaders {
		c.fpHeadersCanon = append(c.fpHeadersCanon, http.CanonicalHeaderKey(h))
	}
	slices.Sort(c.fpHeadersCanon)
	c.fpHeadersCanon = slices.Compact(c.fpHeadersCanon)
	if c.storePolicy == nil {
		c.storePolicy = DefaultStorePolicy
	}
	if c.problemWriter == nil {
		c.problemWriter = func(w http.ResponseWriter, _ *http.Request, p Problem) { WriteProblem(w, p) }
	}
	return nil
}
