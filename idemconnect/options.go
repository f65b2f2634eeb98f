package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemhttp"
	"github.com/idemkit/idempotency/internal/protorpc"
)

// The headers the interceptors speak, in canonical form. Connect, gRPC and
// gRPC-Web carry them as HTTP headers, so a gRPC client's
// "idempotency-key" metadata entry is the same header.
const (
	// DefaultKeyHeader is the request header that carries the idempotency
	// key unless WithKeyHeader names another.
	DefaultKeyHeader = "Idempotency-Key"
	// ReplayedHeader is the response header set to "true" on every replayed
	// response, a stored error included.
	ReplayedHeader = "Idempotent-Replayed"
)

// DefaultRetryAfter is the longest retry delay that the RetryInfo of an
// Aborted (in progress) or Unavailable (store down) refusal advises; see
// WithRetryAfter.
const DefaultRetryAfter = protorpc.DefaultRetryAfter

// CodeOK is the code that a store policy (WithStorePolicy) is asked about
// for a response. Connect names no code 0; gRPC calls it OK.
const CodeOK connect.Code = 0

// An Option configures the interceptors; pass options to NewInterceptor or
// NewClientInterceptor. A nil Option is skipped. Both constructors check
// every option and return an error that names each refused one, its value
// and what is accepted (each a *coordinator.OptionError). The client
// interceptor reads WithKeyHeader and WithProcedures and ignores the others.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	header       string
	procedures   []string
	required     bool
	operation    func(procedure string) string
	scope        func(context.Context, connect.AnyRequest) (string, error)
	storePolicy  func(connect.Code) bool
	ttl          time.Duration
	retryAfter   time.Duration
	procedureSet map[string]bool // nil: every procedure
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

// WithKeyHeader sets the request header that carries the idempotency key, on
// the server (where it is read) and on the client (where it is attached).
// It is put in canonical form ("x-request-key" becomes "X-Request-Key").
// Default DefaultKeyHeader ("Idempotency-Key"). The constructors refuse a
// name that is empty, is not an HTTP header name, starts with "Connect-"
// or "Grpc-" (reserved by the protocols) or ends in "-Bin" (binary
// metadata).
func WithKeyHeader(name string) Option {
	return optionFunc(func(c *config) { c.header = http.CanonicalHeaderKey(name) })
}

// WithProcedures limits the interceptors to the named procedures, given as
// full names ("/payments.v1.Payments/Charge", the generated
// PaymentsChargeProcedure constants). Calls of other procedures pass
// through untouched: the server neither reads nor requires a key for them,
// and the client attaches none. Default: every unary procedure. A
// streaming procedure named here is refused (see NewInterceptor). The
// constructors refuse an empty list and a name that is not of the form
// "/service/method".
func WithProcedures(procedures ...string) Option {
	ps := append([]string{}, procedures...) // not nil: WithProcedures() is refused
	return optionFunc(func(c *config) { c.procedures = ps })
}

// WithKeyRequired sets whether the server interceptor refuses a unary call
// without a key with InvalidArgument (ErrorInfo reason ReasonKeyMissing)
// instead of passing it through unprotected. Default false. Combine it
// with WithProcedures, so that reads do not need a key.
func WithKeyRequired(required bool) Option {
	return optionFunc(func(c *config) { c.required = required })
}

// WithOperation sets the function that names the operation of a call from
// its procedure. Its result must satisfy coordinator.ValidateOperation; a
// call for which it does not fails with Internal, and the handler does not
// run. Default (and when f is nil) idemhttp.OperationName, which maps a
// procedure as idemgrpc maps a gRPC method: "/payments.v1.Payments/Charge"
// becomes "payments.v1.Payments.Charge".
func WithOperation(f func(procedure string) string) Option {
	return optionFunc(func(c *config) { c.operation = f })
}

// WithKeyScope sets the hook that tells whose call it is (the tenant, the
// account, the user), from the call's context, typically from what
// authentication middleware (connectrpc.com/authn) or an interceptor put
// there, or from the request. The stored key is derived from the scope and
// the client's key, so a caller who sends another caller's key gets their
// own fresh response, never the other's. When the hook returns an error the
// call is refused with Unauthenticated (ErrorInfo reason
// ReasonCallerUnknown) and the handler does not run.
//
// Scopes are compared as strings: every caller whose hook returns the same
// scope shares one key space, the empty scope "" included. Return typed
// scopes ("tenant:42", "user:42") when IDs of different kinds can be equal.
//
// Without a scope hook (the default) every caller shares one key space per
// operation: anyone who learns or guesses another client's key receives that
// client's stored response. Set it on every service with more than one
// client.
func WithKeyScope(scope func(ctx context.Context, req connect.AnyRequest) (string, error)) Option {
	return optionFunc(func(c *config) { c.scope = scope })
}

// WithStorePolicy sets which outcomes of the handler are stored and
// replayed, by code: CodeOK for a response, the error's code for an error
// the handler returned (connect.CodeOf: an error that is not a
// *connect.Error counts as connect.CodeUnknown, a context error as
// connect.CodeCanceled or connect.CodeDeadlineExceeded). An outcome the
// policy refuses still goes to its caller, but the key is released, so a
// retry runs the handler again. Default DefaultStorePolicy; nil also means
// DefaultStorePolicy.
func WithStorePolicy(store func(code connect.Code) bool) Option {
	return optionFunc(func(c *config) { c.storePolicy = store })
}

// WithTTL sets how long stored outcomes are kept (coordinator.Call.TTL),
// unless the operator set a TTL for the operation (coordinator
// WithOperationTTLs, IDEMPOTENCY_OPERATION_TTLS), which wins. Default 0: the
// coordinator's default TTL. A TTL outside the coordinator's bounds fails
// every protected call with Internal. The constructors refuse a negative d.
func WithTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ttl = d })
}

// WithRetryAfter sets the longest retry delay advised by the
// google.rpc.RetryInfo detail (and, to gRPC clients, the
// grpc-retry-pushback-ms trailer) of an Aborted refusal (the first call with
// the key still runs) and of an Unavailable one (the store is down). An
// in-progress refusal advises the holder's remaining lease when that is
// shorter. Default DefaultRetryAfter (1s). The constructors refuse a d that
// is not positive.
func WithRetryAfter(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryAfter = d })
}

// DefaultStorePolicy is the default store policy, idemgrpc's for Connect's
// codes, which have gRPC's numbers. It stores a response (CodeOK) and the
// error codes that describe the outcome of the request itself, which a
// retry of the same request would meet again: InvalidArgument, NotFound,
// AlreadyExists, PermissionDenied, FailedPrecondition and OutOfRange. It
// does not store the codes that say "try again" or describe the server or
// the call rather than the request: Canceled, Unknown, DeadlineExceeded,
// ResourceExhausted, Aborted, Unimplemented, Internal, Unavailable,
// DataLoss, nor Unauthenticated, which is about the caller's credentials: a
// caller who refreshes a token and retries must not get the old refusal
// back.
func DefaultStorePolicy(code connect.Code) bool {
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
		bad("WithKeyHeader", "must be an HTTP header name, not starting with \"Connect-\" or \"Grpc-\" nor ending in \"-Bin\", got %q: %v", c.header, err)
	}
	if c.procedures != nil {
		if len(c.procedures) == 0 {
			bad("WithProcedures", "must name at least one procedure, got none")
		}
		c.procedureSet = make(map[string]bool, len(c.procedures))
		for _, p := range c.procedures {
			if !protorpc.ValidProcedure(p) {
				bad("WithProcedures", "must name full procedures (/service/method), got %q", p)
			}
			c.procedureSet[p] = true
		}
	}
	if c.ttl < 0 {
		bad("WithTTL", "must not be negative (0s means the coordinator's default), got %v", c.ttl)
	}
	if c.retryAfter <= 0 {
		bad("WithRetryAfter", "must be positive, got %v", c.retryAfter)
	}
	if len(errs) > 0 {
		return fmt.Errorf("idemconnect: invalid options: %w", errors.Join(errs...))
	}
	if c.storePolicy == nil {
		c.storePolicy = DefaultStorePolicy
	}
	if c.operation == nil {
		c.operation = idemhttp.OperationName
	}
	return nil
}

// validHeader checks a header name (in canonical form) for the key.
func validHeader(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case strings.HasPrefix(name, "Connect-"), strings.HasPrefix(name, "Grpc-"):
		return errors.New("the prefix is reserved by the protocols")
	case strings.HasSuffix(name, "-Bin"):
		return errors.New(`a "-Bin" header is binary metadata`)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isTokenChar(c) {
			return fmt.Errorf("byte %q is not allowed in a header name", c)
		}
	}
	return nil
}

// isTokenChar reports whether c may appear in an HTTP header name (a token,
// RFC 9110).
func isTokenChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// protects reports whether the interceptors handle calls of procedure.
func (c *config) protects(procedure string) bool {
	return c.procedureSet == nil || c.procedureSet[procedure]
}

// listed reports whether procedure was named by WithProcedures.
func (c *config) listed(procedure string) bool {
	return c.procedureSet[procedure]
}
