package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idemkit/idempotency/coordinator"
)

// DefaultInProgressWait is how long in total a Transport waits out 409
// in-progress responses for one request unless WithInProgressWait says
// otherwise: 30s, the coordinator's default lease, after which the key of a
// first attempt whose holder crashed is free again.
const DefaultInProgressWait = 30 * time.Second

// A ClientOption configures a Transport; pass options to NewTransport. A nil
// ClientOption is skipped. NewTransport returns an error for an invalid
// option value, naming the option, the value and what is accepted (each a
// *coordinator.OptionError).
type ClientOption interface{ applyClient(*clientConfig) }

type clientOptionFunc func(*clientConfig)

func (f clientOptionFunc) applyClient(c *clientConfig) { f(c) }

type clientConfig struct {
	methods   []string
	wait      time.Duration
	methodSet map[string]bool
}

// WithClientMethods sets the request methods a Transport gives a key to;
// requests with other methods pass through untouched: no key is added, and
// a 409 is returned as it came. Methods are compared exactly. Default POST
// and PATCH, the methods Middleware protects by default. NewTransport
// returns an error when the list is empty or a name is not a token
// (RFC 9110).
func WithClientMethods(methods ...string) ClientOption {
	ms := slices.Clone(methods)
	return clientOptionFunc(func(c *clientConfig) { c.methods = ms })
}

// WithInProgressWait sets how long in total a Transport waits out 409
// responses that carry a Retry-After (the server's "a request with this key
// is still in progress") for one request before it returns the 409 to its
// caller. Each wait is the response's Retry-After; a 409 whose Retry-After
// would end past the bound is returned at once. Default
// DefaultInProgressWait (30s); 0 returns every 409 at once. NewTransport
// returns an error when d is negative.
func WithInProgressWait(d time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.wait = d })
}

// newClientConfig applies opts to the defaults and validates the result. It
// reports every refused value at once, each as a *coordinator.OptionError.
func newClientConfig(opts []ClientOption) (clientConfig, error) {
	c := clientConfig{
		methods: []string{http.MethodPost, http.MethodPatch},
		wait:    DefaultInProgressWait,
	}
	for _, o := range opts {
		if o != nil {
			o.applyClient(&c)
		}
	}
	var errs []error
	bad := func(option, format string, args ...any) {
		errs = append(errs, &coordinator.OptionError{Option: option, Err: fmt.Errorf(format, args...)})
	}
	if len(c.methods) == 0 {
		bad("WithClientMethods", "must name at least one method, got none")
	}
	c.methodSet = make(map[string]bool, len(c.methods))
	for _, m := range c.methods {
		if !isToken(m) {
			bad("WithClientMethods", "must name methods, which are tokens (RFC 9110), got %q", m)
		}
		c.methodSet[m] = true
	}
	if c.wait < 0 {
		bad("WithInProgressWait", "must not be negative (0s returns every 409 at once), got %v", c.wait)
	}
	if len(errs) > 0 {
		return clientConfig{}, fmt.Errorf("idemhttp: invalid transport options: %w", errors.Join(errs...))
	}
	return c, nil
}
