package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/internal/protorpc"
)

// The metadata keys the interceptors speak. gRPC metadata keys are lowercase.
const (
	// DefaultKeyHeader is the request metadata key that carries the
	// idempotency key unless WithKeyHeader names another.
	DefaultKeyHeader = "idempotency-key"
	// ReplayedHeader is the response header metadata key set to "true" on
	// every replayed response, a stored error status included.
	ReplayedHeader = "idempotent-replayed"
)

// DefaultRetryAfter is the longest retry delay that the RetryInfo of an
// Aborted (in progress) or Unavailable (store down) refusal advises; see
// WithRetryAfter.
const DefaultRetryAfter = protorpc.DefaultRetryAfter

// An Option configures the interceptors; pass options to
// UnaryServerInterceptor or UnaryClientInterceptor. A nil Option is skipped.
// The interceptors cannot return an error, so they panic on an invalid
// option value, with an error that names the option, the value and what is
// accepted (each a *coordinator.OptionError). The client interceptor reads
// WithKeyHeader and WithMethods and ignores the others, but checks them all.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	header      string
	methods     []string
	required    bool
	operation   func(fullMethod string) string
	scope       func(context.Context) (string, error)
	storePolicy func(codes.Code) bool
	ttl         time.Duration
	retryAfter  time.Duration
	methodSet   map[string]bool // nil: every method
}

func defaultConfig() config {
	return config{
		header:      DefaultKeyHeader,
		storePolicy: DefaultStorePolicy,
		retryAfter:  DefaultRetryAfter,
	}
}

// newConfig applies opts to the defaults and validates the result.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	return cfg, cfg.validate()
}

// WithKeyHeader sets the metadata key that carries the idempotency key, on
// the server (where it is read) and on the client (where it is attached).
// It is lowercased, as gRPC lowercases metadata keys. Default
// DefaultKeyHeader ("idempotency-key"). The interceptors panic when name is
// empty, is not a valid metadata key ([0-9a-z_.-]), starts with "grpc-"
// (reserved by gRPC) or ends in "-bin" (binary metadata).
func WithKeyHeader(name string) Option {
	return optionFunc(func(c *config) { c.header = strings.ToLower(name) })
}

// WithMethods limits the interceptors to the named methods, given as full
// method names ("/payments.v1.Payments/Charge"). Calls of other methods pass
// through untouched: the server neither reads nor requires a key for them,
// and the client attaches none. Default: every unary method. The
// interceptors panic when the list is empty or a name is not of the form
// "/service/method".
func WithMethods(fullMethods ...string) Option {
	ms := append([]string{}, fullMethods...) // not nil: WithMethods() is refused
	return optionFunc(func(c *config) { c.methods = ms })
}

// WithKeyRequired sets whether the server interceptor refuses a call without
// a key with InvalidArgument (ErrorInfo reason ReasonKeyMissing) instead of
// passing it through unprotected. Default false. Combine it with WithMethods,
// so that reads do not need a key.
func WithKeyRequired(required bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// WithOperation sets the function that names the operation of a call from
// its full method name. Its result must satisfy
// coordinator.ValidateOperation; a call for which it does not fails with
// Internal, and the handler does not run. Default (and when f is nil)
// idemhttp.OperationName, which maps a full method as it maps a route:
// "/payments.v1.Payments/Charge" becomes "payments.v1.Payments.Charge".
func WithOperation(f func(fullMethod string) string) Option {
	return optionFunc(func(c *config) { c.operation = f })
}

// WithKeyScope sets the hook that tells whose call it is (the tenant, the
// account, the user), read from the call's context, typically from what an
// authentication interceptor put there, or from peer credentials. The stored
// key is derived from the scope and the client's key, so a caller who sends
// another caller's key gets their own fresh response, never the other's.
// When the hook returns an error the call is refused with Unauthenticated
// (ErrorInfo reason ReasonCallerUnknown) and the handler does not run.
//
// Scopes are compared as strings: every caller whose hook returns the same
// scope shares one key space, the empty scope "" included. Return typed
// scopes ("tenant:42", "user:42") when IDs of different kinds can be equal.
//
// Without a scope hook (the default) every caller shares one key space per
// operation: anyone who learns or guesses another client's key receives that
// client's stored response. Set it on every service with more than one
// client.
func WithKeyScope(scope func(ctx context.Context) (string, error)) Option {
	return optionFunc(func(c *config) { c.scope = scope })
}

// WithStorePolicy sets which outcomes of the handler are stored and
// replayed, by status code: codes.OK for a response, another code for an
// error status the handler returned (an error that is not a status counts as
// codes.Unknown, a context error as codes.Canceled or
// codes.DeadlineExceeded). An outcome the policy refuses still goes to its
// caller, but the key is released, so a retry runs the handler again.
// Default DefaultStorePolicy; nil also means DefaultStorePolicy.
func WithStorePolicy(store func(code codes.Code) bool) Option {
	return optionFunc(func(c *config) { c.storePolicy = store })
}

// WithTTL sets how long stored outcomes are kept (coordinator.Call.TTL),
// unless the operator set a TTL for the operation (coordinator
// WithOperationTTLs, IDEMPOTENCY_OPERATION_TTLS), which wins. Default 0: the
// coordinator's default TTL. A TTL outside the coordinator's bounds fails
// every protected call with Internal. The interceptors panic when d is
// negative.
func WithTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ttl = d })
}

// WithRetryAfter sets the longest retry delay advised by the
// google.rpc.RetryInfo detail (and the grpc-retry-pushback-ms trailer) of an
// Aborted refusal (the first call with the key still runs) and of an
// Unavailable one (the store is down). An in-progress refusal advises the
// holder's remaining lease when that is shorter. Default DefaultRetryAfter
// (1s): most handlers take milliseconds, while a crashed holder keeps its
// key for a whole lease (30s by default), which would keep clients away far
// too long. The interceptors panic when d is not positive.
func WithRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryAfter = d })
}

// DefaultStorePolicy is the default store policy. It stores a response
// (codes.OK) and the error codes that describe the outcome of the request
// itself, which a retry of the same request would meet again:
// InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
// FailedPrecondition and OutOfRange. It does not store the codes that say
// "try again" or describe the server or the call rather than the request:
// Canceled, Unknown, DeadlineExceeded, ResourceExhausted, Aborted,
// Unimplemented, Internal, Unavailable, DataLoss, nor Unauthenticated, which
// is about the caller's credentials: a caller who refreshes a token and
// retries must not get the old refusal back. It mirrors idemhttp's
// DefaultStorePolicy, which stores every status but 429 and 5xx.
func DefaultStorePolicy(code codes.Code) bool {
	return protorpc.DefaultStorePolicy(protorpc.Code(code))
}

// validate checks the options and fills in the defaults that depend on them.
// It reports every refused value at once, each as a *coordinator.OptionError.
func (c *config) validate() error {
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, &coordinator.OptionError{Option: option, Err: fmt.Errorf(format, args...)})
	}
	if err := validHeader(c.header); err != nil {
		bad("WithKeyHeader", "must be a metadata key of [0-9a-z_.-], not starting with \"grpc-\" nor ending in \"-bin\", got %q: %v", c.header, err)
	}
	if c.methods != nil {
		if len(c.methods) == 0 {
			bad("WithMethods", "must name at least one method, got none")
		}
		c.methodSet = make(map[string]bool, len(c.methods))
		for _, m := range c.methods {
			if !protorpc.ValidProcedure(m) {
				bad("WithMethods", "must name full methods (/service/method), got %q", m)
			}
			c.methodSet[m] = true
		}
	}
	if c.ttl < 0 {
		bad("WithTTL", "must not be negative (0s means the coordinator's default), got %v", c.ttl)
	}
	if c.retryAfter <= 0 {
		bad("WithRetryAfter", "must be positive, got %v", c.retryAfter)
	}
	if len(errs) > 0 {
		return fmt.Errorf("idemgrpc: invalid options: %w", errors.Join(errs...))
	}
	if c.storePolicy == nil {
		c.storePolicy = DefaultStorePolicy
	}
	if c.operation == nil {
		c.operation = idemhttp.OperationName
	}
	return nil
}

// validHeader checks a metadata key for the idempotency key.
func validHeader(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty")
	case strings.HasPrefix(name, "grpc-"):
		return fmt.Errorf(`the "grpc-" prefix is reserved`)
	case strings.HasSuffix(name, "-bin"):
		return fmt.Errorf(`a "-bin" key is binary metadata`)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("byte %q is not allowed in a metadata key", c)
		}
	}
	return nil
}

// protects reports whether the interceptors handle calls of fullMethod.
func (c *config) protects(fullMethod string) bool {
	return c.methodSet == nil || c.methodSet[fullMethod]
}
